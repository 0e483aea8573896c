"""The ``score`` step in a Spark worker: a ``mapInArrow`` function that asks which
registry version scores this micro-batch (:mod:`spanflow.ml.scoring`) and adds its
predictions to every record."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from spanflow.ml.artifacts import LoadedModel
from spanflow.ml.scoring import Pinning, models_for_batch
from spanflow.spark.deadletter import DeadLetter, send_dead_letters

_CASTS: dict[str, Callable[[Any], Any]] = {
    "double": float,
    "long": int,
    "string": str,
    "boolean": bool,
}


@dataclass(frozen=True)
class ScoreSettings:
    url: str
    pin: Pinning
    stage: str
    shadow: bool
    canary: float | None
    canary_key: str | None
    prediction_type: str
    columns: tuple[str, ...]
    pipeline: str
    step: str


def in_canary(value: Any, share: float) -> bool:
    """Whether a key value falls in the canary's share (a stable hash, same everywhere).

    >>> sum(in_canary(f"dev-{i}", 0.1) for i in range(1000))
    125
    """
    return zlib.crc32(str(value).encode()) / 2**32 < share


def _predict_all(
    model: LoadedModel | None, records: list[dict[str, Any]], cast: Callable[[Any], Any]
) -> list[tuple[Any, Any] | Exception]:
    """Predictions of one model for many records at once (one ONNX run); when the
    batch fails, record by record, so only the records it cannot score fail."""
    if model is None:
        return [(None, None)] * len(records)
    try:
        pairs = model.predict(records)
    except Exception:
        out: list[tuple[Any, Any] | Exception] = []
        for record in records:
            try:
                out.append(model.predict([record])[0])
            except Exception as exc:
                out.append(exc)
        pairs = out  # type: ignore[assignment]
    return [
        p if isinstance(p, Exception) else ((None if p[0] is None else cast(p[0])), p[1])
        for p in pairs
    ]


def score_records(
    s: ScoreSettings,
    records: list[dict[str, Any]],
    main: LoadedModel | None,
    staging: LoadedModel | None,
) -> list[dict[str, Any] | Exception]:
    """For each record, the fields the step adds — or the exception that stopped it.

    A canary key goes to the staging version (when there is one); a shadow scores
    every record with it as well."""
    cast = _CASTS[s.prediction_type]
    canary = [
        s.canary is not None
        and staging is not None
        and in_canary(r.get(s.canary_key or ""), s.canary)
        for r in records
    ]
    results: list[Any] = [None] * len(records)
    for model, picked in ((main, False), (staging, True)):
        indices = [i for i, c in enumerate(canary) if c == picked]
        if not indices:
            continue
        predicted = _predict_all(model, [records[i] for i in indices], cast)
        for i, p in zip(indices, predicted, strict=True):
            if isinstance(p, Exception):
                results[i] = p
            else:
                version = model.version if model is not None else None
                results[i] = {"prediction": p[0], "probability": p[1], "model_version": version}
    if s.shadow:
        shadows = _predict_all(staging, records, cast)
        for i, p in enumerate(shadows):
            if isinstance(results[i], Exception):
                continue
            if isinstance(p, Exception):
                results[i] = p
                continue
            results[i]["shadow_prediction"] = p[0]
            results[i]["shadow_version"] = staging.version if staging is not None else None
    return results


def _matrix(batch: pa.RecordBatch, features: tuple[str, ...]) -> Any:
    """The features of a batch as a float32 matrix (NaN where missing)."""
    import numpy as np

    columns = []
    for name in features:
        column = pc.cast(batch.column(name), pa.float64())
        columns.append(column.to_numpy(zero_copy_only=False))
    return np.column_stack(columns).astype(np.float32)


def score_columns(
    s: ScoreSettings,
    batch: pa.RecordBatch,
    main: LoadedModel | None,
    staging: LoadedModel | None,
    out_schema: pa.Schema,
) -> pa.RecordBatch | None:
    """Score a whole Arrow batch with one onnxruntime call per model, without turning
    records into Python objects. None when this path does not apply (a canary, a
    River model) or the batch fails (then records are scored one by one, and only
    those that fail go to the dead letters)."""
    models = [m for m in (main, staging if s.shadow else None) if m is not None]
    if s.canary is not None or any(m.format != "onnx" for m in models) or batch.num_rows == 0:
        return None
    cast = _CASTS[s.prediction_type]
    added: dict[str, list[Any]] = {}
    try:
        for model, prefix in ((main, ""), (staging if s.shadow else None, "shadow_")):
            if prefix and not s.shadow:
                continue
            if model is None:
                labels: list[Any] = [None] * batch.num_rows
                probabilities: list[Any] = [None] * batch.num_rows
            else:
                labels, probabilities = model.predict_matrix(_matrix(batch, model.features))
                labels = [None if x is None else cast(x) for x in labels]
            version = model.version if model is not None else None
            if prefix:
                added["shadow_prediction"], added["shadow_version"] = (
                    labels,
                    [version] * len(labels),
                )
            else:
                added["prediction"], added["probability"] = labels, probabilities
                added["model_version"] = [version] * len(labels)
    except Exception:
        return None
    arrays = []
    for field in out_schema:
        if field.name in added:
            arrays.append(pa.array(added[field.name], type=field.type))
        else:
            arrays.append(batch.column(field.name).cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=out_schema)


def score_udf(
    s: ScoreSettings, out_schema: pa.Schema
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of a score step."""
    wanted = [s.stage]
    if (s.shadow or s.canary is not None) and s.stage != "staging":
        wanted.append("staging")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        batch_id = (ctx.getLocalProperty("streaming.sql.batchId") if ctx else None) or "0"
        models = models_for_batch(s.url, s.pin, wanted, batch_id)
        main, staging = models[s.stage], models.get("staging")
        failed: list[DeadLetter] = []
        for batch in batches:
            fast = score_columns(s, batch, main, staging, out_schema)
            if fast is not None:
                yield fast
                continue
            records = batch.to_pylist()
            out = []
            for record, scored in zip(
                records, score_records(s, records, main, staging), strict=True
            ):
                if isinstance(scored, Exception):
                    failed.append(_letter(s, batch_id, record, scored))
                else:
                    out.append(_row(s.columns, record, scored))
            yield pa.RecordBatch.from_pylist(out, schema=out_schema)
        if failed:
            send_dead_letters(s.url, s.pipeline, s.step, failed)

    return run


def _row(columns: tuple[str, ...], record: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    merged = {**record, **added}
    return {c: merged.get(c) for c in columns}


def _letter(s: ScoreSettings, batch_id: str, record: dict[str, Any], exc: Exception) -> DeadLetter:
    data = orjson.dumps(record, default=str)
    digest = hashlib.blake2b(data, digest_size=12).hexdigest()
    return DeadLetter(
        msg_id=f"{s.pipeline}:{s.step}:{batch_id}:{digest}",
        data=data,
        reason=f"{type(exc).__name__} in score: {exc}",
        seq=int(record.get("_seq") or 0),
    )
