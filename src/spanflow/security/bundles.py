"""Bundles: what one host needs for its role, written from the full secrets directory
(``spanflow secrets export``).

An edge host holds no coordinator, control, reader, route or operator secret, no CA
key and no node-token key. With ``hosts`` (roles ``site`` and ``coordinator``) the
bundle gets a server certificate of its own that names only those hosts (and
localhost): a site's key then cannot pass for another server. Without, it shares the
deployment's.

- ``coordinator``: everything but the CA key;
- ``agent`` (``node``, optionally ``site``): the node's own NATS password and
  certificate (user ``agent.<node>``; the node is recorded in the full directory, so
  servers configured from it afterwards admit it), its node's REST token, the gossip
  keyring, the coordinators' public key;
- ``site`` (``site``): a site server's certificate, the leaf link's, the passwords of
  the users it admits (its nodes, the shared agent role, its devices), its ingest token,
  the password of routes
  between that site's servers (a clustered site), the coordinators' public key (it
  checks revocation lists);
- ``device`` (``device``): that device's password and the device certificate;
- ``reader``: the reader's password and certificate.
"""

from __future__ import annotations

import os
from pathlib import Path

from spanflow.errors import SecurityError
from spanflow.security import pki
from spanflow.security.credentials import (
    Credentials,
    Device,
    ingest_token,
    node_password,
    node_token,
    node_user,
    site_devices,
    site_leaf_password,
    site_nodes,
    site_route_password,
)
from spanflow.security.secrets import (
    BUNDLE_ROLES,
    DEFAULT_HOSTS,
    ROLES,
    Secrets,
    write_private,
)

FLAGS = {"agent": "--node", "site": "--site", "device": "--device"}
"""The option naming what a role's bundle is for."""


def export(
    full: Secrets, dest: Path, role: str, named: dict[str, str | None], hosts: tuple[str, ...]
) -> list[Path]:
    """Write ``role``'s bundle from ``full`` into ``dest`` (a new, owner-only directory)
    and return its files. ``named``: the node, site and device it is for."""
    creds = full.credentials()
    out = Secrets(dest)
    _check(full, out, role, named, hosts)
    node, site, device = (named.get(k) or "" for k in ("node", "site", "device"))
    if role == "agent":
        full.record_node(node, site or None)
        creds = full.credentials()
    files, bundle = _contents(full, creds, role, node, site, device)
    out.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(out.root, 0o700)
    written = []
    if role == "agent":
        written += _node_certificate(full, out, node)
    own = _host_certificate(full, hosts) if hosts else None
    for path in [full.ca_cert, *files]:
        target = out.root / path.relative_to(full.root)
        data = path.read_bytes()
        if own is not None and path in (full.server_cert, full.server_key):
            data = own.cert_pem if path == full.server_cert else own.key_pem
        write_private(target, data)
        written.append(target)
    write_private(out.credentials_file, bundle.to_json())
    written.append(out.credentials_file)
    return written


def _check(
    full: Secrets, out: Secrets, role: str, named: dict[str, str | None], hosts: tuple[str, ...]
) -> None:
    """Refuse an export that cannot be made (SecurityError says why)."""
    if role not in BUNDLE_ROLES:
        raise SecurityError(f"no bundle for role {role!r}: one of {', '.join(BUNDLE_ROLES)}")
    if role in FLAGS and not named.get(FLAGS[role][2:]):
        flag = FLAGS[role]
        raise SecurityError(f"a {role} bundle is for one {flag[2:]}: give {flag}")
    creds = full.credentials()
    if creds.rest_token is None or creds.agent_key is None:
        raise SecurityError(
            f"{full.root} is itself a bundle: export from the full secrets directory"
        )
    if hosts and role not in ("site", "coordinator"):
        raise SecurityError(f"a {role} bundle runs no server: --host is for site or coordinator")
    if out.root.exists() and any(out.root.iterdir()):
        raise SecurityError(f"{out.root} is not empty: export into a new directory")


def _contents(
    full: Secrets, creds: Credentials, role: str, node: str, site: str, device: str
) -> tuple[list[Path], Credentials]:
    """The files (besides the CA certificate) and credentials a role's host needs."""
    assert creds.agent_key is not None
    if role == "coordinator":
        files = [full.server_cert, full.server_key, full.keyring_file]
        files += [full.control_key, full.control_pub]
        files += [p for r in ROLES for p in (full.client_cert(r), full.client_key(r))]
        return files + _device_files(full, creds.devices), creds
    if role == "agent":
        tokens = {node: node_token(creds.agent_key, node)}
        password = node_password(creds.agent_key, node)
        bundle = Credentials({"agent": password}, None, node_tokens=tokens, node=node)
        return [full.keyring_file, full.control_pub], bundle
    if role == "site":
        files = [full.server_cert, full.server_key]
        files += [full.client_cert("leaf"), full.client_key("leaf")]
        files += [full.client_cert("device"), full.client_key("device")]  # HTTP ingest
        devices = site_devices(creds.devices, site)
        files += _device_files(full, devices)  # the MQTT gateway logs in as each
        files.append(full.control_pub)  # checks the revocation lists pushed later
        bundle = Credentials(
            {r: creds.passwords[r] for r in ("agent", "device")},
            None,
            devices,
            ingest_token=ingest_token(creds.agent_key, site),
            site_route=site_route_password(creds.agent_key, site),
            site_leaf=site_leaf_password(creds.agent_key, site),
            nodes=creds.nodes,
            node_passwords={
                n: node_password(creds.agent_key, n) for n in site_nodes(creds.nodes, site)
            },
        )
        return files, bundle
    if role == "device":
        if device not in creds.devices:
            raise SecurityError(f"no device {device!r}: add it with `spanflow secrets device`")
        one = {device: creds.devices[device]}
        return _device_files(full, one), Credentials({}, None, one)
    files = [full.client_cert("reader"), full.client_key("reader")]
    return files, Credentials({"reader": creds.passwords["reader"]}, None)


def _node_certificate(full: Secrets, out: Secrets, node: str) -> list[Path]:
    """The node's own client certificate (its user ``agent.<node>``), as the bundle's
    agent certificate: issued at each export, kept nowhere else (a server maps it to the
    user by its subject alone)."""
    cert = pki.issue(full.ca(), node_user(node), client=True)
    write_private(out.client_key("agent"), cert.key_pem)
    write_private(out.client_cert("agent"), cert.cert_pem)
    return [out.client_cert("agent"), out.client_key("agent")]


def _host_certificate(full: Secrets, hosts: tuple[str, ...]) -> pki.Issued:
    """A server certificate for these hosts alone, from the deployment's CA."""
    names = tuple(dict.fromkeys((*DEFAULT_HOSTS, *hosts)))
    # client use too: a clustered server dials its routes with it
    return pki.issue(
        full.ca(), f"spanflow server {hosts[0]}", hosts=names, server=True, client=True
    )


def _device_files(full: Secrets, devices: dict[str, Device]) -> list[Path]:
    missing = [name for name in devices if not full.device_cert(name).exists()]
    if missing:
        raise SecurityError(
            f"no certificate for device(s) {', '.join(sorted(missing))}: run "
            "`spanflow secrets init` on the issuing host (it issues what is missing)"
        )
    return [p for name in sorted(devices) for p in (full.device_cert(name), full.device_key(name))]
