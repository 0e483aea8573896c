"""The documentation's examples run: the topology and pipeline files load, the REST
session in docs/rest-api.md gets the answers it shows, and the CLI lines succeed."""

from __future__ import annotations

import json
import re
import shlex
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanflow.api import load_pipeline_text
from spanflow.api.topology_loader import load_topology_text
from spanflow.cli import app
from spanflow.control.coordinator import Coordinator, CoordinatorSettings
from spanflow.nats.server import EmbeddedNats
from spanflow.server.app import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROOT = DOCS.parent
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(page: str, info: str) -> list[str]:
    return [body for tag, body in FENCE.findall((DOCS / page).read_text()) if tag.strip() == info]


def test_topology_example_loads() -> None:
    (text,) = blocks("topology.md", "yaml topology")
    topo = load_topology_text(text, "topology.md")
    assert [n.name for n in topo.hosts_of("SENSORS_A")] == ["edge-a"]
    assert topo.site("factory-b").partition_name == "south"  # type: ignore[union-attr]


def test_pipeline_example_loads() -> None:
    (text,) = blocks("pipelines.md", "yaml pipeline")
    spec = load_pipeline_text(text, "pipelines.md")
    assert [s.id for s in spec.sinks()] == ["out"]


def test_keyed_processor_examples_run() -> None:
    runnable = blocks("pipelines.md", "python run")
    assert runnable
    for body in runnable:
        exec(compile(body, "pipelines.md", "exec"), {})


def test_processor_and_seed_pipeline_examples_load() -> None:
    (processor,) = blocks("pipelines.md", "yaml processor")
    spec = load_pipeline_text(processor, "pipelines.md")
    assert spec.step("track").type_name == "process"
    (seed,) = blocks("pipelines.md", "yaml seed")
    spec = load_pipeline_text(seed, "pipelines.md", source_stream="NUMBERS", sink_stream="RESULTS")
    types = {s.id: s.type_name for s in spec.steps}
    assert [types[i] for i in ("total", "how_many", "avg")] == ["sum", "count", "average"]
    expanded = [s.type_name for s in spec.step("avg").expand()]
    assert expanded == ["key_by", "event_time", "window"]


@pytest.fixture
def coordinator_api(tmp_path: Path) -> Iterator[TestClient]:
    (topology,) = blocks("topology.md", "yaml topology")
    with EmbeddedNats(tmp_path / "nats") as server:
        c = Coordinator(
            CoordinatorSettings(
                nats_url=server.url,
                state_dir=str(tmp_path / "state"),
                token="secret",
                topology=load_topology_text(topology),
                heartbeat_interval=30.0,
            )
        )
        with TestClient(create_app(c)) as client:
            yield client


def test_rest_session_runs_as_documented(coordinator_api: TestClient) -> None:
    page = (DOCS / "rest-api.md").read_text()
    requests = [(tag.strip(), body) for tag, body in FENCE.findall(page) if tag.startswith("http")]
    assert len(requests) >= 8
    for tag, body in requests:
        first, _, rest = body.partition("\n")
        method, path = first.split()
        payload = json.loads(rest) if rest.strip() else None
        r = coordinator_api.request(
            method, path, json=payload, headers={"Authorization": "Bearer secret"}
        )
        if tag == "http error":
            assert 400 <= r.status_code < 500, (first, r.text)
        else:
            assert r.status_code < 400, (first, r.text)
    shown = re.search(r"^422 (\{.*\})$", page, re.MULTILINE)
    assert shown is not None
    bad = requests[[t for t, _ in requests].index("http error")][1].partition("\n")[2]
    r = coordinator_api.post(
        "/api/v1/pipelines", json=json.loads(bad), headers={"Authorization": "Bearer secret"}
    )
    assert r.json() == json.loads(shown.group(1))
    hot = coordinator_api.get("/api/v1/pipelines/hot", headers={"Authorization": "Bearer secret"})
    assert hot.json()["state"] == "canceled"
    assert [h["state"] for h in hot.json()["history"]] == ["created", "planned", "canceled"]


def test_cli_lines_succeed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    (text,) = blocks("cli.md", "bash cli")
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "spanflow"
        result = CliRunner().invoke(app, argv[1:])
        assert result.exit_code == 0, (line, result.output)


def test_cluster_example_is_the_demo_pipeline_and_topology() -> None:
    """examples/cluster/ holds what `spanflow demo` runs."""
    from spanflow import demo
    from spanflow.api import load_pipeline
    from spanflow.demo.cluster import DEMO_TOPOLOGY

    from_file = load_pipeline(ROOT / "examples" / "cluster" / "factory_monitoring.yaml")
    from_python = demo.factory_monitoring().spec()
    assert {s.id: s for s in from_file.steps} == {s.id: s for s in from_python.steps}
    assert from_file.model_dump(exclude={"steps"}) == from_python.model_dump(exclude={"steps"})
    example = load_topology_text((ROOT / "examples" / "cluster" / "topology.yaml").read_text())
    embedded = load_topology_text(DEMO_TOPOLOGY)
    assert example.model_dump(exclude={"name"}) == embedded.model_dump(exclude={"name"})


