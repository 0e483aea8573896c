"""The dashboard in a real browser (Debian's Chromium through Playwright) against a
running cluster: NATS, a coordinator with a token and public reads, two agents with
Spark, a pipeline detecting anomalies. Every page is loaded and what it shows is
checked against the REST API; any console error or failed request fails the test;
each test leaves a screenshot in ``test-artifacts/dashboard/``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from spanflow.local.cluster import LocalCluster
from tests.helpers import read_records, wait_for
from tests.web.browser import Watched, cells, open_page
from tests.web.conftest import TOKEN, client, publish

pytestmark = pytest.mark.slow


def test_the_network_page_shows_the_nodes_and_fragments_the_api_lists(
    page: Watched, cluster: LocalCluster
) -> None:
    p = open_page(page, cluster, "")
    nodes = client(cluster, None).nodes()  # public reads: no token needed to look
    assert {n.name for n in nodes} == {"edge-1", "cloud-1"}
    wait_for(lambda: p.locator("#node-table tr[data-node]").count() == len(nodes), timeout=20)

    def health_agrees() -> bool:
        """The page shows the health the API gives, and every node is alive. (A loaded
        machine can make gossip suspect a node for a moment: page and API then say
        so until it answers again.)"""
        health = {n.name: n.health for n in client(cluster, None).nodes()}
        return all(
            cells(p, f"#node-table tr[data-node='{name}']", "health") == h == "alive"
            for name, h in health.items()
        )

    wait_for(health_agrees, timeout=60)
    for n in nodes:
        row = f"#node-table tr[data-node='{n.name}']"
        shown = cells(p, row, "fragments")
        assert sorted(shown.split()) == sorted(n.fragments) or (shown == "–" and not n.fragments)
        assert cells(p, row, "slots") == f"{n.slots_used} / {n.slots}"
        if n.name == "edge-1":
            assert n.slots_used == 3, "plant-watch's detector takes a second slot"
    metrics = client(cluster).cluster_metrics()
    assert p.locator("[data-card=nodes-alive] .v").inner_text() == str(metrics.nodes["alive"])
    assert p.locator("[data-card=leader] .v").inner_text() == metrics.leader
    # the graph: one node per site and machine, drawn by cytoscape on a canvas
    assert p.locator("#graph canvas").count() > 0


def test_the_pipeline_pages_show_state_placement_and_live_figures(
    page: Watched, cluster: LocalCluster
) -> None:
    api = client(cluster)
    publish(
        cluster.nats_url,
        "SENSORS",
        "sensors.d9",
        [{"device": "d9", "temperature": 20.0 + i % 3} for i in range(50)],
    )
    p = open_page(page, cluster, "pipelines")
    row = "#pipeline-table tr[data-pipeline='plant-watch']"
    p.wait_for_selector(row)
    # the page is live: on a busy machine a fragment may turn late and back between
    # the page's figure and the API's, so the two must agree once, not at one instant
    wait_for(lambda: cells(p, row, "state") == api.pipeline("plant-watch").state.value, 60)
    p.click(f"{row} a")
    p.wait_for_selector("#fragment-table tr[data-fragment]")
    status = api.pipeline("plant-watch")
    shown = p.locator("#fragment-table tr[data-fragment]")
    assert shown.count() == len(status.fragments)
    for f in status.fragments:
        frow = f"#fragment-table tr[data-fragment='{f.id}']"
        assert cells(p, frow, "node") == f.node
    # rows read climb to what was published (the table follows the live stream)
    read = lambda: sum(  # noqa: E731
        int(cells(p, f"#fragment-table tr[data-fragment='{f.id}']", "rows_in").replace(",", ""))
        for f in status.fragments
    )
    wait_for(lambda: read() >= 50, timeout=60)
    assert read() == sum(f.rows_in for f in api.pipeline_metrics("plant-watch").fragments.values())
    # one row per query (a sink of a fragment) with its checkpoint durations
    runtimes = api.pipeline_metrics("plant-watch").fragments
    queries = {f"{fid}/{q}" for fid, rt in runtimes.items() for q in rt.metrics}
    listed = p.locator("#query-table tr[data-query]").evaluate_all(
        "rows => rows.map((r) => r.dataset.query)"
    )
    assert set(listed) == queries and len(listed) == len(queries) == 2
    checkpoints = lambda: p.locator("#query-table [data-field=checkpoint]").all_inner_texts()  # noqa: E731
    wait_for(lambda: all(c.strip().endswith("ms") for c in checkpoints()), timeout=60)
    assert p.locator("#charts .chart canvas").count() == 10  # uPlot: one per figure
    assert p.locator("#dag canvas").count() > 0
    # the job graph: the fragment's box holds its steps, as the planner cut them
    steps = p.evaluate(
        "S.graph.nodes('.step').map((n) => [n.data('parent'), n.id().split('/').pop()])"
    )
    for f in status.fragments:
        assert sorted(s for parent, s in steps if parent == f"frag:{f.id}") == sorted(f.steps)


def test_an_anomaly_appears_in_the_event_feed(page: Watched, cluster: LocalCluster) -> None:
    p = open_page(page, cluster, "events")
    p.wait_for_selector("#event-table tr[data-kind=pipeline-submitted]")
    steady = [{"device": "d1", "temperature": 20.0 + (i % 5) * 0.1} for i in range(60)]
    publish(cluster.nats_url, "SENSORS", "sensors.d1", steady)
    publish(cluster.nats_url, "SENSORS", "sensors.d1", [{"device": "d1", "temperature": 95.0}])
    p.wait_for_selector("#detection-table tr[data-kind=anomaly]", timeout=90_000)
    feed = client(cluster).request("GET", "/api/v1/events?kind=anomaly").json()
    assert feed and all(e["data"]["device"] == "d1" for e in feed)
    assert any(e["data"]["temperature"] == 95.0 for e in feed)
    row = p.locator("#detection-table tr[data-kind=anomaly]").first
    assert "d1" in row.inner_text() and "plant-watch" in row.inner_text()
    # the 95 °C reading is also an alert (temperature > 30): the feed names it so
    p.wait_for_selector("#detection-table tr[data-kind=alert]")
    p.select_option("#data-kind", "anomaly")
    assert p.locator("#detection-table tr[data-kind=alert]").count() == 0


def test_an_overheat_is_one_incident_per_kind_with_its_count(
    page: Watched, cluster: LocalCluster
) -> None:
    """The feed lists incidents, not rows: twelve hot readings of one machine are one
    alert incident of twelve and one anomaly incident, not 12 + n rows."""
    steady = [{"device": "h1", "temperature": 20.0 + (i % 5) * 0.1} for i in range(40)]
    publish(cluster.nats_url, "SENSORS", "sensors.h1", steady)
    hot = [{"device": "h1", "temperature": 90.0 + i} for i in range(12)]
    publish(cluster.nats_url, "SENSORS", "sensors.h1", hot)
    api = client(cluster)

    def of_h1(kind: str) -> list[dict[str, Any]]:
        found = api.request("GET", f"/api/v1/incidents?kind={kind}").json()
        return [i for i in found if i["subject"].endswith(".h1")]

    wait_for(lambda: sum(i["count"] for i in of_h1("alert")) >= 12, timeout=90)
    alerts = of_h1("alert")
    assert [(i["count"], i["open"]) for i in alerts] == [(12, True)]
    assert alerts[0]["latest"]["temperature"] == 101.0
    wait_for(lambda: _anomalies(cluster, "h1") > 0 and of_h1("anomaly"), timeout=90)
    wait_for(lambda: sum(i["count"] for i in of_h1("anomaly")) == _anomalies(cluster, "h1"))
    assert len(of_h1("anomaly")) == 1  # every anomaly of the burst in one incident
    p = open_page(page, cluster, "events")
    row = p.locator("#detection-table tr[data-kind=alert]", has_text="alerts.h1")
    row.first.wait_for(timeout=30_000)
    assert (
        row.count() == 1
        and cells(p, f"#detection-table tr[data-incident='{alerts[0]['id']}']", "count") == "12"
    )
    assert "temperature 101" in row.first.inner_text()  # readable, not key=value dumps
    assert "null" not in p.locator("#detection-table").inner_text()


def _onnx_model(path: Path) -> bytes:
    import numpy as np
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    x = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    model = LogisticRegression().fit(x, [0, 1, 1, 0])
    path.write_bytes(to_onnx(model, x[:1]).SerializeToString())
    return path.read_bytes()


def test_promote_and_roll_back_need_the_token(
    page: Watched, cluster: LocalCluster, tmp_path: Path
) -> None:
    api = client(cluster)
    data = _onnx_model(tmp_path / "m.onnx")
    push = f"{cluster.url}/api/v1/models/pump/versions?format=onnx&features=t,v"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(2):
        assert httpx.post(push, content=data, headers=auth).status_code == 201
    assert api.request("POST", "/api/v1/models/pump/promote", {"version": 2}).status_code == 200

    def production() -> int | None:
        return api.request("GET", "/api/v1/models/pump").json()["production"]

    p = open_page(page, cluster, "models")
    model = "[data-model=pump]"
    p.wait_for_selector(f"{model} button[data-promote][data-version='1']")
    assert cells(p, model, "production") == "v2"
    # without the token: refused, and nothing changes
    page.expected.add(401)
    p.click(f"{model} button[data-promote][data-version='1']")
    p.wait_for_selector("[data-result=error][data-status='401']")
    assert production() == 2
    page.expected.discard(401)
    # with it: promoted, then rolled back
    p.fill("#token", TOKEN)
    p.click("#token-form button")
    p.wait_for_selector(f"{model} button[data-promote][data-version='1']")
    p.click(f"{model} button[data-promote][data-version='1']")
    p.wait_for_selector("[data-result=ok]")
    wait_for(lambda: production() == 1, timeout=10)
    wait_for(lambda: cells(p, model, "production") == "v1", timeout=10)
    p.click(f"{model} button[data-rollback]")
    wait_for(lambda: production() == 2, timeout=10)
    wait_for(lambda: cells(p, model, "production") == "v2", timeout=10)


def test_the_rest_reference_works_offline(page: Watched, cluster: LocalCluster) -> None:
    p = open_page(page, cluster, "api")
    docs = p.frame_locator("iframe.docs")
    docs.locator(".swagger-ui .opblock-summary-path").first.wait_for(timeout=30_000)
    paths = docs.locator(".swagger-ui .opblock-summary-path").all_inner_texts()
    assert "/api/v1/nodes" in [t.strip() for t in paths]
    # every asset came from the coordinator itself (no CDN): any other host would
    # have failed here and been reported by the page fixture


def _anomalies(cluster: LocalCluster, device: str) -> int:
    """Anomalies of ``device`` in the sink's stream (read from a thread of its own:
    Playwright's sync API runs an event loop in this one)."""
    with ThreadPoolExecutor(1) as pool:
        records = pool.submit(read_records, cluster.nats_url, "PLANT_ANOMALIES").result()
    return sum(r["device"] == device for r in records)


