"""``spanflow demo --hosts``: the factory demo across hosts — a cloud host and two
factory hosts, each in its own network namespace with its own address, every door
locked. Needs root (network namespaces); see docs/security.md.

On each factory host: the site's NATS server (a leaf of the hub, with the MQTT
gateway), the factory's node agent and its simulated sensors. On the cloud host: the
hub, the coordinator and the cloud node. ``--cut SITE:SECONDS`` unplugs a factory
once the first global summaries arrive, then plugs it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from spanflow.errors import SpanflowError
from spanflow.security.https import client_context

err = Console(stderr=True, soft_wrap=True)
"""Where the demo says what it does (its results go to stdout)."""

SITES = ("factory-a", "factory-b")
NODES = {"factory-a": "edge-a", "factory-b": "edge-b"}


def _wait_line(log: Path, pattern: str, proc: Any, timeout: float = 120.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        found = re.search(pattern, text)
        if found:
            return found
        if proc.poll() is not None:
            raise SpanflowError(f"{log.stem} exited:\n{text[-2000:]}")
        time.sleep(0.2)
    raise SpanflowError(f"{log.stem} did not say {pattern!r} within {timeout:.0f} s")


def hub_args(address: str, data_dir: Path) -> list[str]:
    """``spanflow site-server`` arguments of the hub on ``address``."""
    listen = ["--listen", f"{address}:4222", "--leaf-listen", f"{address}:7422"]
    return ["site-server", "--site", "hub", *listen, "--data-dir", str(data_dir)]


def _topology(addresses: dict[str, str]) -> str:
    from spanflow.demo.cluster import DEMO_TOPOLOGY

    text = DEMO_TOPOLOGY.replace("    local: true\n", "")
    for site in SITES:
        text = text.replace(
            f"  - {{name: {site}, kind: edge}}",
            f"  - {{name: {site}, kind: edge, nats_url: 'tls://{addresses[site]}:4222'}}",
        )
    return text


def run_hosts_demo(duration: float | None, rate: float, devices: int, cut: str | None) -> None:
    from spanflow.local.hosts import Hosts, can_make_hosts
    from spanflow.security.secrets import ROLE_ENV, SECRETS_ENV, Secrets

    why_not = can_make_hosts()
    if why_not is not None:
        raise SpanflowError(f"--hosts: {why_not}")
    cut_site, cut_seconds = _parse_cut(cut)
    work = Path(tempfile.mkdtemp(prefix="spanflow-hosts-demo-"))
    cli = [sys.executable, "-m", "spanflow.cli"]
    with Hosts() as net:
        cloud = net.add("cloud")
        factories = {site: net.add(site) for site in SITES}
        addresses = {"cloud": cloud.address, **{s: h.address for s, h in factories.items()}}
        secrets = Secrets(work / "secrets")
        secrets.init(hosts=tuple(addresses.values()))
        env = {SECRETS_ENV: str(secrets.root), "SPARK_LOCAL_IP": "127.0.0.1"}
        err.print(
            "hosts: "
            + ", ".join(f"{name} {addr}" for name, addr in addresses.items())
            + f" (logs in {work})"
        )

        def start(host: Any, name: str, args: list[str], **extra: str) -> tuple[Path, Any]:
            log = work / f"{name}.log"
            return log, net.run(host, [*cli, *args], log=log, env={**env, **extra})

        log, proc = start(
            cloud,
            "hub",
            hub_args(cloud.address, work / "hub"),
        )
        hub_url = _wait_line(log, r"site hub: NATS (\S+)", proc).group(1)
        for site, host in factories.items():
            log, proc = start(
                host, site, _site_server_args(site, host.address, cloud.address, work)
            )
            _wait_line(log, r"MQTT listener on", proc)
        topology = work / "topology.yaml"
        topology.write_text(_topology(addresses))
        coordinator = f"https://{cloud.address}:7070"  # locked beyond loopback: HTTPS
        log, proc = start(
            cloud, "coordinator", _coordinator_args(hub_url, topology, cloud.address, work)
        )
        _wait_line(log, r"coordinator on", proc)
        for site, host in (("cloud", cloud), *factories.items()):
            node = NODES.get(site, "cloud-1")
            start(host, node, _node_args(node, site, coordinator, host.address, work))
        api = _api(coordinator, secrets.credentials().rest_token or "", client_context(secrets))
        _submit_when_nodes_are_up(api)
        for site, host in factories.items():
            simulate = [
                "simulate",
                *("--nats", f"tls://{host.address}:4222", "--site", site),
                *("--devices", str(devices), "--rate", str(rate)),
            ]
            start(host, f"sensors-{site}", simulate, **{ROLE_ENV: "agent"})
        _watch(hub_url, secrets, duration, cut_site and (net, factories[cut_site], cut_seconds))


def _site_server_args(site: str, address: str, cloud: str, work: Path) -> list[str]:
    """A factory's site server: a leaf of the hub, with the MQTT gateway; its sensors'
    subjects and spanflow's edge-only ones stay on the site."""
    from spanflow.nats.cluster import EDGE_ONLY_SUBJECTS

    deny = [*EDGE_ONLY_SUBJECTS, f"sensors.{site}.>"]
    return [
        "site-server",
        *("--site", site, "--hub", f"nats-leaf://{cloud}:7422"),
        *("--listen", f"{address}:4222", "--mqtt-listen", f"{address}:1883"),
        *("--data-dir", str(work / site)),
        *[a for d in deny for a in ("--deny-export", d)],
    ]


