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
from spanflow.security import pki
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
    node_token as node_token,
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


def _password() -> str:
    return _random.token_urlsafe(24)


def _write_private(path: Path, data: bytes | str) -> None:
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
        return Credentials.from_json(text, str(self.credentials_file))

    def keyring(self) -> Keyring:
        return Keyring.load(self.keyring_file)

    def identity(self, role: str) -> NatsIdentity:
        if role not in ROLES:
            raise SecurityError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
        password = self.credentials().passwords.get(role)
        if password is None:
            raise SecurityError(
                f"{self.credentials_file} has no password for role {role!r} (a bundle for "
                "another role, or made by an older version: run `spanflow secrets init`)"
            )
        return NatsIdentity(
            user=role,
            password=password,
            ca_file=self.ca_cert,
            cert_file=self.client_cert(role),
            key_file=self.client_key(role),
            inbox_prefix=inbox_prefix(role, role),
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
            _write_private(self.ca_key, ca.key_pem)
            _write_private(self.ca_cert, ca.cert_pem)
            written += [self.ca_cert, self.ca_key]
            renew = True
        if renew or not self.server_cert.exists():
            ca = self._ca()
            names = tuple(dict.fromkeys((*DEFAULT_HOSTS, *hosts)))
            server = pki.issue(ca, "spanflow server", hosts=names, server=True, client=True)
            _write_private(self.server_key, server.key_pem)
            _write_private(self.server_cert, server.cert_pem)
            written.append(self.server_cert)
        for role in ROLES:
            if renew or not self.client_cert(role).exists():
                cert = pki.issue(self._ca(), role, client=True)
                _write_private(self.client_key(role), cert.key_pem)
                _write_private(self.client_cert(role), cert.cert_pem)
                written.append(self.client_cert(role))
        if not self.credentials_file.exists():
            creds = Credentials(
                {role: _password() for role in ROLES}, _password(), agent_key=_password()
            )
            _write_private(self.credentials_file, creds.to_json())
            written.append(self.credentials_file)
        elif self._top_up():
            written.append(self.credentials_file)
        written += self._issue_device_certs(renew=renew)
        if not self.keyring_file.exists():
            _write_private(self.keyring_file, Keyring((new_key(),)).dumps())
            written.append(self.keyring_file)
        if not self.control_key.exists():
            private, public = new_key_pair()
            _write_private(self.control_key, private)
            _write_private(self.control_pub, public)
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
        cert = pki.issue(self._ca(), name, client=True)
        _write_private(self.device_key(name), cert.key_pem)
        _write_private(self.device_cert(name), cert.cert_pem)

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
        _write_private(self.credentials_file, updated.to_json())
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
        """Write the bundle one host needs for ``role`` into ``dest`` (a new, owner-only
        directory) and return its files: an edge host holds no coordinator, control,
        reader, route or operator secret, no CA key and no node-token key.

        With ``hosts`` (roles ``site`` and ``coordinator``) the bundle gets a server
        certificate of its own that names only those hosts (and localhost): a site's key
        then cannot pass for another server. Without, it shares the deployment's.

        - ``coordinator``: everything but the CA key;
        - ``agent`` (``node``): the agent's password and certificate, its node's REST
          token, the gossip keyring;
        - ``site`` (``site``): a site server's certificate, the leaf link's, the
          passwords of the users it admits (agents, devices), its ingest token, the
          password of routes between that site's servers (a clustered site);
        - ``device`` (``device``): that device's password and the device certificate;
        - ``reader``: the reader's password and certificate.
        """
        creds = self.credentials()
        out = Secrets(dest)
        self._check_export(out, role, {"agent": node, "site": site, "device": device}, hosts)
        files, bundle = self._bundle(creds, role, node or "", site or "", device or "")
        out.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(out.root, 0o700)
        written = []
        own = self._host_certificate(hosts) if hosts else None
        for path in [self.ca_cert, *files]:
            target = out.root / path.relative_to(self.root)
            data = path.read_bytes()
            if own is not None and path in (self.server_cert, self.server_key):
                data = own.cert_pem if path == self.server_cert else own.key_pem
            _write_private(target, data)
            written.append(target)
        _write_private(out.credentials_file, bundle.to_json())
        written.append(out.credentials_file)
        return written

    def _check_export(
        self, out: Secrets, role: str, named: dict[str, str | None], hosts: tuple[str, ...]
    ) -> None:
        """Refuse an export that cannot be made (SecurityError says why)."""
        if role not in BUNDLE_ROLES:
            raise SecurityError(f"no bundle for role {role!r}: one of {', '.join(BUNDLE_ROLES)}")
        if role in named and not named[role]:
            flag = {"agent": "--node", "site": "--site", "device": "--device"}[role]
            raise SecurityError(f"a {role} bundle is for one {flag[2:]}: give {flag}")
        creds = self.credentials()
        if creds.rest_token is None or creds.agent_key is None:
            raise SecurityError(
                f"{self.root} is itself a bundle: export from the full secrets directory"
            )
        if hosts and role not in ("site", "coordinator"):
            raise SecurityError(
                f"a {role} bundle runs no server: --host is for site or coordinator"
            )
        if out.root.exists() and any(out.root.iterdir()):
            raise SecurityError(f"{out.root} is not empty: export into a new directory")

    def _bundle(
        self, creds: Credentials, role: str, node: str, site: str, device: str
    ) -> tuple[list[Path], Credentials]:
        """The files (besides the CA certificate) and credentials a role's host needs."""
        assert creds.agent_key is not None
        if role == "coordinator":
            files = [self.server_cert, self.server_key, self.keyring_file]
            files += [self.control_key, self.control_pub]
            files += [p for r in ROLES for p in (self.client_cert(r), self.client_key(r))]
            return files + self._device_files(creds.devices), creds
        if role == "agent":
            files = [self.client_cert("agent"), self.client_key("agent"), self.keyring_file]
            tokens = {node: node_token(creds.agent_key, node)}
            bundle = Credentials({"agent": creds.passwords["agent"]}, None, node_tokens=tokens)
            return [*files, self.control_pub], bundle
        if role == "site":
            files = [self.server_cert, self.server_key]
            files += [self.client_cert("leaf"), self.client_key("leaf")]
            files += [self.client_cert("device"), self.client_key("device")]  # HTTP ingest
            devices = site_devices(creds.devices, site)
            files += self._device_files(devices)  # the MQTT gateway logs in as each
            bundle = Credentials(
                {r: creds.passwords[r] for r in ("agent", "device")},
                None,
                devices,
                ingest_token=ingest_token(creds.agent_key, site),
                site_route=site_route_password(creds.agent_key, site),
                site_leaf=site_leaf_password(creds.agent_key, site),
            )
            return files, bundle
        if role == "device":
            if device not in creds.devices:
                raise SecurityError(f"no device {device!r}: add it with `spanflow secrets device`")
            one = {device: creds.devices[device]}
            return self._device_files(one), Credentials({}, None, one)
        files = [self.client_cert("reader"), self.client_key("reader")]
        return files, Credentials({"reader": creds.passwords["reader"]}, None)

    def _host_certificate(self, hosts: tuple[str, ...]) -> pki.Issued:
        """A server certificate for these hosts alone, from the deployment's CA."""
        names = tuple(dict.fromkeys((*DEFAULT_HOSTS, *hosts)))
        # client use too: a clustered server dials its routes with it
        return pki.issue(
            self._ca(), f"spanflow server {hosts[0]}", hosts=names, server=True, client=True
        )

    def _device_files(self, devices: dict[str, Device]) -> list[Path]:
        missing = [name for name in devices if not self.device_cert(name).exists()]
        if missing:
            raise SecurityError(
                f"no certificate for device(s) {', '.join(sorted(missing))}: run "
                "`spanflow secrets init` on the issuing host (it issues what is missing)"
            )
        return [
            p for name in sorted(devices) for p in (self.device_cert(name), self.device_key(name))
        ]

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
        if not name or any(c in name for c in " .*>\t\n"):
            raise SecurityError(f"a device name is one token without spaces or dots: {name!r}")
        if name in ROLES:
            raise SecurityError(f"{name!r} is a role, not a device name")
        if not publish:
            raise SecurityError("a device needs at least one subject it may publish on")
        creds = self.credentials()
        password = _password()
        devices = {**creds.devices, name: Device(password, publish, subscribe, site)}
        self._issue_device_cert(name)  # first: without the CA key nothing changes
        updated = replace(creds, devices=devices)
        _write_private(self.credentials_file, updated.to_json())
        return password

    def revoke_device(self, name: str) -> None:
        """Remove a device's user; servers that reload (SIGHUP) close its connections."""
        creds = self.credentials()
        if name not in creds.devices:
            raise SecurityError(f"no device {name!r} to revoke")
        devices = {k: v for k, v in creds.devices.items() if k != name}
        _write_private(self.credentials_file, replace(creds, devices=devices).to_json())
        self.device_cert(name).unlink(missing_ok=True)  # mapped to no user from now on
        self.device_key(name).unlink(missing_ok=True)

    def write_keyring(self, ring: Keyring) -> None:
        _write_private(self.keyring_file, ring.dumps())

    def _ca(self) -> pki.Issued:
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


def secrets_from_env() -> Secrets | None:
    root = os.environ.get(SECRETS_ENV)
    return Secrets(root) if root else None


def identity_from_env() -> NatsIdentity | None:
    """This process's NATS identity (``SPANFLOW_SECRETS`` + ``SPANFLOW_ROLE``), or None
    in open mode."""
    found = secrets_from_env()
    if found is None:
        return None
    return found.identity(os.environ.get(ROLE_ENV, "agent"))


def control_identity_from_env() -> NatsIdentity | None:
    """The control account's identity for this coordinator, or None in open mode (one
    account for everything: the control plane connects as the data plane does)."""
    found = secrets_from_env()
    return None if found is None else found.identity(CONTROL_ROLE)


def adopt(secrets: Secrets, role: str) -> None:
    """Make this process (and every child it starts, Spark's workers included) use
    ``secrets`` as ``role``."""
    os.environ[SECRETS_ENV] = str(secrets.root.resolve())
    os.environ[ROLE_ENV] = role


def assignment_signer() -> Signer | None:
    """This coordinator's signer for assignments (locked), or None (open mode)."""
    found = secrets_from_env()
    if found is None:
        return None
    signer = found.signer()
    if signer is None:
        raise SecurityError(
            f"{found.control_key} is missing: coordinators sign assignments with it "
            "(run `spanflow secrets init` on the issuing host; export --role coordinator)"
        )
    return signer


def assignment_verifier() -> Verifier | None:
    """This agent's check of assignments' signatures (locked), or None (open mode)."""
    found = secrets_from_env()
    if found is None:
        return None
    verifier = found.verifier()
    if verifier is None:
        raise SecurityError(
            f"{found.control_pub} is missing: agents check assignments with it "
            "(export the node's bundle again)"
        )
    return verifier


def own_node_token(node: str) -> str | None:
    """This agent's node token (locked), or None (open mode)."""
    found = secrets_from_env()
    return None if found is None else found.credentials().node_token_for(node)
