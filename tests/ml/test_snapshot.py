"""Models kept as keyed state: a snapshot restored onto a fresh template continues
exactly as the original would have, and a snapshot can never run code."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from river import anomaly, linear_model, naive_bayes, preprocessing, stats, tree

from spanflow.ml.scaling import UnitScaler
from spanflow.ml.snapshot import SnapshotError, dump, restore


def _data(n: int) -> list[tuple[dict[str, float], bool]]:
    rng = random.Random(7)
    return [({"a": rng.gauss(0, 1), "b": rng.random() * 10}, rng.random() > 0.5) for _ in range(n)]


def _score(m: Any, x: dict[str, float], y: bool) -> float:
    s = m.score_one(x)
    m.learn_one(x)
    return s


def _classify(m: Any, x: dict[str, float], y: bool) -> Any:
    p = m.predict_proba_one(x)
    m.learn_one(x, y)
    return p


def _regress(m: Any, x: dict[str, float], y: bool) -> Any:
    p = m.predict_one(x)
    m.learn_one(x, x["b"] * 2 + x["a"])
    return p


MODELS: dict[str, tuple[Callable[[], Any], Callable[..., Any]]] = {
    "hst": (lambda: preprocessing.MinMaxScaler() | anomaly.HalfSpaceTrees(seed=42), _score),
    "hst-unit": (lambda: UnitScaler() | anomaly.HalfSpaceTrees(seed=3), _score),
    "hst-unseeded": (lambda: anomaly.HalfSpaceTrees(n_trees=3, height=4), _score),
    "one-class-svm": (lambda: preprocessing.StandardScaler() | anomaly.OneClassSVM(), _score),
    "lof": (lambda: anomaly.LocalOutlierFactor(n_neighbors=5), _score),
    "loda": (lambda: anomaly.LODA(seed=1), _score),
    "logistic": (
        lambda: preprocessing.StandardScaler() | linear_model.LogisticRegression(),
        _classify,
    ),
    "hoeffding-tree": (lambda: tree.HoeffdingTreeClassifier(grace_period=20), _classify),
    "gaussian-nb": (lambda: naive_bayes.GaussianNB(), _classify),
    "linear": (lambda: preprocessing.StandardScaler() | linear_model.LinearRegression(), _regress),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_restored_model_continues_exactly_like_the_original(name):
    make, step = MODELS[name]
    data = _data(500)
    original = make()
    for x, y in data[:300]:
        step(original, x, y)
    copy = restore(dump(original), make())
    assert [step(copy, x, y) for x, y in data[300:]] == [
        step(original, x, y) for x, y in data[300:]
    ]


def test_a_seeded_half_space_trees_snapshot_holds_masses_not_trees():
    make, step = MODELS["hst"]
    model = make()
    for x, y in _data(300):
        step(model, x, y)
    assert len(dump(model)) < len(dump(MODELS["hst-unseeded"][0]())) * 100
    assert '"$hst"' in dump(model)


def test_a_snapshot_naming_a_class_outside_river_is_refused():
    evil = {"$o": "os:system", "id": 0, "a": {}}
    with pytest.raises(SnapshotError, match="not of a trusted module"):
        restore(json.dumps(evil), None)
    evil = {"$x": "subprocess:Popen", "id": 0, "args": {"$t": [["true"]]}, "state": None}
    with pytest.raises(SnapshotError, match="not of a trusted module"):
        restore(json.dumps(evil), None)


def test_a_model_with_no_plain_data_form_is_refused_when_dumped():
    q = stats.Quantile(0.5)  # a Rust structure without a plain-data form
    q.update(1.0)
    with pytest.raises(SnapshotError, match="cannot be kept as state"):
        dump(q)


def test_non_finite_numbers_and_containers_round_trip():
    from collections import Counter, OrderedDict, defaultdict, deque

    value = {
        "inf": float("inf"),
        "tuple": (1, "a", None),
        "deque": deque([1.5, 2.5], maxlen=3),
        "counter": Counter({"x": 2}),
        "ordered": OrderedDict([((1, 2), [3])]),
        "dd": defaultdict(list, {"k": [1]}),
        "set": frozenset({1, 2}),
    }
    back = restore(dump(value), None)
    assert back == value
    assert back["deque"].maxlen == 3 and back["dd"].default_factory is list