def _coordinator_args(hub_url: str, topology: Path, address: str, work: Path) -> list[str]:
    return [
        "coordinator",
        *("--nats", hub_url, "--hub-domain", "hub", "--topology", str(topology)),
        *("--host", address, "--port", "7070", "--data-dir", str(work / "coordinator")),
    ]


def _node_args(node: str, site: str, coordinator: str, address: str, work: Path) -> list[str]:
    return [
        "node",
        *("--name", node, "--site", site, "--coordinator", coordinator),
        *("--state-dir", str(work / node), "--gossip-bind", address),
    ]


def _submit_when_nodes_are_up(api: Any) -> None:
    from spanflow.demo.pipelines import factory_monitoring

    err.print("waiting for the three nodes (each starts Spark) …")
    _until(
        lambda: (
            {n["name"] for n in api("GET", "/api/v1/nodes") if n["state"] == "alive"}
            >= {"edge-a", "edge-b", "cloud-1"}
        ),
        300,
        "nodes did not register",
    )
    spec = factory_monitoring().spec().model_dump(mode="json", by_alias=True)
    st = api("POST", "/api/v1/pipelines", {"spec": spec})
    placed = ", ".join(f"{f['id'].rsplit('.', 1)[-1]} on {f['node']}" for f in st["fragments"])
    err.print(f"submitted {st['name']} → {placed}")


def _parse_cut(cut: str | None) -> tuple[str | None, float]:
    if cut is None:
        return None, 0.0
    site, _, seconds = cut.partition(":")
    if site not in SITES or not seconds.replace(".", "", 1).isdigit():
        raise SpanflowError(f"--cut: expected SITE:SECONDS with a site of {SITES}, not {cut!r}")
    return site, float(seconds)


def _api(base: str, token: str, verify: Any = True) -> Any:
    import httpx

    def call(method: str, path: str, body: Any = None) -> Any:
        r = httpx.request(
            method,
            base + path,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            verify=verify,
        )
        if r.status_code >= 400:
            raise SpanflowError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()

    def patient(method: str, path: str, body: Any = None) -> Any:
        try:
            return call(method, path, body)
        except Exception:
            if method != "GET":
                raise
            return []

    return patient


def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SpanflowError(what)
        time.sleep(1.0)


def _watch(hub_url: str, secrets: Any, duration: float | None, cut: Any) -> None:
    """Print each global summary as it reaches the cloud; cut a factory if asked."""
    from spanflow.nats.streams import connect

    async def go() -> None:
        nc = await connect(hub_url, identity=secrets.identity("reader"))
        seen: dict[str, int] = {}
        started = time.monotonic()
        cut_done = False

        async def on_summary(msg: Any) -> None:
            import orjson

            r = orjson.loads(msg.data)
            seen[r["site"]] = seen.get(r["site"], 0) + 1
            err.print(
                f"GLOBAL {r['site']} devices={r['devices']} readings={r['readings']} "
                f"avg={r['avg_temperature']:.1f} max={r['max_temperature']:.1f}"
            )

        await nc.subscribe("global.>", cb=on_summary)
        while duration is None or time.monotonic() - started < duration:
            await asyncio.sleep(1.0)
            if cut and not cut_done and len(seen) == len(SITES):
                net, host, seconds = cut
                err.print(f"[yellow]cutting {host.name}'s link for {seconds:.0f} s[/yellow]")
                net.cut(host)
                await asyncio.sleep(seconds)
                net.heal(host)
                err.print(f"[green]{host.name} is back: its buffered data catches up[/green]")
                cut_done = True
        await nc.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(go())
