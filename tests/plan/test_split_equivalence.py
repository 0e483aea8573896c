"""A pipeline split into site fragments + a global fragment gives the results of the same
pipeline run unsplit on one node (real Spark, real JetStream)."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

import pytest

import spanflow as sf
from spanflow.plan.fragments import compile_fragments
from spanflow.spark.runner import PipelineRunner
from spanflow.spec.topology import Topology
from tests.helpers import publish, read_records, wait_for

BASE = 1_800_000_000  # epoch seconds, a multiple of 10
FAR = BASE + 10_000  # flush readings: past every real window
SITES = ("a", "b")
SCHEMA = {"device": "string", "reading": "string", "ts": "timestamp", "temperature": "double"}


def _site_readings(site: str, n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append(
            {
                "device": f"{site}-d{rng.randrange(3)}",
                # every reading is sent by both sites' gateways now and then
                "reading": f"r{i // 2}" if i % 7 == 0 else f"{site}-r{i}",
                "ts": BASE + i * 0.5 + rng.uniform(-2.0, 2.0),
                "temperature": round(rng.uniform(10, 40), 2),
            }
        )
    # Two flushes per site: the first closes every real window at the site, the second
    # closes the first's window, so each site's partials move past every real window.
    for k, at in enumerate((FAR, FAR + 10_000)):
        out.append(
            {"device": f"{site}-flush", "reading": f"{site}-f{k}", "ts": at, "temperature": 20.0}
        )
    return out


def _pipeline(name: str, suffix: str, uid: str) -> sf.Flow:
    p = sf.Pipeline(name, trigger="0.5s")
    readings = p.source(
        f"IN_{uid}",
        subjects=[f"in{uid}.>"],
        schema=SCHEMA,
        key="device",
        event_time="ts",
        max_out_of_orderness="5s",
        id="readings",
    )
    per_device = (
        readings.key_by("device", id="by_device")
        .window(tumbling="10s")
        .aggregate(n="count", hi="max(temperature)", mean="avg(temperature)", id="per_device")
    )
    alerts = per_device.filter("hi > 38", id="hot").sink_jetstream(
        f"ALERTS{suffix}_{uid}", subject=f"alerts{suffix}{uid}.{{device}}", id="alerts_out"
    )
    overall = (
        readings.filter("temperature >= 12", id="valid")
        .map(scope="'all'", id="tag")
        .key_by("scope", id="by_scope")
        .window(tumbling="10s")
        .aggregate(
            n="count",
            total="sum(temperature)",
            lo="min(temperature)",
            hi="max(temperature)",
            mean="avg(temperature)",
            id="overall",
        )
        .sink_jetstream(f"OVERALL{suffix}_{uid}", subject=f"overall{suffix}{uid}", id="overall_out")
    )
    once = readings.deduplicate("reading", within="30s", id="once").sink_jetstream(
        f"ONCE{suffix}_{uid}", subject=f"once{suffix}{uid}", id="once_out"
    )
    # A window over the per-device windows (chained), split across the sites.
    chained = (
        per_device.map(scope="'all'", id="tag2")
        .key_by("scope", id="by_scope2")
        .window(tumbling="10s")
        .aggregate(devices="count", readings="sum(n)", hottest="max(hi)", id="chained")
        .sink_jetstream(f"CHAINED{suffix}_{uid}", subject=f"chained{suffix}{uid}", id="chained_out")
    )
    return alerts.merge(overall, once, chained)


def _topology(uid: str) -> Topology:
    return Topology.model_validate(
        {
            "sites": [{"name": "a"}, {"name": "b"}, {"name": "cloud", "kind": "cloud"}],
            "nodes": [{"name": f"e{s}", "site": s, "streams": [_hosted(uid, s)]} for s in SITES]
            + [{"name": "c1", "site": "cloud"}],
            "links": [{"between": [s, "cloud"], "latency": "30ms"} for s in SITES],
        }
    )


def _hosted(uid: str, site: str) -> dict[str, Any]:
    return {"name": f"IN_{uid}", "subjects": [f"in{uid}.{site}.>"]}


def _real_windows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drops the flush readings' windows."""
    return [r for r in records if datetime.fromisoformat(r["window_start"]).timestamp() < FAR]


