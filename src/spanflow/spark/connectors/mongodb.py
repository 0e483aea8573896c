"""MongoDB on Spark: a batch writer of upserts by deterministic ``_id`` (see
:mod:`spanflow.spec.connectors.mongodb`)."""

from __future__ import annotations

import os
from typing import Any

import orjson
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from spanflow.errors import CompileError
from spanflow.spark.connectors import BatchWriter, SinkContext, checks, content_ids, writes
from spanflow.spark.deadletter import DeadLetter, send_dead_letters
from spanflow.spec.connectors.mongodb import MongoSinkOptions
from spanflow.spec.steps.io import SinkStep, SourceStep


def client(options: MongoSinkOptions) -> Any:
    from pymongo import MongoClient

    auth: dict[str, Any] = {}
    if options.username:
        auth["username"] = options.username
        auth["password"] = os.environ.get(options.password_env or "", "")
    timeout = round(options.timeout * 1000)
    return MongoClient(
        options.uri, serverSelectionTimeoutMS=timeout, connectTimeoutMS=timeout, **auth
    )


@checks("mongodb")
def check_mongodb(step: SourceStep | SinkStep, schema: StructType | None = None) -> None:
    """The server answers (and takes the credentials); key fields are columns."""
    options = step.options
    assert isinstance(options, MongoSinkOptions)
    if options.password_env and options.password_env not in os.environ:
        raise CompileError(step.id, f"mongodb: ${options.password_env} is not set")
    if schema is not None:
        absent = [k for k in options.key if k not in schema.fieldNames()]
        if absent:
            raise CompileError(step.id, f"mongodb key {absent}: not columns of the rows")
    conn = client(options)
    try:
        conn[options.database].command("ping")
    except Exception as exc:
        first = str(exc).split(",")[0]
        raise CompileError(step.id, f"mongodb ({options.uri}): {first}") from None
    finally:
        conn.close()


@writes("mongodb")
class MongoWriter(BatchWriter):
    def __init__(self, ctx: SinkContext, sink_id: str, options: MongoSinkOptions) -> None:
        self.ctx = ctx
        self.sink_id = sink_id
        self.options = options
        self._client: Any = None

    def write(self, batch: DataFrame, batch_id: int) -> None:
        from pymongo import ReplaceOne

        table = batch.toArrow()
        rows = table.select([n for n in table.column_names if not n.startswith("_")]).to_pylist()
        if not rows:
            return
        if self._client is None:
            self._client = client(self.options)
        self.ctx.check_fence()
        ids = document_ids(rows, self.options.key, f"{self.ctx.pipeline}:{self.sink_id}:{batch_id}")
        collection = self._client[self.options.database][self.options.collection]
        requests = [
            ReplaceOne({"_id": _id}, {**row, "_id": _id}, upsert=True)
            for _id, row in zip(ids, rows, strict=True)
        ]
        refused: list[tuple[int, str]] = []
        for lo in range(0, len(requests), 5000):
            refused += self._bulk(collection, requests[lo : lo + 5000], lo)
        if refused:
            option = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z
            letters = [
                DeadLetter(msg_id=f"mongodb:{ids[i]}", reason=reason,
                           data=orjson.dumps(rows[i], option=option, default=str),
                           stream=f"mongodb:{self.options.database}.{self.options.collection}",
                           subject=self.sink_id)
                for i, reason in refused
            ]  # fmt: skip
            send_dead_letters(
                self.ctx.nats_url, self.ctx.pipeline, self.sink_id, letters, epoch=self.ctx.epoch
            )

    @staticmethod
    def _bulk(collection: Any, requests: list[Any], offset: int) -> list[tuple[int, str]]:
        """One unordered bulk; the documents the server refused (index, reason). Other
        failures (the server away) raise: the batch is retried."""
        from pymongo.errors import BulkWriteError

        try:
            collection.bulk_write(requests, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if not errors or exc.details.get("writeConcernErrors"):
                raise
            return [(offset + e["index"], f"mongodb: {e.get('errmsg', e)}"[:500]) for e in errors]
        return []

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def document_ids(rows: list[dict[str, Any]], key: tuple[str, ...], batch: str) -> list[Any]:
    """Each row's ``_id``: the key's value (several: their values joined by '|'), or
    ``<pipeline>:<sink>:<batch>:<content hash>:<occurrence>`` without a key — the same
    for the same rows whenever the batch is replayed, whatever their order.

    >>> document_ids([{"d": "a", "v": 1}, {"d": "a", "v": 1}], (), "p:s:7")[1][-2:]
    ':1'
    >>> document_ids([{"d": "a", "w": 3}], ("d", "w"), "p:s:7")
    ['a|3']
    """
    if key:
        if len(key) == 1:
            return [row.get(key[0]) for row in rows]
        return ["|".join(str(row.get(k)) for k in key) for row in rows]
    option = orjson.OPT_SORT_KEYS | orjson.OPT_NAIVE_UTC
    return content_ids(batch, [orjson.dumps(row, option=option, default=str) for row in rows])
