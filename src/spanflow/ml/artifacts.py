"""Model files: checked when pushed, verified and loaded where they score.

Three formats:

* ``normal``: what ``spanflow detector fit`` fits, a ``multivariate`` detector's normal
  per key (:class:`spanflow.ml.normal.Normals`): plain JSON, checked field by field.
* ``onnx``: any ONNX model with one tensor input of shape ``[batch, n]`` (e.g. a
  scikit-learn model converted with ``skl2onnx``); its ``n`` input columns are the
  model's ``features``, in order. Run with onnxruntime: no code in the file runs.
* ``river``: a River model saved with ``pickle``. River has no other format, and
  unpickling runs whatever code the file names: a River model file is *code*. The
  registry accepts it only from an authenticated user (the CLI, or the REST API with
  its token), exactly like a pipeline that names a Python class; the pickle is never
  read from stream data, and before loading it spanflow checks that its sha256 is
  the one recorded when it was pushed, so a file changed in the store is refused.
  Node agents push what online learning learnt, so a stolen agent bundle could push
  a file too: it is read by :mod:`spanflow.ml.river_pickle`, which resolves River's
  own classes and a few containers, never ``os.system`` or ``eval``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spanflow.errors import InvalidModel
from spanflow.ml import river_pickle
from spanflow.ml.registry import Format, ModelVersion


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def describe(data: bytes, format: Format, features: Sequence[str]) -> dict[str, str]:
    """The input schema of a model file (InvalidModel when it is not a model of
    ``format`` reading ``features``)."""
    if not features:
        raise InvalidModel("name the model's input fields (features), in its order")
    if len(set(features)) != len(features):
        raise InvalidModel(f"features repeat a name: {list(features)}")
    if format == "onnx":
        session = _onnx_session(data)
        (width,) = _onnx_input_width(session)
        if width is not None and width != len(features):
            raise InvalidModel(
                f"the ONNX model reads {width} columns but {len(features)} features were "
                f"named: {list(features)}"
            )
    elif format == "normal":
        fitted = _normals(data)
        if fitted.fields != tuple(features):
            raise InvalidModel(
                f"the normals are of fields {list(fitted.fields)}, not {list(features)}"
            )
    elif not data.startswith(b"\x80"):
        raise InvalidModel("a river model is a pickle file (pickle.dump(model, f))")
    return dict.fromkeys(features, "double")


def _normals(data: bytes) -> Any:
    from spanflow.ml.normal import Normals

    try:
        return Normals.from_bytes(data)
    except ValueError as exc:
        raise InvalidModel(f"not a normal model: {exc}") from None


def _onnx_session(data: bytes) -> Any:
    import onnxruntime as ort

    try:
        return ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own, undocumented types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidModel(f"not a valid ONNX model: {first[:300]}") from None


def _onnx_input_width(session: Any) -> tuple[int | None]:
    inputs = session.get_inputs()
    if len(inputs) != 1 or len(inputs[0].shape) != 2:
        shapes = [(i.name, i.shape) for i in inputs]
        raise InvalidModel(
            f"the ONNX model must take one input of shape [batch, n]; it takes {shapes}"
        )
    width = inputs[0].shape[1]
    return (width if isinstance(width, int) else None,)


@dataclass
class LoadedModel:
    """A model version ready to score records (see :func:`load`)."""

    version: int
    features: tuple[str, ...]
    format: Format
    model: Any

    def predict(self, records: Sequence[Mapping[str, Any]]) -> list[tuple[Any, float | None]]:
        """(prediction, probability of it or None) for each record."""
        if self.format == "onnx":
            return self._predict_onnx(records)
        out: list[tuple[Any, float | None]] = []
        for record in records:
            x = {f: float(record[f]) for f in self.features if record.get(f) is not None}
            prediction = self.model.predict_one(x)
            out.append((prediction, self._probability(x, prediction)))
        return out

    def _probability(self, x: dict[str, float], prediction: Any) -> float | None:
        """A River classifier's probability of its prediction (None for regressors; a
        River pipeline has ``predict_proba_one`` whatever its last step is)."""
        if prediction is None or isinstance(prediction, float):
            return None
        try:
            return float(self.model.predict_proba_one(x).get(prediction, 0.0))
        except (AttributeError, NotImplementedError):
            return None

    def _predict_onnx(self, records: Sequence[Mapping[str, Any]]) -> list[tuple[Any, float | None]]:
        import numpy as np

        if not records:
            return []
        matrix = np.array(
            [[_number(r.get(f)) for f in self.features] for r in records], dtype=np.float32
        )
        labels, probabilities = self.predict_matrix(matrix)
        return list(zip(labels, probabilities, strict=True))

    def predict_matrix(self, matrix: Any) -> tuple[list[Any], list[float | None]]:
        """An ONNX model's labels and their probabilities for a [rows, features]
        float32 matrix (NaN where a value is missing): one onnxruntime call."""
        session = self.model
        outputs = session.run(None, {session.get_inputs()[0].name: matrix})
        rows = matrix.shape[0]
        labels = outputs[0].reshape(rows, -1)[:, 0].tolist()
        probabilities: list[float | None] = [None] * rows
        if len(outputs) > 1:
            probabilities = _probabilities(outputs[1], labels)
        return labels, probabilities


def _number(value: Any) -> float:
    """A feature value for a tensor: missing values are NaN."""
    return float("nan") if value is None else float(value)


def _probabilities(raw: Any, labels: list[Any]) -> list[float | None]:
    """The probability of each predicted label: skl2onnx gives a list of dicts (zipmap)
    or a [batch, classes] array."""
    out: list[float | None] = []
    for i, label in enumerate(labels):
        row = raw[i]
        p = float(row.get(label, 0.0)) if isinstance(row, dict) else float(max(row))
        out.append(None if math.isnan(p) else p)  # a missing input gives no probability
    return out


def load(version: ModelVersion, data: bytes) -> LoadedModel:
    """Verify a model file against its registry entry and load it."""
    digest = sha256_of(data)
    if digest != version.sha256:
        raise InvalidModel(
            f"model file of version {version.version} has sha256 {digest[:12]}…, the registry "
            f"recorded {version.sha256[:12]}…: refusing to load it"
        )
    features = tuple(version.inputs)
    if version.format == "onnx":
        return LoadedModel(version.version, features, "onnx", _onnx_session(data))
    if version.format == "normal":  # plain data: a detector's normal per key
        return LoadedModel(version.version, features, "normal", _normals(data))
    try:
        model = river_pickle.loads(data)  # only River's own code: see river_pickle
    except Exception as exc:
        raise InvalidModel(f"cannot load the river model: {exc}") from None
    if not hasattr(model, "predict_one"):
        raise InvalidModel(f"the river model is a {type(model).__name__}, which cannot predict")
    return LoadedModel(version.version, features, "river", model)