def test_planner_page_shows_what_spanflow_plan_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    (shown,) = blocks("planner.md", "text explain")
    argv = [
        "plan",
        "examples/cluster/factory_monitoring.yaml",
        "-t",
        "examples/cluster/topology.yaml",
        "--explain",
        "--latency-budget",
        "5s",
    ]
    result = CliRunner().invoke(app, argv, terminal_width=250)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == shown.strip()


def test_spanflow_plan_refuses_a_budget_it_cannot_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    argv = [
        "plan",
        "examples/cluster/factory_monitoring.yaml",
        "-t",
        "examples/cluster/topology.yaml",
    ]
    result = CliRunner().invoke(app, [*argv, "--latency-budget", "2430ms"], terminal_width=250)
    assert result.exit_code == 2
    (text,) = [b for b in blocks("planner.md", "text") if "2430 ms" in b]
    assert text.strip().splitlines()[-1] in " ".join(result.output.split())


def test_ml_examples_load_and_run() -> None:
    (text,) = blocks("ml.md", "yaml ml")
    spec = load_pipeline_text(text, "ml.md")
    assert spec.step("detect").type_name == "detect_anomalies"
    for body in blocks("ml.md", "python run"):
        exec(compile(body, "ml.md", "exec"), {})


def test_pattern_examples_load_and_run() -> None:
    (text,) = blocks("patterns.md", "yaml patterns")
    spec = load_pipeline_text(text, "patterns.md")
    step = spec.step("overheat")
    assert [s.name for s in step.pattern.stages] == ["hot", "drop"]  # type: ignore[attr-defined]
    for body in blocks("patterns.md", "python run"):
        exec(compile(body, "patterns.md", "exec"), {})
    first = FENCE.findall((DOCS / "patterns.md").read_text())[0][1]
    exec(compile(first, "patterns.md", "exec"), {})  # the opening example builds


def test_realtime_examples_load_run_and_fail_as_shown() -> None:
    (text,) = blocks("realtime.md", "yaml realtime")
    spec = load_pipeline_text(text, "realtime.md")
    assert [spec.mode_of(s) for s in spec.sinks()] == ["realtime"]
    for body in blocks("realtime.md", "python run"):
        exec(compile(body, "realtime.md", "exec"), {})
    (bad,) = blocks("realtime.md", "yaml ineligible")
    (shown,) = blocks("realtime.md", "text ineligible")
    with pytest.raises(Exception) as caught:
        load_pipeline_text(bad, "bad.yaml")
    assert str(caught.value).strip() == shown.strip()


def test_connector_examples_load_and_say_the_same() -> None:
    (text,) = blocks("connectors.md", "yaml pipeline")
    spec = load_pipeline_text(text, "connectors.md")
    (body,) = blocks("connectors.md", "python run")
    scope: dict[str, object] = {}
    exec(compile(body, "connectors.md", "exec"), scope)
    built = scope["flow"].spec()  # type: ignore[attr-defined]
    ends = [(s.options, s.key) for s in spec.sources()], [s.options for s in spec.sinks()]
    assert ends == (
        [(s.options, s.key) for s in built.sources()],
        [s.options for s in built.sinks()],
    )
    table = (DOCS / "connectors.md").read_text()
    from spanflow.spec.connectors import connectors

    for role in ("source", "sink"):
        for name in connectors(role):
            assert f"| `{name}`" in table, f"{role} connector {name} is missing from the table"


def test_the_standby_example_loads_and_its_table_names_the_refused_connectors() -> None:
    from spanflow.control.pipelines import with_standby
    from spanflow.plan.fragments import fragments_of
    from spanflow.spec.connectors import connectors

    (text,) = blocks("cluster.md", "yaml standby")
    spec = load_pipeline_text(text, "cluster.md")
    assert spec.standby == 1
    ids = [f.id for f in with_standby(fragments_of(spec), spec.standby)]
    assert ids == ["line-alerts.f0", "line-alerts.f0.r1"]
    page = (DOCS / "cluster.md").read_text()
    refused_row = next(line for line in page.splitlines() if "| refused:" in line)
    named = set(re.findall(r"`([a-z0-9]+)`", refused_row.split("|")[1]))
    refused = {
        name
        for role in ("source", "sink")
        for name, connector in connectors(role).items()  # type: ignore[arg-type]
        if connector.standby is None
    }
    assert named == refused
