"""A running cluster the dashboard and metrics tests share: NATS, a coordinator with a
token and public reads, two agents with Spark, a pipeline detecting anomalies, one
windowing. Nodes fail after 5 s of silence (suspect after 1 s): long enough for a test
to watch what the dashboard shows of a node that is silent but not yet failed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spanflow.local.cluster import LocalCluster
from spanflow.protocol.client import CoordinatorClient
from spanflow.protocol.rest import SubmitBody
from tests.helpers import publish as publish_now
from tests.helpers import wait_for
from tests.web.browser import ARTIFACTS, Watched

CHROMIUM = "/usr/lib/chromium/chromium"
TOKEN = "dashboard-token"

TOPOLOGY = """\
name: dashboard
sites:
  - {name: plant, kind: edge}
  - {name: cloud, kind: cloud}
nodes:
  - name: edge-1
    site: plant
    local: true
    # plant-watch takes 2 slots (its detector keeps state in Python), plant-windows 1:
    # both stay at the edge; cloud-1 runs nothing (a test kills it)
    capabilities: {cores: 1, slots: 3}
    streams:
      - {name: SENSORS, subjects: ["sensors.>"]}
  - name: cloud-1
    site: cloud
    local: true
    capabilities: {cores: 1, slots: 2}
links:
  - {between: [plant, cloud], latency: 25ms}
"""

PIPELINE = """\
name: plant-watch
trigger: 0.5s
sources:
  - id: readings
    stream: SENSORS
    subjects: ["sensors.>"]
    schema: {device: string, temperature: double}
    key: device
    to: [watch, hot]
processors:
  - id: watch
    type: detect_anomalies
    fields: [temperature]
    method: robust
    warmup: 20
    emit: anomalies
    to: [anomalies_out]
  - {id: hot, type: filter, where: "temperature > 30", to: [alerts_out]}
sinks:
  - {id: anomalies_out, type: jetstream, stream: PLANT_ANOMALIES, subject: "anomalies.{device}"}
  - {id: alerts_out, type: jetstream, stream: PLANT_ALERTS, subject: "alerts.{device}", feed: alert}
"""

WINDOWS = """\
name: plant-windows
trigger: 1s
sources:
  - id: readings
    stream: SENSORS
    subjects: ["sensors.>"]
    schema: {device: string, temperature: double, ts: timestamp}
    key: device
    event_time: ts
    max_out_of_orderness: 2s
    to: [per_device]
processors:
  - id: per_device
    type: window
    tumbling: 10s
    aggregates: {readings: count, hottest: max(temperature)}
    to: [windows_out]
sinks:
  - {id: windows_out, type: jetstream, stream: PLANT_WINDOWS, subject: "windows.{device}"}
"""


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    home = tmp_path_factory.mktemp("dashboard")
    (home / "topology.yaml").write_text(TOPOLOGY)
    c = LocalCluster(
        home / "topology.yaml",
        home,
        port=0,
        token=TOKEN,
        heartbeat=0.5,
        failure_after=10,
        coordinator_args=["--public-reads"],
    )
    try:
        c.start()
        c.wait_for_nodes(timeout=240)
        api = client(c)
        api.submit(SubmitBody(yaml=PIPELINE))
        api.submit(SubmitBody(yaml=WINDOWS))
        for name in ("plant-watch", "plant-windows"):
            wait_for(lambda name=name: api.pipeline(name).state == "running", timeout=180)
        yield c
    finally:
        c.stop()


def publish(
    url: str, stream: str, subject: str, records: list[dict[str, Any]] | list[bytes]
) -> None:
    """Publish (readings get the time now as ``ts`` unless they have one) from a thread
    of its own: Playwright's sync API runs an event loop in this one."""
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    payloads = [r if isinstance(r, bytes) else {"ts": now, **r} for r in records]
    with ThreadPoolExecutor(1) as pool:
        pool.submit(publish_now, url, stream, subject, payloads).result()


def client(c: LocalCluster, token: str | None = TOKEN) -> CoordinatorClient:
    return CoordinatorClient(c.url, token)


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `./dev test` once (apt chromium)")

    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Watched]:
    """A fresh page; its screenshot is left in ARTIFACTS, and a console error or failed
    request fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    watched = Watched(context.new_page())
    try:
        yield watched
    finally:
        watched.page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
        problems = list(watched.problems)
        context.close()  # aborts the live stream: not a failure of the page
    assert not problems, "\n".join(problems)
