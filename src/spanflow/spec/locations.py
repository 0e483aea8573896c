"""Where state lives: a local directory or a Hadoop file system URL.

Checkpoints and savepoints are named by *locations*: a local path
(``spanflow-data/cluster``) or a URL Spark's Hadoop layer understands —
``jetstream://<store>/...`` (the site's NATS, see docs/cluster.md), ``hdfs://nn:8020/...``,
``file:///...``, ``s3a://...`` where its jars are present. ``pathlib`` must never touch a
URL: ``Path("hdfs://nn:8020/x")`` is ``hdfs:/nn:8020/x``, another place.
"""

from __future__ import annotations

import re
from pathlib import Path

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
JETSTREAM = "jetstream"


def is_url(location: str | Path) -> bool:
    """Whether a location is a URL (``scheme://...``) rather than a local path."""
    return isinstance(location, str) and bool(_URL.match(location))


def scheme(location: str | Path) -> str | None:
    """A URL's scheme, lower case; None for a local path."""
    if not is_url(location):
        return None
    return str(location).split("://", 1)[0].lower()


def join(base: str | Path, *parts: str) -> str:
    """``base`` with ``parts`` appended as path segments, a URL staying a URL."""
    if is_url(base):
        text = str(base).rstrip("/")
        segments = [p.strip("/") for p in parts if p.strip("/")]
        return "/".join([text, *segments])
    return str(Path(base).joinpath(*parts))


def in_domain(location: str, domain: str | None) -> str:
    """A ``jetstream://`` location pinned to a JetStream domain (``jetstream://<domain>@
    <store>/…``), so that a node of another site reaches the same store over the leaf
    link instead of its own site's. Other locations, or one already pinned, unchanged."""
    if not domain or scheme(location) != JETSTREAM:
        return location
    head, _, rest = location.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        return location
    return f"{head}://{domain}@{authority}{slash}{path}"


def resolve(location: str | Path) -> str:
    """A local path made absolute; a URL unchanged."""
    if is_url(location):
        return str(location)
    return str(Path(location).resolve())
