"""A credential bundle as a Kubernetes Secret, for deploy/k8s/ (docs/deploy.md).

A Secret's keys cannot hold ``/`` and a bundle has a ``clients/`` directory, so each
file's path is flattened into its key (``clients/agent.crt`` → ``clients__agent.crt``).
The pods do not read the Secret's volume itself: Kubernetes mounts it as symbolic links
into a ``..data`` directory, which the secrets loader refuses (a link could point a
role at another role's files). An init container copies the files back into their
paths, in an in-memory volume, owner-only (:data:`UNPACK`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from spanflow.errors import SecurityError

SEPARATOR = "__"
"""What stands for ``/`` in a Secret's key."""

_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

UNPACK = (
    'set -eu; for f in /bundle/*; do n=`basename "$f" | sed s,__,/,g`; '
    'd=`dirname "/secrets/$n"`; mkdir -p "$d"; cp -L "$f" "/secrets/$n"; done; '
    "chmod -R go= /secrets"
)
"""The init container's command (deploy/k8s/): the Secret at /bundle, the files back
in their paths under /secrets (no ``$(...)``: Kubernetes expands that in commands)."""


def secret_key(relative: str) -> str:
    """The Secret's key for a file at ``relative`` (a path inside the bundle)."""
    key = relative.replace("/", SEPARATOR)
    if SEPARATOR in relative or not _KEY.match(key):
        raise SecurityError(f"{relative!r} cannot be a Kubernetes Secret key")
    return key


def secret_manifest(bundle: Path, name: str, namespace: str) -> str:
    """A ``v1/Secret`` named ``name`` holding every file of ``bundle`` (text, as
    ``stringData``), labelled as spanflow's."""
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    data = {secret_key(p.relative_to(bundle).as_posix()): p.read_text() for p in files}
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "spanflow"},
        },
        "type": "Opaque",
        "stringData": data,
    }
    return yaml.dump(manifest, Dumper=_Dumper, sort_keys=False)


class _Dumper(yaml.SafeDumper):
    """Multi-line values (certificates, keys) as YAML literal blocks, as people write them."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner only from the start."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
