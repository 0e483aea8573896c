"""The model comparison (a canary's split, a shadow's agreement) from what score steps
write: a coordinator on a real NATS server subscribes to the sinks after a pipeline's
score step and tallies the records published there."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.nats.server import EmbeddedNats
from spanflow.server.app import create_app
from spanflow.server.feed import ScoreFeed, Tally, score_feeds_of
from tests.cluster.test_coordinator_api import AUTH, coordinator
from tests.helpers import publish, wait_for
from tests.ml.test_model_registry import _onnx_model

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

PIPELINE = """\
name: scoring
sources:
  - id: src
    stream: IN_S
    subjects: ["in.>"]
    schema: {device: string, t: double, v: double}
    key: device
    to: [s]
processors:
  - {id: s, type: score, model: pump, prediction_type: boolean, shadow: true, to: [keep]}
  - {id: keep, type: filter, where: "true", to: [out]}
sinks:
  - {id: out, type: jetstream, stream: OUT_S, subject: "scored.{device}"}
"""


def test_sinks_after_a_score_step_feed_the_comparison() -> None:
    spec = load_pipeline_text(PIPELINE, "p.yaml")
    assert score_feeds_of(spec) == [ScoreFeed("out", "scored.*", "pump")]


def test_a_tally_splits_by_version_and_measures_the_shadows_agreement() -> None:
    tally = Tally()
    for i in range(10):  # production v2 and a shadow v3 that disagrees on every fifth
        tally.add({"prediction": i % 2 == 0, "model_version": 2, "shadow_version": 3,
                   "shadow_prediction": (i % 2 == 0) != (i % 5 == 0)})  # fmt: skip
    tally.add({"prediction": 0.5, "model_version": 3})  # a canary record, no shadow
    c = tally.comparison("pump")
    assert c.records == 11
    assert c.versions["2"].records == 10 and c.versions["2"].mean_prediction == 0.5
    assert c.versions["3"].records == 1 and c.versions["3"].mean_prediction == 0.5
    assert c.shadow is not None and c.shadow.versions == [3]
    assert (c.shadow.compared, c.shadow.agreement) == (10, 0.8)
    assert c.shadow.mean_abs_difference == 0.2


def test_the_comparison_endpoint_and_metrics_follow_published_scores(tmp_path: Path) -> None:
    data = _onnx_model(tmp_path / "m.onnx").read_bytes()
    with (
        EmbeddedNats(tmp_path / "nats") as server,
        TestClient(create_app(coordinator(server, tmp_path))) as api,
    ):
        push = "/api/v1/models/pump/versions?format=onnx&features=t,v"
        for _ in range(2):
            assert api.post(push, content=data, headers=AUTH).status_code == 201
        r = api.post("/api/v1/pipelines", json={"yaml": PIPELINE}, headers=AUTH)
        assert r.status_code == 201, r.text
        empty = api.get("/api/v1/models/pump/comparison", headers=AUTH).json()
        assert empty["records"] == 0 and empty["shadow"] is None
        # until the feed has subscribed: probes from a version of their own
        probe = [{"device": "d0", "prediction": False, "model_version": 99}]

        def subscribed() -> bool:
            publish(server.url, "OUT_S", "scored.d0", probe)
            return bool(api.get("/api/v1/models/pump/comparison", headers=AUTH).json()["records"])

        wait_for(subscribed, timeout=30, interval=1)
        # what the score step's sink would publish: production v1, a shadow v2
        rows = [
            {"device": "d1", "prediction": True, "model_version": 1,
             "shadow_prediction": i != 0, "shadow_version": 2}
            for i in range(4)
        ]  # fmt: skip
        publish(server.url, "OUT_S", "scored.d1", rows)

        def comparison() -> dict[str, Any]:
            return dict(api.get("/api/v1/models/pump/comparison", headers=AUTH).json())

        wait_for(lambda: "1" in comparison()["versions"], timeout=10)
        wait_for(lambda: comparison()["versions"]["1"]["records"] == 4, timeout=10)
        got = comparison()
        assert got["versions"]["1"]["mean_prediction"] == 1.0
        assert got["versions"]["99"]["mean_prediction"] == 0.0
        assert got["shadow"] == {
            "compared": 4, "agreement": 0.75, "mean_abs_difference": 0.25, "versions": [2]
        }  # fmt: skip
        text = api.get("/metrics", headers=AUTH).text
        assert 'spanflow_model_predictions_total{model="pump",version="1"} 4.0' in text
        assert 'spanflow_model_shadow_agreement_ratio{model="pump"} 0.75' in text
