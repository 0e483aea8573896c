"""Several hosts on one machine: each in its own network namespace with its own
address, joined by a bridge — for tests and demos of spanflow across real addresses
(docs/security.md, docs/cluster.md).

Needs root (``ip netns``). Every name it creates carries a random tag, every process
it starts is killed and every namespace, veth and bridge removed on :meth:`close`
(also at interpreter exit), so a failed test leaves nothing behind. Links between
hosts are cut and healed by taking a host's veth down and up (this kernel has no
``netem``; WAN delay goes through :class:`~spanflow.nats.relay.WanRelay`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets as _random
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from spanflow.errors import SpanflowError


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SpanflowError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def can_make_hosts() -> str | None:
    """Why namespaced hosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"sfprobe{_random.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except (SpanflowError, FileNotFoundError) as exc:
        return f"ip netns does not work here: {exc}"
    _ip("netns", "del", probe)
    return None


@dataclass
class Host:
    name: str
    address: str
    namespace: str
    veth: str
    """The root-side end of its link: down is a cut."""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


class Hosts:
    """``with Hosts() as net: h = net.add("cloud"); net.run(h, [...])``."""

    def __init__(self, subnet: str = "10.201.0") -> None:
        self.tag = _random.token_hex(2)
        self.subnet = subnet
        self.bridge = f"sfbr{self.tag}"
        self.hosts: dict[str, Host] = {}
        self._made_bridge = False
        atexit.register(self.close)

    @property
    def gateway(self) -> str:
        """The bridge's own address (this machine's root namespace)."""
        return f"{self.subnet}.254"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def add(self, name: str) -> Host:
        """A new host with the next address on the bridge."""
        if not self._made_bridge:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made_bridge = True
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        index = len(self.hosts) + 1
        namespace, veth, inner = f"sf{self.tag}{name}"[:15], f"sf{self.tag}h{index}", "eth0"
        _ip("netns", "add", namespace)
        host = Host(name, f"{self.subnet}.{index}", namespace, veth)
        self.hosts[name] = host
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _ip("link", "set", f"{veth}p", "netns", namespace)
        _ip("link", "set", veth, "master", self.bridge, "up")
        for args in (
            ("link", "set", f"{veth}p", "name", inner),
            ("addr", "add", f"{host.address}/24", "dev", inner),
            ("link", "set", inner, "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("-n", namespace, *args)
        return host

    def run(
        self,
        host: Host,
        argv: list[str],
        *,
        log: Path,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``; output goes to ``log``."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", host.namespace, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        host.procs.append(proc)
        return proc

    def cut(self, host: Host) -> None:
        """Unplug ``host``: nothing reaches it or leaves it until :meth:`heal`."""
        _ip("link", "set", host.veth, "down")

    def heal(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")

    def cut_between(self, side: Iterable[Host], other: Iterable[Host]) -> None:
        """A WAN cut between two sites: nothing crosses between a host of ``side`` and
        a host of ``other`` (blackhole routes both ways) while each site's own hosts
        still reach each other, until :meth:`heal_between`."""
        self._routes("add", list(side), list(other))

    def heal_between(self, side: Iterable[Host], other: Iterable[Host]) -> None:
        self._routes("del", list(side), list(other))

    def _routes(self, verb: str, side: list[Host], other: list[Host]) -> None:
        for a, b in [(a, b) for a in side for b in other] + [(b, a) for a in side for b in other]:
            _ip("-n", a.namespace, "route", verb, "blackhole", f"{b.address}/32")

    def kill(self, host: Host) -> None:
        """The host is lost: every process on it SIGKILLed, its link down (its disk —
        the files its processes wrote — stays, as a dead machine's would)."""
        self.cut(host)
        for proc in host.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def close(self) -> None:
        """Kill every process started here and remove every namespace and link."""
        for host in self.hosts.values():
            for proc in host.procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGTERM)
                        proc.wait(10)
                    except (ProcessLookupError, subprocess.TimeoutExpired):
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
            subprocess.run(["ip", "link", "del", host.veth], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, check=False)
        self.hosts.clear()
        if self._made_bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
            self._made_bridge = False
