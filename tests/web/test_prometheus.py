"""The shipped Prometheus configuration and Grafana dashboards against a real
Prometheus (Debian's) scraping the running cluster: every query of every dashboard
returns data."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from spanflow.local.cluster import LocalCluster
from spanflow.local.server import free_port
from tests.helpers import wait_for
from tests.web.conftest import TOKEN, publish

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = "/usr/bin/prometheus"


def dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "deploy" / "grafana").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                out.append((f"{path.stem}: {panel['title']}", target["expr"]))
    return out


@pytest.fixture
def prometheus(cluster: LocalCluster, tmp_path: Path) -> Iterator[str]:
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"{PROMETHEUS} is missing: run `./dev test` once (apt prometheus)")
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    job = config["scrape_configs"][0]
    job["static_configs"][0]["targets"] = [cluster.url.removeprefix("http://")]
    (tmp_path / "token").write_text(TOKEN)
    job["authorization"]["credentials_file"] = str(tmp_path / "token")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), timeout=30)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, expr: str) -> list[dict[str, object]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert body["status"] == "success", f"{expr}: {body}"
    return list(body["data"]["result"])


def test_every_grafana_query_returns_data(cluster: LocalCluster, prometheus: str) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 30 and len({f for f, _ in queries}) == len(queries)
    # the scrape works with the token the shipped configuration names
    wait_for(lambda: bool(query(prometheus, 'up{job="spanflow"} == 1')), timeout=30)
    # a workload for every panel: readings, then a spike the detector flags
    steady = [{"device": "p1", "temperature": 20.0 + (i % 4) * 0.2} for i in range(40)]
    publish(cluster.nats_url, "SENSORS", "sensors.p1", steady)
    publish(cluster.nats_url, "SENSORS", "sensors.p1", [{"device": "p1", "temperature": 99.0}])
    empty: dict[str, str] = {}

    def all_answer() -> bool:
        empty.clear()
        for title, expr in queries:
            if not query(prometheus, expr):
                empty[title] = expr
        return not empty

    try:
        wait_for(all_answer, timeout=120, interval=2)
    except AssertionError:
        raise AssertionError(f"queries without data: {json.dumps(empty, indent=1)}") from None
