"""The cluster demo: two factories and a cloud on this machine, each factory with its
own NATS server, one pipeline split by the planner into per-machine anomaly detection
and an overheat-then-vibration pattern, per-site windows and alerts at the edge and a
global summary in the cloud — with the cluster's status live."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.live import Live

from spanflow.demo.feed import ClusterFeed
from spanflow.demo.pipelines import SITES, factory_monitoring
from spanflow.demo.view import cluster_view
from spanflow.local.api import Api
from spanflow.local.cluster import LocalCluster
from spanflow.nats.streams import SyncNats, connect
from spanflow.protocol.rest import Incident, PipelineStatus, SubmitBody
from spanflow.simulator import SensorSimulator, SimulatorConfig
from spanflow.spec.cluster import PipelineState

SETTLE_SECONDS = 30.0
"""How long the demo's end waits for a recovering pipeline before it reports its state."""
RECOVERING = (PipelineState.CREATED, PipelineState.PLANNED, PipelineState.FAILING)

DEMO_TOPOLOGY = """\
# The cluster demo: two factories (edge sites) and a cloud region on one machine.
name: demo
sites:
  - {name: factory-a, kind: edge}
  - {name: factory-b, kind: edge}
  - {name: cloud, kind: cloud}
nodes:
  - name: edge-a
    site: factory-a
    local: true
    capabilities: {cores: 1, memory_mb: 1g, slots: 2}
    streams: [{name: SENSORS, subjects: ["sensors.factory-a.>"]}]
  - name: edge-b
    site: factory-b
    local: true
    capabilities: {cores: 1, memory_mb: 1g, slots: 2}
    streams: [{name: SENSORS, subjects: ["sensors.factory-b.>"]}]
  - name: cloud-1
    site: cloud
    local: true
    capabilities: {cores: 2, memory_mb: 2g, slots: 4}
links:
  - {between: [factory-a, cloud], latency: 30ms, bandwidth_mbps: 100}
  - {between: [factory-b, cloud], latency: 50ms, bandwidth_mbps: 50}
  - {between: [factory-a, factory-b], latency: 60ms, bandwidth_mbps: 20}
"""

StatusView = Callable[[Api], RenderableType]


