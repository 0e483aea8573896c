"""River model files are read without letting them name arbitrary code: real River
models of many kinds load and predict as before; files a forger makes (the payloads
every pickle exploit uses) are refused before anything in them runs."""

from __future__ import annotations

import os
import pickle
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
from river import anomaly, forest, linear_model, naive_bayes, optim, preprocessing, tree

from spanflow.errors import InvalidModel
from spanflow.ml import river_pickle


def _trained(model: Any, kind: str) -> Any:
    rng = random.Random(3)
    for _ in range(300):
        x = {"a": rng.random(), "b": rng.random()}
        if kind == "anomaly":
            model.learn_one(x)
        elif kind == "regression":
            model.learn_one(x, 2 * x["a"] + x["b"])
        else:
            model.learn_one(x, x["a"] > 0.5)
    return model


MODELS = {
    "half-space trees": (preprocessing.MinMaxScaler() | anomaly.HalfSpaceTrees(seed=1), "anomaly"),
    "scaled linear regression": (
        preprocessing.StandardScaler() | linear_model.LinearRegression(),
        "regression",
    ),
    "logistic regression": (linear_model.LogisticRegression(optim.SGD(0.1)), "classification"),
    "Hoeffding tree": (tree.HoeffdingTreeClassifier(), "classification"),
    "adaptive tree regressor": (tree.HoeffdingAdaptiveTreeRegressor(seed=1), "regression"),
    "Gaussian naive Bayes": (naive_bayes.GaussianNB(), "classification"),
    "adaptive random forest": (forest.ARFClassifier(seed=1, n_models=3), "classification"),
    "Mondrian forest": (forest.AMFRegressor(seed=1, n_estimators=3), "regression"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_river_models_load_and_answer_as_before(name: str) -> None:
    model, kind = MODELS[name]
    model = _trained(model, kind)
    loaded = river_pickle.loads(pickle.dumps(model))
    x = {"a": 0.3, "b": 0.9}
    if kind == "anomaly":
        assert loaded.score_one(x) == model.score_one(x)
    else:
        assert loaded.predict_one(x) == model.predict_one(x)


class _Reduce:
    """An object whose pickle calls ``call(*args)`` when loaded."""

    def __init__(self, call: Any, *args: Any) -> None:
        self.call, self.args = call, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.call, self.args


def test_files_naming_code_outside_river_are_refused_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payloads = {
        "os.system": _Reduce(os.system, f"touch {marker}"),
        "subprocess.Popen": _Reduce(subprocess.Popen, ["touch", str(marker)]),
        "builtins.eval": _Reduce(eval, f"open({str(marker)!r}, 'w')"),
        "builtins.exec": _Reduce(exec, f"open({str(marker)!r}, 'w')"),
        "builtins.open": _Reduce(open, str(marker), "w"),
        "River's file cache": _Reduce(__import__("river.stream", fromlist=["Cache"]).Cache),
    }
    files = {what: pickle.dumps(payload) for what, payload in payloads.items()}
    # globals River's modules merely import: a module, os's own functions
    files["a module River imports"] = b"criver.anomaly.hst\nmath\n."
    files["os through River"] = b"criver.utils\nos\n."
    for what, data in files.items():
        with pytest.raises(InvalidModel):
            river_pickle.loads(data)
        assert not marker.exists(), what


def test_getattr_reaches_no_dunder() -> None:
    """River pickles bound methods with ``builtins.getattr``: it is allowed, but only
    for plain names, so a River class's ``__init__.__globals__`` (its module's ``os``,
    say) cannot be reached."""
    method = pickle.dumps(_Reduce(getattr, naive_bayes.GaussianNB(), "learn_one"))
    assert callable(river_pickle.loads(method))
    for names in (("__init__", "__globals__"), ("__class__",), ("__reduce_ex__",)):
        chain = pickle.dumps(_Reduce(getattr, anomaly.HalfSpaceTrees, names[0]))
        with pytest.raises(InvalidModel, match="refused"):
            river_pickle.loads(chain)
