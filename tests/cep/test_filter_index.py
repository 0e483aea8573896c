"""The start-gate index answers what calling every gate would."""

from __future__ import annotations

import math
import random

from spanflow.cep.filter_index import FilterIndex
from spanflow.spec.expressions import compile_expression

GATES = [
    "temperature > 80",
    "temperature > 85.5",
    "(temperature >= 80)",
    "temperature < 60",
    "temperature <= 60",
    "temperature > 80",  # the same bound twice
    "pressure < 2",
    "pressure >= -1",
    "temperature > 80 AND pressure < 2",  # not indexed: called
    "name > 'm'",  # a string bound: called
    None,  # no gate: always
]
VALUES = [None, 59.0, 60, 60.0, 79.9, 80, 80.0, 85.5, 99, -1, -2.5, True, "85", "x", math.nan]


def test_the_index_equals_calling_every_gate():
    gates = [compile_expression(g) if g else None for g in GATES]
    index = FilterIndex(gates)
    assert len(index.ordered) == 6 and len(index.called) == 2 and index.always == [10]
    rng = random.Random(1)
    for _ in range(3000):
        event = {
            "temperature": rng.choice(VALUES),
            "pressure": rng.choice(VALUES),
            "name": rng.choice(["a", "z", None]),
        }
        want = [i for i, g in enumerate(gates) if g is None or g.fn(event, {}) is True]
        assert index.starts(event) == want, event


def test_a_missing_field_passes_no_indexed_gate():
    index = FilterIndex([compile_expression("temperature > 1"), compile_expression("t < 5")])
    assert index.starts({}) == []
    assert index.starts({"t": 4}) == [1]
