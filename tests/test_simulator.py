"""The simulator's labelled anomaly episodes: every kind occurs, the labelled share is
about the configured rate, and each kind looks like what it claims."""

from __future__ import annotations

import orjson

from spanflow.simulator import ANOMALY_KINDS, SensorSimulator, SimulatorConfig


def _readings(n: int, rate: float) -> list[dict]:
    sim = SensorSimulator(
        SimulatorConfig(devices=5, anomaly_rate=rate, malformed_rate=0.0, seed=7, out_of_order=0)
    )
    return [orjson.loads(sim.reading(1_800_000_000 + i * 0.5)[1]) for i in range(n)]


def test_labelled_episodes_of_every_kind_at_about_the_configured_rate():
    records = _readings(40_000, 0.05)
    labels = [r["anomaly"] for r in records]
    assert set(labels) - {None} == set(ANOMALY_KINDS)
    share = sum(label is not None for label in labels) / len(labels)
    assert 0.03 < share < 0.08
    by_device: dict[str, list[dict]] = {}
    for r in records:
        by_device.setdefault(r["device"], []).append(r)
    for rows in by_device.values():
        run: list[dict] = []
        for r in [*rows, {"anomaly": None}]:
            if r["anomaly"] == "stuck":
                run.append(r)
                continue
            if run:  # a stuck episode repeats its first values
                assert len({(x["temperature"], x["vibration"]) for x in run}) == 1
                run = []
    spikes = [r for r in records if r["anomaly"] == "spike"]
    normal = [r["temperature"] for r in records if r["anomaly"] is None]
    assert min(r["temperature"] for r in spikes) > max(normal)