def _oracle(data: list[dict[str, Any]]) -> dict[str, int]:
    """How many records each sink must hold (real windows only)."""
    real = [r for r in data if r["ts"] < FAR]
    per_device: dict[tuple[str, int], float] = {}
    for r in real:
        k = (r["device"], int(r["ts"] // 10))
        per_device[k] = max(per_device.get(k, -1e9), r["temperature"])
    return {
        "ALERTS": sum(1 for hi in per_device.values() if hi > 38),
        "OVERALL": len({int(r["ts"] // 10) for r in real if r["temperature"] >= 12}),
        "ONCE": len({r["reading"] for r in data}),
        "CHAINED": len({int(r["ts"] // 10) for r in real}),
    }


def _canonical(records: list[dict[str, Any]]) -> list[tuple]:
    """Order-insensitive, with float sums rounded (the split adds them in another order)."""
    return sorted(
        tuple(sorted((k, round(v, 6) if isinstance(v, float) else v) for k, v in r.items()))
        for r in records
    )


def _run(spark, nats_url, checkpoints, runs, until) -> None:
    runners = [
        PipelineRunner(spark, spec, nats_url=nats_url, checkpoint_dir=checkpoints, plan=plan)
        for spec, plan in runs
    ]
    try:
        for r in runners:
            r.start()

        def done() -> bool:
            # As a node agent does: a query that failed (on 2 cores, a dozen queries
            # starting at once can time out a Python worker) restarts from its checkpoint.
            for r in runners:
                r.supervise()
            return until()

        wait_for(done, timeout=300)
        for r in runners:
            r.await_idle()
    finally:
        for r in runners:
            r.stop()


@pytest.mark.slow
def test_split_fragments_equal_the_unsplit_pipeline(spark, nats_url, checkpoints, uid):
    data = []
    for n, site in enumerate(SITES):
        readings = _site_readings(site, 120, seed=n)
        publish(nats_url, f"IN_{uid}", f"in{uid}.{site}.r", readings)
        data += readings
    oracle = _oracle(data)

    def held(suffix: str) -> dict[str, list[dict[str, Any]]]:
        got = {k: read_records(nats_url, f"{k}{suffix}_{uid}") for k in oracle}
        return {k: v if k == "ONCE" else _real_windows(v) for k, v in got.items()}

    def complete(suffix: str) -> bool:
        got = held(suffix)
        return all(len(got[k]) >= n for k, n in oracle.items())

    unsplit = _pipeline(f"eq-{uid}-u", "U", uid).spec()
    _run(spark, nats_url, checkpoints / "unsplit", [(unsplit, None)], lambda: complete("U"))
    expected = held("U")
    assert {k: len(v) for k, v in expected.items()} == oracle
    assert oracle["ALERTS"] > 0 and oracle["OVERALL"] >= 6
    assert sum(r["readings"] for r in expected["CHAINED"]) == sum(1 for r in data if r["ts"] < FAR)

    compiled = compile_fragments(_pipeline(f"eq-{uid}-s", "S", uid).spec(), _topology(uid))
    assert [f.id for f in compiled.fragments] == [
        f"eq-{uid}-s.at-a",
        f"eq-{uid}-s.at-b",
        f"eq-{uid}-s.global",
    ]

    _run(
        spark,
        nats_url,
        checkpoints / "split",
        [(f.spec, f.plan) for f in compiled.fragments],
        lambda: complete("S"),
    )
    got = held("S")
    for kind in oracle:
        assert _canonical(got[kind]) == _canonical(expected[kind]), kind
