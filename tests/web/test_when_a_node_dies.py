"""What the dashboard, the API and /metrics show of a pipeline whose node dies, in a
real browser on the shared cluster: one source of truth for health.

The cluster's nodes are suspect after 1 s of silence and fail after 5 s; this test
watches that window, so no peer may declare the node dead by gossip first (cloud-1,
its only peer, is stopped before)."""

from __future__ import annotations

import pytest

from spanflow.local.cluster import LocalCluster
from tests.helpers import wait_for
from tests.web.browser import ARTIFACTS, Watched, cells, fragment_up, open_page
from tests.web.conftest import client, publish

pytestmark = pytest.mark.slow


def test_a_dead_nodes_fragment_is_unreachable_everywhere_and_runs_again_when_it_returns(
    page: Watched, cluster: LocalCluster
) -> None:
    api = client(cluster)
    if cluster.procs["node-cloud-1"].poll() is None:
        cluster.kill("node-cloud-1")  # its gossip would declare edge-1 dead at once
    wait_for(lambda: api.pipeline("plant-watch").health == "healthy", timeout=90)
    before = api.pipeline("plant-watch").rows_in
    publish(cluster.nats_url, "SENSORS", "sensors.u1", [{"device": "u1", "temperature": 1.0}] * 5)
    wait_for(lambda: api.pipeline("plant-watch").rows_in >= before + 5, timeout=60)
    fid = api.pipeline("plant-watch").fragments[0].id
    p = open_page(page, cluster, "pipelines/plant-watch")
    row = f"#fragment-table tr[data-fragment='{fid}']"
    wait_for(lambda: cells(p, row, "status") == "running", timeout=10)
    assert fragment_up(cluster, fid) == 1.0

    cluster.kill("node-edge-1")
    wait_for(lambda: cells(p, row, "status") == "unreachable", timeout=5)
    assert "last heard" in cells(p, row, "stale")
    assert p.locator(f"{row}.stale").count() == 1  # its last figures greyed as stale
    assert p.locator("[data-card=state] .v").inner_text() == "degraded"
    label = p.evaluate(f"S.graph.getElementById('frag:{fid}').data('label')")
    assert "on edge-1 (unreachable)" in label  # the job graph's box of the fragment
    # the health strip on every page says what is wrong, red
    wait_for(lambda: p.locator("#health").get_attribute("data-level") == "red", timeout=5)
    strip = p.locator("#health").inner_text()
    assert "node edge-1" in strip and "pipeline plant-watch" in strip and "unreachable" in strip
    p.screenshot(path=str(ARTIFACTS / "unreachable-fragment.png"), full_page=True)
    assert fragment_up(cluster, fid) == 0.0
    status = api.pipeline("plant-watch")
    assert status.health == "degraded" and (status.rows_in, status.input_rows_per_s) == (0, 0.0)
    assert api.pipeline_metrics("plant-watch").fragments == {}  # totals drop: no stale sums
    assert api.cluster_metrics().throughput_rows_per_s == 0.0

    cluster.start_node("edge-1")  # it comes back: its fragments run again
    wait_for(lambda: api.pipeline("plant-watch").health == "healthy", timeout=240)
    wait_for(lambda: api.pipeline("plant-windows").health == "healthy", timeout=120)
    wait_for(lambda: cells(p, row, "status") == "running", timeout=10)
    assert p.locator(f"{row}.stale").count() == 0
    assert p.locator("[data-card=state] .v").inner_text() == "running"
    wait_for(lambda: fragment_up(cluster, fid) == 1.0, timeout=10)