class ClusterDemo:
    def __init__(self, rate: float, devices: int, console: Console, err: Console) -> None:
        self.devices = devices
        self.console, self.err = console, err
        self.work = Path(tempfile.mkdtemp(prefix="spanflow-demo-"))
        topology = self.work / "topology.yaml"
        topology.write_text(DEMO_TOPOLOGY)
        self.cluster = LocalCluster(topology, self.work, port=0, site_servers=True)
        self.sims = [
            SensorSimulator(
                SimulatorConfig(
                    devices=devices,
                    rate=rate,
                    site=site,
                    anomaly_rate=0.01,
                    overheat_rate=0.01,  # machines that overheat, then vibrate: the pattern
                    seed=i,
                )
            )
            for i, site in enumerate(SITES)
        ]
        self.feed = ClusterFeed(self.sims)
        self.incidents: list[Incident] = []
        """The event feed's incidents at the end of the run."""
        self._sim_stop = asyncio.Event()
        self._client: SyncNats | None = None
        self._sim_thread: threading.Thread | None = None

    def _enough(self, until_global: int | None, until_patterns: int | None) -> bool:
        """Whether the outputs asked for have all come (nothing asked: never)."""
        if not until_global and not until_patterns:
            return False
        feed = self.feed
        sites = not until_global or all(feed.global_by_site[s] >= until_global for s in SITES)
        return sites and (not until_patterns or feed.counts["patterns"] >= until_patterns)

    def run(
        self,
        stop: threading.Event,
        status: StatusView,
        duration: float | None,
        until_global: int | None,
        until_patterns: int | None = None,
    ) -> str:
        """Start everything, show it live until ``stop``, ``duration`` or every site
        has ``until_global`` summaries (and the pattern ``until_patterns`` matches);
        stop the cluster. The pipelines' final states."""
        try:
            api = self._start()
            self._watch(
                stop,
                lambda: cluster_view(self.feed, status(api)),
                duration,
                until_global,
                until_patterns,
            )
            final = self._settled(api)
            self.incidents = api.typed(lambda c: c.incidents())
        finally:
            self._stop()
        shutil.rmtree(self.work, ignore_errors=True)
        return ", ".join(f"{p.name} {p.state.value}" for p in final)

    def _settled(self, api: Api, patience: float = SETTLE_SECONDS) -> list[PipelineStatus]:
        """The pipelines' states once none is recovering (a query a busy machine made
        fail is restarted from its checkpoint within seconds), or after ``patience``:
        the state to report is the one the pipeline settles in, not a restart's
        moment."""
        deadline = time.monotonic() + patience
        while True:
            final = api.typed(lambda c: c.pipelines())
            if time.monotonic() >= deadline or not [p for p in final if p.state in RECOVERING]:
                return final
            time.sleep(1.0)

    def _start(self) -> Api:
        self.err.print(
            "starting NATS (a server per factory, linked to the cloud's), the coordinator "
            f"and 3 nodes (logs in {self.work / 'logs'}) …"
        )
        self.err.print(
            "[yellow]OPEN MODE (a laptop demo): servers on 127.0.0.1 without TLS or users; "
            "see docs/security.md to lock every door[/yellow]"
        )
        cluster = self.cluster.start()
        self.err.print(
            f"coordinator {cluster.url}; [bold]dashboard {cluster.url}/ui/[/bold]; "
            "waiting for the nodes (each starts Spark) …"
        )
        cluster.wait_for_nodes()
        api = cluster.api()
        spec = factory_monitoring().spec().model_dump(mode="json", by_alias=True)
        st = api.typed(lambda c: c.submit(SubmitBody(spec=spec)))
        placed = ", ".join(f"{f.id.rsplit('.', 1)[-1]} on {f.node}" for f in st.fragments)
        self.err.print(f"submitted {st.name} → {placed}")
        self._client = SyncNats(cluster.nats_url)
        self.feed.subscribe(self._client)
        self._sim_thread = threading.Thread(target=self._simulate, name="simulators", daemon=True)
        self._sim_thread.start()
        self.err.print(
            f"simulating {self.devices} sensors at each of {', '.join(SITES)} (stream SENSORS "
            "on each factory's server); first windows after ~20 s, global summaries ~20 s later"
        )
        return api

    def _simulate(self) -> None:
        async def go() -> None:
            # Each factory's sensors publish to the factory's own server.
            conns = [await connect(self.cluster.site_urls[site]) for site in SITES]
            await asyncio.gather(
                *(
                    s.publish(nc, stop=self._sim_stop)
                    for s, nc in zip(self.sims, conns, strict=True)
                )
            )
            for nc in conns:
                await nc.close()

        asyncio.run(go())

    def _watch(
        self,
        stop: threading.Event,
        view: Callable[[], Group],
        duration: float | None,
        until_global: int | None,
        until_patterns: int | None = None,
    ) -> None:
        """Live on a terminal; else each output's line, and the status every 30 s."""
        console, printed = self.console, self.feed.printed
        deadline = time.monotonic() + duration if duration else None
        last_print = time.monotonic()
        live_cm = (
            Live(view(), console=console, refresh_per_second=1)
            if console.is_terminal
            else contextlib.nullcontext()
        )
        with live_cm as live:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                if self._enough(until_global, until_patterns):
                    break
                self.cluster.check_coordinators()
                if live is not None:
                    live.update(view())
                    printed.clear()
                else:
                    while printed:
                        console.print(printed.popleft())
                    if time.monotonic() - last_print > 30:
                        last_print = time.monotonic()
                        console.print(view().renderables[0])
                stop.wait(1.0)
        while printed and not console.is_terminal:
            console.print(printed.popleft())

    def _stop(self) -> None:
        self._sim_stop.set()
        if self._sim_thread is not None:
            self._sim_thread.join(timeout=10)
        if self._client is not None:
            self._client.close()
        self.err.print("stopping the cluster …")
        self.cluster.stop()
