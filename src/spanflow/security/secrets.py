"""The secrets directory: what ``spanflow secrets init`` writes and every door reads.

Layout (all under ``<state>/secrets``; directories 0700, files 0600)::

    ca.crt, ca.key               the deployment's CA (ca.key only on the host that issues)
    server.crt, server.key       every spanflow server: NATS (client, leaf, route, MQTT)
    clients/<role>.crt, .key     a client certificate per role
    credentials.json             NATS passwords per role and per device, the REST token
    gossip.keyring               gossip keys, base64, primary first

Copy the directory to each host (or only what a host's roles need, docs/security.md).
A process learns where it is and which role it plays from ``SPANFLOW_SECRETS`` and
``SPANFLOW_ROLE`` (the commands set both), so Spark's Python workers, which inherit the
environment, connect with the same identity as their agent.
"""

from __future__ import annotations

import os
import secrets as _random
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spanflow.errors import SecurityError
from spanflow.security import pki, revocations
from spanflow.security.credentials import (
    CERT_ORGANIZATION as CERT_ORGANIZATION,
)
from spanflow.security.credentials import (
    COORDINATOR_INBOX as COORDINATOR_INBOX,
)
from spanflow.security.credentials import (
    DEVICE_INBOXES as DEVICE_INBOXES,
)
from spanflow.security.credentials import (
    NODE_TOKEN_PREFIX as NODE_TOKEN_PREFIX,
)
from spanflow.security.credentials import (
    READER_INBOX as READER_INBOX,
)
from spanflow.security.credentials import (
    SITE_INBOX as SITE_INBOX,
)
from spanflow.security.credentials import (
    Credentials as Credentials,
)
from spanflow.security.credentials import (
    Device as Device,
)
from spanflow.security.credentials import (
    cert_user as cert_user,
)
from spanflow.security.credentials import (
    inbox_prefix as inbox_prefix,
)
from spanflow.security.credentials import (
    ingest_token as ingest_token,
)
from spanflow.security.credentials import (
    leaf_user_of as leaf_user_of,
)
from spanflow.security.credentials import (
    node_of_token as node_of_token,
)
from spanflow.security.credentials import (
    node_password as node_password,
)
from spanflow.security.credentials import (
    node_token as node_token,
)
from spanflow.security.credentials import (
    node_user as node_user,
)
from spanflow.security.credentials import (
    site_devices as site_devices,
)
from spanflow.security.credentials import (
    site_leaf_password as site_leaf_password,
)
from spanflow.security.credentials import (
    site_route_password as site_route_password,
)
from spanflow.security.keyring import Keyring, new_key
from spanflow.security.revocations import REVOCATIONS_FILE, Revocations, credential_id
from spanflow.security.signing import Signer, Verifier, new_key_pair

ROLES = ("coordinator", "control", "agent", "reader", "device", "leaf", "route")
"""Who connects to NATS: coordinators (data plane), coordinators' control plane (the
control account: log, snapshots, lease), node agents (and their Spark workers),
read-only tools and dashboards, devices, leaf links between sites, cluster routes."""
CONTROL_ROLE = "control"
"""The user of the control account (spanflow.security.nats_config): coordinators only."""
LINK_ROLES = ("leaf", "route")
"""Users that authenticate server-to-server links, never a client connection."""
SECRETS_ENV = "SPANFLOW_SECRETS"
ROLE_ENV = "SPANFLOW_ROLE"
DEFAULT_HOSTS = ("localhost", "127.0.0.1")


def check_name(name: str, what: str) -> None:
    """A device's or node's name is one NATS subject token (it names subjects and users)."""
    if not name or any(c in name for c in " .*>\t\n\r"):
        raise SecurityError(f"a {what} name is one token without spaces or dots: {name!r}")


def _password() -> str:
    return _random.token_urlsafe(24)


