"""Connector declarations and source/sink options, without any server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import spanflow as sf
from spanflow.errors import SpecError
from spanflow.spec.connectors import Connector, NoOptions, connectors, lookup
from spanflow.spec.connectors.kafka import KafkaSinkOptions
from spanflow.spec.connectors.webhook import WebhookSinkOptions
from spanflow.spec.steps.io import SinkStep, SourceStep

MAP = {"type": "map", "values": "long"}
AVRO = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"},
                                                   {"name": "m", "type": MAP}]}  # fmt: skip


def test_every_connector_declares_how_it_is_exactly_once():
    for role in ("source", "sink"):
        for name, connector in connectors(role).items():
            assert connector.name == name and connector.role == role
            assert len(connector.exactly_once) > 20
    assert set(connectors("sink")) >= {"jetstream", "kafka", "postgres", "s3", "mongodb"}


def test_an_unknown_connector_names_the_known_ones():
    with pytest.raises(SpecError, match=r"unknown sink type 'kafak' \(known: .*kafka"):
        lookup("sink", "kafak")
    with pytest.raises(ValueError, match="unknown source type 'kafak'"):
        SourceStep(id="s", connector="kafak", schema={"a": "long"})


def test_a_missing_client_library_says_which_extra_to_install():
    connector = Connector("x", "sink", NoOptions, "n/a", module="no_such_lib_here", extra="x")
    assert connector.missing_library() == (
        "the x sink needs the 'no_such_lib_here' library: pip install 'spanflow[x]'"
    )


def test_secrets_in_kafka_and_webhook_options_are_found_and_masked():
    inline = KafkaSinkOptions(topic="t", bootstrap="b:9092", config={"sasl.password": "pw"})
    assert inline.secret_free()["config"] == {"sasl.password": "***"}
    assert inline.inline_secrets() == ["config.sasl.password (give it in config_env)"]
    options = KafkaSinkOptions(
        topic="t",
        bootstrap="b:9092",
        config={"sasl.username": "u"},
        config_env={"sasl.password": "KAFKA_PASSWORD"},
    )
    assert options.inline_secrets() == []
    with pytest.raises(ValidationError, match="environment variable"):
        KafkaSinkOptions(topic="t", bootstrap="b:9092", config_env={"sasl.password": "p w"})
    hook = WebhookSinkOptions(url="https://x", headers={"Authorization": "Bearer abc"})
    assert hook.inline_secrets() == ["headers.Authorization (give it in headers_env)"]
    assert (
        WebhookSinkOptions(url="https://x", headers_env={"Authorization": "H"}).inline_secrets()
        == []
    )


def test_options_are_typed_per_connector_and_round_trip_through_json():
    flow = (
        sf.Pipeline("p")
        .source_kafka("in", bootstrap="b:9092", schema={"a": "long"})
        .sink_postgres("t", dsn="postgresql://u@h/db", key="a")
    )
    spec = flow.spec()
    assert type(spec).from_json(spec.to_json()) == spec
    sink = spec.sinks()[0]
    assert isinstance(sink, SinkStep) and sink.options.key == ("a",)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="JetStream settings"):
        SourceStep(id="s", connector="kafka", stream="S", schema={"a": "long"},
                   options={"topic": "t", "bootstrap": "b:1"})  # fmt: skip


def test_an_avro_source_takes_its_fields_from_the_record_or_says_what_is_wrong():
    with pytest.raises(ValueError, match=r"field 'm': type .* has no spanflow counterpart"):
        SourceStep(id="s", stream="S", format="avro", avro_schema=AVRO)
    step = SourceStep(id="s", stream="S", format="avro", avro_schema=AVRO, schema={"a": "long"})
    assert step.schema_ == {"a": "long"}
    with pytest.raises(ValueError, match=r"schema fields \['b'\] are not fields"):
        SourceStep(id="s", stream="S", format="avro", avro_schema=AVRO, schema={"b": "long"})
    with pytest.raises(ValueError, match="format avro and avro_schema go together"):
        SourceStep(id="s", stream="S", format="avro", schema={"a": "long"})
