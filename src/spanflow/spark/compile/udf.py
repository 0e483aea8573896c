"""Run users' Python functions inside Spark as Arrow batch functions (``mapInArrow``).

A function that raises on one record does not fail the query: the record goes to the
dead-letter stream with the exception text, and the rest of the batch goes on.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
import pyarrow as pa
from pyspark import TaskContext

from spanflow.errors import CompileError
from spanflow.spark.deadletter import DeadLetter, send_dead_letters

UserFunction = Callable[..., Any]


def resolve(ref: str, step_id: str, local: Mapping[str, UserFunction]) -> UserFunction:
    """The callable behind ``module:qualname`` (or an in-process ``__local__`` function)."""
    if ref in local:
        return local[ref]
    module_name, _, qualname = ref.partition(":")
    if module_name == "__local__":
        raise CompileError(
            step_id,
            "uses an in-process function (a lambda, a nested function or one defined in "
            "__main__); define it at module level so the pipeline can be loaded elsewhere",
        )
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise CompileError(step_id, f"cannot import function {ref!r}: {exc}") from None
    if not callable(obj):
        raise CompileError(step_id, f"{ref!r} is not callable")
    return obj


def _json_default(value: Any) -> Any:
    return str(value)


def arrow_udf(
    kind: str,
    fn: UserFunction,
    out_schema: pa.Schema,
    *,
    url: str,
    pipeline: str,
    step: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function applying ``fn`` per record (``map``, ``filter``, ``flat_map``)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        failed: list[DeadLetter] = []
        ctx = TaskContext.get()
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx else "0"
        for batch in batches:
            out: list[dict[str, Any]] = []
            for record in batch.to_pylist():
                try:
                    if kind == "filter":
                        if fn(record):
                            out.append(record)
                    elif kind == "map":
                        out.append(fn(record))
                    else:
                        out.extend(fn(record) or ())
                except Exception as exc:
                    data = orjson.dumps(record, default=_json_default)
                    digest = hashlib.blake2b(data, digest_size=12).hexdigest()
                    failed.append(
                        DeadLetter(
                            msg_id=f"{pipeline}:{step}:{batch_id}:{digest}",
                            data=data,
                            reason=f"{type(exc).__name__}: {exc}",
                            seq=int(record.get("_seq") or 0),
                        )
                    )
            yield pa.RecordBatch.from_pylist(out, schema=out_schema)
        if failed:
            send_dead_letters(url, pipeline, step, failed)

    return run


def reduce_udf(
    fn: UserFunction,
    out_schema: pa.Schema,
    group_columns: list[str],
    *,
    url: str,
    pipeline: str,
    step: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Fold each window's collected records (column ``_rows``) with ``fn(acc, record)``.

    A fold that raises sends that window's records to the dead letters."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        failed: list[DeadLetter] = []
        ctx = TaskContext.get()
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx else "0"
        for batch in batches:
            out = []
            for group in batch.to_pylist():
                records = group.pop("_rows") or []
                if not records:
                    continue
                try:
                    acc = dict(records[0])
                    for record in records[1:]:
                        acc = fn(acc, record)
                except Exception as exc:
                    reason = f"{type(exc).__name__} in reduce: {exc}"
                    for n, record in enumerate(records):
                        data = orjson.dumps({**group, **record}, default=_json_default)
                        digest = hashlib.blake2b(data, digest_size=12).hexdigest()
                        msg_id = f"{pipeline}:{step}:{batch_id}:{digest}:{n}"
                        failed.append(DeadLetter(msg_id=msg_id, data=data, reason=reason))
                    continue
                out.append({**acc, **{k: group[k] for k in group_columns}})
            yield pa.RecordBatch.from_pylist(out, schema=out_schema)
        if failed:
            send_dead_letters(url, pipeline, step, failed)

    return run