def write_private(path: Path, data: bytes | str) -> None:
    """Create ``path`` owner-only from the first byte (never world-readable, not even
    between the write and a chmod)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    raw = data.encode() if isinstance(data, str) else data
    try:  # never through a symbolic link planted where a secret goes
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise SecurityError(f"cannot write {path}: {exc.strerror or exc}") from exc
    os.fchmod(fd, 0o600)  # an existing file keeps its mode on open: close it first
    try:
        os.write(fd, raw)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)


BUNDLE_ROLES = ("coordinator", "agent", "site", "device", "reader")
"""What ``spanflow secrets export --role`` makes a bundle for."""


class Secrets:
    """Paths and contents of one secrets directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # ------------------------------------------------------------------ paths
    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.root / "server.key"

    def client_cert(self, role: str) -> Path:
        return self.root / "clients" / f"{role}.crt"

    def client_key(self, role: str) -> Path:
        return self.root / "clients" / f"{role}.key"

    def device_cert(self, name: str) -> Path:
        """A device's own certificate: it logs in as that device and nobody else."""
        return self.root / "clients" / "devices" / f"{name}.crt"

    def device_key(self, name: str) -> Path:
        return self.root / "clients" / "devices" / f"{name}.key"

    @property
    def credentials_file(self) -> Path:
        return self.root / "credentials.json"

    @property
    def keyring_file(self) -> Path:
        return self.root / "gossip.keyring"

    @property
    def control_key(self) -> Path:
        """Signs assignments (spanflow.security.signing): coordinators only."""
        return self.root / "control.key"

    @property
    def control_pub(self) -> Path:
        """Checks assignments' signatures: every agent."""
        return self.root / "control.pub"

    def signer(self) -> Signer | None:
        """The coordinators' signer, or None where this host has no key."""
        return Signer(self.control_key.read_bytes()) if self.control_key.exists() else None

    def verifier(self) -> Verifier | None:
        return Verifier(self.control_pub.read_bytes()) if self.control_pub.exists() else None

    @property
    def revocations_file(self) -> Path:
        """The signed device revocation list (spanflow.security.revocations)."""
        return self.root / REVOCATIONS_FILE

    def revocations(self) -> Revocations:
        """The revocation list this directory holds (empty if none)."""
        try:
            value = self.revocations_file.read_bytes()
        except FileNotFoundError:
            return Revocations()
        return revocations.read_file(value, self.verifier())

    def store_revocations(self, value: bytes) -> bool:
        """Keep a signed list pushed by the operator if it is the coordinators' and newer
        than the one held; whether it was kept. Unsigned when it is not theirs."""
        verifier = self.verifier()
        if verifier is None:
            raise SecurityError(f"{self.root} has no control.pub to check revocations with")
        incoming = revocations.open_signed(value, verifier)
        if not incoming.supersedes(self.revocations()):
            return False
        write_private(self.revocations_file, value)
        return True

    def exists(self) -> bool:
        return self.credentials_file.exists() and self.ca_cert.exists()

    # ---------------------------------------------------------------- reading
    def credentials(self) -> Credentials:
        try:
            text = self.credentials_file.read_text()
        except OSError as exc:
            raise SecurityError(
                f"credentials {self.credentials_file}: {exc.strerror or exc} "
                "(run `spanflow secrets init`)"
            ) from exc
        creds = Credentials.from_json(text, str(self.credentials_file))
        return self._without_revoked(creds)

    def _without_revoked(self, creds: Credentials) -> Credentials:
        """``creds`` less the devices and nodes whose credential the revocation list
        names (a site or coordinator bundle made before the revocation still carries
        their logins)."""
        if not (creds.devices or creds.nodes) or not self.revocations_file.exists():
            return creds
        listed = self.revocations()
        kept = {n: d for n, d in creds.devices.items() if not listed.revokes(n, d.password)}
        passwords = {n: creds.node_password_for(n) for n in creds.nodes}
        gone = {n for n, pw in passwords.items() if pw and listed.revokes(node_user(n), pw)}
        if len(kept) == len(creds.devices) and not gone:
            return creds
        return replace(
            creds,
            devices=kept,
            nodes={n: at for n, at in creds.nodes.items() if n not in gone},
            node_passwords={n: pw for n, pw in creds.node_passwords.items() if n not in gone},
        )

    def node_revoked(self, node: str) -> bool:
        """Whether the revocation list names this node's credential (a full or
        coordinator directory: the key its password derives from is here)."""
        creds = Credentials.from_json(self.credentials_file.read_text(), "credentials")
        if not creds.agent_key or not self.revocations_file.exists():
            return False
        return self.revocations().revokes(node_user(node), node_password(creds.agent_key, node))

    def keyring(self) -> Keyring:
        return Keyring.load(self.keyring_file)

    def identity(self, role: str) -> NatsIdentity:
        if role not in ROLES:
            raise SecurityError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
        creds = self.credentials()
        password = creds.passwords.get(role)
        if password is None:
            raise SecurityError(
                f"{self.credentials_file} has no password for role {role!r} (a bundle for "
                "another role, or made by an older version: run `spanflow secrets init`)"
            )
        user, inbox = role, inbox_prefix(role, role)
        if role == "agent" and creds.node:  # a node's bundle: that node's own user
            user, inbox = node_user(creds.node), inbox_prefix(creds.node, "node")
        return NatsIdentity(
            user=user,
            password=password,
            ca_file=self.ca_cert,
            cert_file=self.client_cert(role),
            key_file=self.client_key(role),
            inbox_prefix=inbox,
        )

    def site_identity(self) -> NatsIdentity:
        """A site server's own client on its own NATS server (a site bundle: the leaf
        certificate and the site's leaf password), which may only read the hub's
        revocation list (spanflow.security.nats_config.site_watch_user)."""
        password = self.credentials().site_leaf
        if password is None:
            raise SecurityError(f"{self.root} is not a site bundle: it has no site login")
        return NatsIdentity(
            user="site",
            password=password,
            ca_file=self.ca_cert,
            cert_file=self.client_cert("leaf"),
            key_file=self.client_key("leaf"),
            inbox_prefix=SITE_INBOX,
        )

    def device_identity(self, name: str) -> NatsIdentity:
        device = self.credentials().devices.get(name)
        if device is None:
            raise SecurityError(f"no device {name!r}: add it with `spanflow secrets device`")
        return NatsIdentity(
            user=name,
            password=device.password,
            ca_file=self.ca_cert,
            cert_file=self.device_cert(name),
            key_file=self.device_key(name),
            inbox_prefix=inbox_prefix(name, "device"),
        )

    # ---------------------------------------------------------------- writing
    def init(self, hosts: tuple[str, ...] = (), *, renew: bool = False) -> list[Path]:
        """Create what is missing (everything, the first time). ``renew`` reissues the
        server and client certificates (new hosts, near expiry) under the same CA and
        keeps passwords and keys. Returns the files written."""
        written: list[Path] = []
        self._refuse_links()
        if self.credentials_file.exists() and self.credentials().rest_token is None:
            raise SecurityError(
                f"{self.root} is a host's bundle: run `spanflow secrets init` on the host "
                "that issues, then `spanflow secrets export` for this one"
            )
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        (self.root / "clients").mkdir(exist_ok=True, mode=0o700)
        os.chmod(self.root / "clients", 0o700)  # an existing one may have been left open
        if not self.ca_cert.exists():
            ca = pki.create_ca()
            write_private(self.ca_key, ca.key_pem)
            write_private(self.ca_cert, ca.cert_pem)
            written += [self.ca_cert, self.ca_key]
            renew = True
        if renew or not self.server_cert.exists():
            ca = self.ca()
            names = tuple(dict.fromkeys((*DEFAULT_HOSTS, *hosts)))
            server = pki.issue(ca, "spanflow server", hosts=names, server=True, client=True)
            write_private(self.server_key, server.key_pem)
            write_private(self.server_cert, server.cert_pem)
            written.append(self.server_cert)
        for role in ROLES:
            if renew or not self.client_cert(role).exists():
                cert = pki.issue(self.ca(), role, client=True)
                write_private(self.client_key(role), cert.key_pem)
                write_private(self.client_cert(role), cert.cert_pem)
                written.append(self.client_cert(role))
        if not self.credentials_file.exists():
            creds = Credentials(
                {role: _password() for role in ROLES}, _password(), agent_key=_password()
            )
            write_private(self.credentials_file, creds.to_json())
            written.append(self.credentials_file)
        elif self._top_up():
            written.append(self.credentials_file)
        written += self._issue_device_certs(renew=renew)
        if not self.keyring_file.exists():
            write_private(self.keyring_file, Keyring((new_key(),)).dumps())
            written.append(self.keyring_file)
        if not self.control_key.exists():
            private, public = new_key_pair()
            write_private(self.control_key, private)
            write_private(self.control_pub, public)
            written += [self.control_key, self.control_pub]
        return written

    def _issue_device_certs(self, *, renew: bool = False) -> list[Path]:
        """A certificate per device (a directory made by an older version shared one)."""
        written = []
        for name in sorted(self.credentials().devices):
            if renew or not self.device_cert(name).exists():
                self._issue_device_cert(name)
                written.append(self.device_cert(name))
        return written

    def _issue_device_cert(self, name: str) -> None:
        cert = pki.issue(self.ca(), name, client=True)
        write_private(self.device_key(name), cert.key_pem)
        write_private(self.device_cert(name), cert.cert_pem)

    def _refuse_links(self) -> None:
        """Secrets are written only into real directories and files: a symbolic link
        planted in the directory would send a private key wherever it points."""
        for path in (self.root, self.root / "clients"):
            if path.is_symlink():
                raise SecurityError(f"{path} is a symbolic link: refusing to write secrets there")
        if self.root.is_dir():
            for path in self.root.rglob("*"):
                if path.is_symlink():
                    raise SecurityError(
                        f"{path} is a symbolic link: refusing to write secrets beside it"
                    )

    def _top_up(self) -> bool:
        """A directory made by an older version lacks a newer role's password (the
        control account's, say) or the node-token key: add them, keep every other
        secret as it is. A host's bundle (no REST token) is left alone."""
        creds = self.credentials()
        if creds.rest_token is None:
            return False
        missing = [role for role in ROLES if role not in creds.passwords]
        if not missing and creds.agent_key:
            return False
        passwords = {**creds.passwords, **{role: _password() for role in missing}}
        updated = replace(creds, passwords=passwords, agent_key=creds.agent_key or _password())
        write_private(self.credentials_file, updated.to_json())
        return True

    def export(
        self,
        dest: str | Path,
        role: str,
        *,
        node: str | None = None,
        site: str | None = None,
        device: str | None = None,
        hosts: tuple[str, ...] = (),
    ) -> list[Path]:
        """Write the bundle one host needs for ``role`` into ``dest`` and return its
        files (spanflow.security.bundles.export says what each role's holds)."""
        from spanflow.security import bundles

        named = {"node": node, "site": site, "device": device}
        return bundles.export(self, Path(dest), role, named, hosts)

    def add_device(
        self,
        name: str,
        publish: tuple[str, ...],
        subscribe: tuple[str, ...] = (),
        site: str | None = None,
    ) -> str:
        """Add (or re-key) a device user allowed to publish on ``publish`` only (and to
        subscribe to ``subscribe``: commands for it) with a certificate of its own,
        admitted by ``site``'s server (None: every site's); returns its password (shown
        once to the operator, never logged)."""
        check_name(name, "device")
        if name in ROLES:
            raise SecurityError(f"{name!r} is a role, not a device name")
        if not publish:
            raise SecurityError("a device needs at least one subject it may publish on")
        creds = self.credentials()
        password = _password()
        devices = {**creds.devices, name: Device(password, publish, subscribe, site)}
        self._issue_device_cert(name)  # first: without the CA key nothing changes
        updated = replace(creds, devices=devices)
        write_private(self.credentials_file, updated.to_json())
        return password

    def record_node(self, name: str, site: str | None) -> None:
        """Give a node an identity of its own (its NATS user ``agent.<name>``, admitted by
        ``site``'s server, None: every site's): servers whose configuration is written
        from these secrets from now on admit it, and deny every other node its inbox."""
        check_name(name, "node")
        if self.node_revoked(name):
            raise SecurityError(
                f"node {name} was revoked (its login is on the revocation list): give the "
                "node that replaces it another name"
            )
        creds = self.credentials()
        if creds.nodes.get(name, "") == site:
            return
        updated = replace(creds, nodes={**creds.nodes, name: site})
        write_private(self.credentials_file, updated.to_json())

    def revoke_node(self, name: str) -> None:
        """Take a node's own identity away: its NATS user is no longer written into
        servers' configuration (they close its connections on reload), site servers
        whose bundle still carries its login drop it once the signed revocation list
        reaches them, and coordinators refuse its REST token from the next request."""
        creds = self.credentials()
        if name not in creds.nodes or not creds.agent_key:
            raise SecurityError(f"no node {name!r} with a login of its own to revoke")
        password = node_password(creds.agent_key, name)
        self._add_revocation(credential_id(node_user(name), password))
        nodes = {k: v for k, v in creds.nodes.items() if k != name}
        write_private(self.credentials_file, replace(creds, nodes=nodes).to_json())

    def _add_revocation(self, credential: str) -> None:
        signer = self.signer()
        if signer is None:
            raise SecurityError(f"{self.root} has no control.key to sign the revocation with")
        listed = self.revocations().adding(credential)
        write_private(self.revocations_file, revocations.sign(listed, signer))

    def revoke_device(self, name: str) -> None:
        """Remove a device's user (servers that reload close its connections) and add its
        credential to the signed revocation list, which reaches sites whose bundle still
        names it once pushed (`spanflow secrets revocations --push`)."""
        creds = self.credentials()
        if name not in creds.devices:
            raise SecurityError(f"no device {name!r} to revoke")
        self._add_revocation(credential_id(name, creds.devices[name].password))
        devices = {k: v for k, v in creds.devices.items() if k != name}
        write_private(self.credentials_file, replace(creds, devices=devices).to_json())
        self.device_cert(name).unlink(missing_ok=True)  # mapped to no user from now on
        self.device_key(name).unlink(missing_ok=True)

    def write_keyring(self, ring: Keyring) -> None:
        write_private(self.keyring_file, ring.dumps())

    def ca(self) -> pki.Issued:
        """The deployment's CA, to issue with (only where its key is: the issuing host)."""
        try:
            return pki.Issued(self.ca_cert.read_bytes(), self.ca_key.read_bytes())
        except OSError as exc:
            raise SecurityError(
                f"issuing certificates needs the CA key {self.ca_key}: {exc.strerror or exc}"
            ) from exc


@dataclass(frozen=True)
class NatsIdentity:
    """Who a NATS client is: a user and password, over TLS with a client certificate.

    Locked servers take the user from the certificate (:func:`cert_user`) and check the
    password against it: both must match. ``user`` names the identity in messages."""

    user: str
    password: str = field(repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    inbox_prefix: str | None = None
    """Where replies to this client come back (:func:`inbox_prefix`); None: ``_INBOX``."""

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.ca_file is None:
            return None
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca_file))
            if self.cert_file is not None and self.key_file is not None:
                ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise SecurityError(f"NATS client TLS files for {self.user!r}: {exc}") from exc
        return ctx

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        # With a certificate the server reads the user from it; an empty name in
        # CONNECT keeps its log free of a warning per connection.
        user = "" if self.cert_file is not None else self.user
        options: dict[str, Any] = {"user": user, "password": self.password}
        if self.inbox_prefix:
            options["inbox_prefix"] = self.inbox_prefix
        ctx = self.ssl_context()
        if ctx is not None:
            options["tls"] = ctx
        return options
