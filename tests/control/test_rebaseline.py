"""Rebaselining a detector's key: the decision, its record, and what a worker reads."""

from __future__ import annotations

import pytest

from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.control import pipelines
from spanflow.control.errors import Conflict, Invalid, NotFound
from spanflow.control.requests import Submission
from spanflow.ml.rebaseline import EVERY_KEY, key_text, requested
from spanflow.testing.control import InMemoryControl

PIPELINE = """\
name: {name}
sources:
  - id: src
    stream: IN
    schema: {{site: string, pump: string, t: double, v: double}}
    key: {key}
    to: [{first}]
processors:
{steps}
sinks:
  - {{id: out, type: jetstream, stream: OUT, subject: "out"}}
"""
ONE = "  - {id: watch, type: detect_anomalies, fields: [t, v], to: [out]}"
TWO = (
    "  - {id: watch, type: detect_anomalies, fields: [t], to: [other]}\n"
    "  - {id: other, type: detect_anomalies, fields: [v], to: [out]}"
)


def control(steps: str = ONE, first: str = "watch") -> InMemoryControl:
    c = InMemoryControl()
    text = PIPELINE.format(name="p", key="pump", first=first, steps=steps)
    sub = Submission(spec=load_pipeline_text(text, "p.yaml"))
    c.decide(lambda tx: pipelines.submit(tx, sub, run_id="run-1"))
    return c


def test_a_key_is_rebaselined_in_the_log_and_generations_rise() -> None:
    c = control()
    first = c.decide(lambda tx: pipelines.rebaseline(tx, "p", None, "pump-3", by="operator"))
    second = c.decide(lambda tx: pipelines.rebaseline(tx, "p", "watch", EVERY_KEY))
    assert (first.step, first.key, first.generation, first.by) == ("watch", "pump-3", 1, "operator")
    assert (second.key, second.generation) == (EVERY_KEY, 2)
    assert c.kinds()[-2:] == ["detector-rebaselined", "detector-rebaselined"]
    gens = c.state.pipelines["p"].rebaselines["watch"]
    assert gens == {"pump-3": 1, EVERY_KEY: 2}
    # a standby replaying the log through JSON agrees
    assert c.replayed().pipelines["p"].rebaselines == c.state.pipelines["p"].rebaselines
    # every key asked after pump-3 learns afresh, pump-3 included
    assert requested(gens, "pump-3") == requested(gens, "pump-9") == 2


def test_the_key_of_a_detection_is_read_from_the_steps_key_fields() -> None:
    by_both = "  - {id: by, type: key_by, key: [site, pump], to: [watch]}\n" + ONE
    c = control(by_both, first="by")
    detection = {"site": "north", "pump": "p7", "t": 9.0, "anomaly_score": 0.99}
    done = c.decide(lambda tx: pipelines.rebaseline(tx, "p", None, None, detection))
    assert done.key == "north,p7" == key_text(("north", "p7"))
    with pytest.raises(Invalid, match="no key field"):
        c.decide(lambda tx: pipelines.rebaseline(tx, "p", None, None, {"pump": "p7"}))


@pytest.mark.parametrize(
    ("steps", "step", "key", "error", "words"),
    [
        (TWO, None, "k", Invalid, "several detectors"),
        (ONE, "nope", "k", NotFound, "no detect_anomalies step 'nope'"),
        (ONE, None, None, Invalid, "exactly one of 'key'"),
        (ONE, None, "  ", Invalid, "1 to 256 characters"),
        (ONE, None, "x" * 257, Invalid, "1 to 256 characters"),
    ],
)
def test_a_request_that_names_no_single_detector_or_key_is_refused(
    steps: str, step: str | None, key: str | None, error: type[Exception], words: str
) -> None:
    c = control(steps)
    before = len(c.log)
    with pytest.raises(error, match=words):
        c.decide(lambda tx: pipelines.rebaseline(tx, "p", step, key))
    assert len(c.log) == before  # nothing written


def test_a_pipeline_without_a_detector_or_that_ended_refuses() -> None:
    c = control("  - {id: watch, type: filter, where: 't > 1', to: [out]}")
    with pytest.raises(Invalid, match="no detect_anomalies step"):
        c.decide(lambda tx: pipelines.rebaseline(tx, "p", None, "k"))
    ended = control()
    ended.decide(lambda tx: pipelines.cancel(tx, "p"))
    with pytest.raises(Conflict, match="canceled"):
        ended.decide(lambda tx: pipelines.rebaseline(tx, "p", None, "k"))
    with pytest.raises(NotFound):
        ended.decide(lambda tx: pipelines.rebaseline(tx, "q", None, "k"))
