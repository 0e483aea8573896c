from __future__ import annotations

import pytest

import spanflow as sf
from spanflow.errors import SpecError

SCHEMA = {"device": "string", "t": "double", "ts": "timestamp"}


def double_t(record):
    return {**record, "t": record["t"] * 2}


def test_each_call_returns_a_new_stream_and_branches_do_not_interfere():
    p = sf.Pipeline("p")
    base = p.source("S", schema=SCHEMA)
    a = base.filter("t > 1")
    b = base.select("device")
    assert base.head == "s" and a.head != b.head
    flow = a.sink_console(id="out_a").merge(b.sink_console(id="out_b"))
    spec = flow.spec()
    assert {s.id for s in spec.steps} == {"s", a.head, b.head, "out_a", "out_b"}
    assert spec.step(a.head).inputs == ("s",) and spec.step(b.head).inputs == ("s",)


def test_module_functions_are_referenced_by_import_path():
    flow = sf.Pipeline("p").source("S", schema=SCHEMA).map(double_t, id="m").sink_console()
    assert flow.spec().step("m").function == "tests.api.test_fluent:double_t"  # type: ignore[union-attr]


def test_lambdas_stay_local_and_the_spec_still_serialises():
    flow = (
        sf.Pipeline("p")
        .source("S", schema=SCHEMA)
        .filter(lambda r: r["t"] > 0, id="f")
        .sink_console()
    )
    ref = flow.spec().step("f").function  # type: ignore[union-attr]
    assert ref == "__local__:f" and ref in flow.functions
    assert sf.PipelineSpec.from_json(flow.spec().to_json()) == flow.spec()


def test_bad_calls_name_the_step():
    s = sf.Pipeline("p").source("S", schema=SCHEMA)
    with pytest.raises(SpecError, match="exactly one of tumbling"):
        s.window(tumbling="1s", session="2s")
    with pytest.raises(SpecError, match=r"step 'w'.*slide"):
        s.window(sliding="5s", slide="10s").aggregate(n="count", id="w")
    with pytest.raises(SpecError, match="two different steps share the id"):
        s.filter("t > 1", id="x").sink_console(id="o1").merge(
            s.filter("t > 2", id="x").sink_console(id="o2")
        )
