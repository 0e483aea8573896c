"""Secrets stay out of specs: a submission holding a connector password is refused
(the spec would be stored in the control log, shown by the API and handed to Spark),
references to environment variables are taken, and a spec stored before this rule is
shown with its secrets masked."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from spanflow.api.topology_loader import load_topology_text
from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.control.coordinator import Coordinator, CoordinatorSettings
from spanflow.nats.server import EmbeddedNats
from spanflow.server.app import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

TOKEN = "operator-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PIPELINE = """\
name: {name}
sources:
  - {{id: src, type: kafka, topic: t, bootstrap: "k:9092", {config}, schema: {{x: long}},
     to: [out]}}
sinks:
  - {{id: out, type: webhook, url: "https://alerts.example/h", {headers}}}
"""


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    with EmbeddedNats(tmp_path / "nats") as server:
        settings = CoordinatorSettings(
            nats_url=server.url,
            state_dir=str(tmp_path / "state"),
            token=TOKEN,
            public_reads=True,
            topology=load_topology_text("sites: [{name: cloud, kind: cloud}]\nnodes: []"),
        )
        with TestClient(create_app(Coordinator(settings))) as client:
            yield client


def test_a_password_in_a_submission_is_refused_and_a_reference_is_taken(api: TestClient) -> None:
    inline = PIPELINE.format(
        name="leaky",
        config='config: {"sasl.username": "u", "sasl.password": "hunter2"}',
        headers='headers: {Authorization: "Bearer s3cr3t"}',
    )
    refused = api.post("/api/v1/pipelines", json={"yaml": inline}, headers=AUTH)
    assert refused.status_code == 422 and refused.json()["code"] == "inline_secret"
    detail = refused.json()["detail"]
    assert "src: config.sasl.password" in detail and "out: headers.Authorization" in detail
    assert "hunter2" not in refused.text and "s3cr3t" not in refused.text
    assert api.get("/api/v1/pipelines/leaky").status_code == 404

    by_reference = PIPELINE.format(
        name="tidy",
        config='config: {"sasl.username": "u"}, config_env: {"sasl.password": KAFKA_PW}',
        headers="headers_env: {Authorization: HOOK_AUTH}",
    )
    taken = api.post("/api/v1/pipelines", json={"yaml": by_reference}, headers=AUTH)
    assert taken.status_code == 201, taken.text
    shown = api.get("/api/v1/pipelines/tidy/spec").json()  # a public read
    source = next(s for s in shown["steps"] if s["id"] == "src")
    assert source["options"]["config_env"] == {"sasl.password": "KAFKA_PW"}


def test_a_spec_stored_before_the_rule_is_shown_masked() -> None:
    old = load_pipeline_text(
        PIPELINE.format(
            name="old",
            config='config: {"sasl.password": "hunter2"}',
            headers='headers: {X-Api-Key: "k3y", X-Plain: "fine"}',
        )
    )
    assert old.inline_secrets()  # what a submission today would refuse
    shown = str(old.secret_free())
    assert "hunter2" not in shown and "k3y" not in shown and "fine" in shown