def test_rebaseline_from_the_events_page_is_logged_and_the_key_learns_afresh(
    page: Watched, cluster: LocalCluster
) -> None:
    for device in ("r1", "r2"):  # r2 is not rebaselined: the control
        steady = [{"device": device, "temperature": 20.0 + (i % 5) * 0.1} for i in range(40)]
        publish(cluster.nats_url, "SENSORS", f"sensors.{device}", steady)
    publish(cluster.nats_url, "SENSORS", "sensors.r1", [{"device": "r1", "temperature": 95.0}])
    p = open_page(page, cluster, "events")
    p.fill("#token", TOKEN)
    p.click("#token-form button")
    row = p.locator("#detection-table tr[data-kind=anomaly]", has_text="r1").first
    row.wait_for(timeout=90_000)
    p.once("dialog", lambda dialog: dialog.accept())
    row.locator("button[data-rebaseline]").click()
    p.wait_for_selector("[data-result=ok]")
    log = client(cluster).log(limit=1000)
    done = [e for e in log if e.kind == "detector-rebaselined"]
    assert [(e.detail["pipeline"], e.detail["step"], e.detail["key"]) for e in done] == [
        ("plant-watch", "watch", "r1")
    ]
    assert done[0].detail["by"] == "operator"
    # r1 is in a fresh warm-up (20 readings): the same reading is not an anomaly now,
    # while r2, not rebaselined, flags it (published after: its batch is no earlier)
    assert _anomalies(cluster, "r2") == 0
    wild = [{"device": "r1", "temperature": 95.0} for _ in range(15)]
    publish(cluster.nats_url, "SENSORS", "sensors.r1", wild)
    publish(cluster.nats_url, "SENSORS", "sensors.r2", [{"device": "r2", "temperature": 95.0}])
    wait_for(lambda: _anomalies(cluster, "r2") == 1, timeout=90)
    assert _anomalies(cluster, "r1") == 1


def test_a_killed_node_turns_dead_on_the_network_page(page: Watched, cluster: LocalCluster) -> None:
    p = open_page(page, cluster, "")
    row = "#node-table tr[data-node='cloud-1']"
    p.wait_for_selector(row)
    assert cells(p, row, "health") == "alive"
    cluster.kill("node-cloud-1")
    wait_for(lambda: client(cluster).node("cloud-1").health == "dead", timeout=60)
    wait_for(lambda: cells(p, row, "health") == "dead", timeout=10)
    assert p.locator("[data-card=nodes-failed] .v").inner_text() == "1"
    assert cells(p, row, "cpu") == "–"  # no last figures of a node that cannot be heard
    fill = p.evaluate("S.graph.getElementById('site:cloud').data('fill')")
    assert fill == "#f6d5d5"  # a site none of whose nodes can be heard is drawn red
