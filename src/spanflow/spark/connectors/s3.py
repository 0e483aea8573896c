"""S3 on Spark: a batch writer of deterministic objects plus a manifest per batch (see
:mod:`spanflow.spec.connectors.s3`)."""

from __future__ import annotations

import io
import json
import logging
import os
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from spanflow.errors import CompileError
from spanflow.spark.connectors import BatchWriter, SinkContext, checks, writes
from spanflow.spec.connectors.s3 import S3SinkOptions
from spanflow.spec.steps.io import SinkStep, SourceStep

log = logging.getLogger(__name__)


def client(options: S3SinkOptions) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=options.endpoint,
        region_name=options.region or "us-east-1",
        aws_access_key_id=os.environ.get(options.access_key_env),
        aws_secret_access_key=os.environ.get(options.secret_key_env),
        config=Config(connect_timeout=10, read_timeout=60, retries={"max_attempts": 3}),
    )


def prefix_of(options: S3SinkOptions, pipeline: str, sink_id: str) -> str:
    return (options.prefix if options.prefix is not None else f"{pipeline}/{sink_id}").strip("/")


@checks("s3")
def check_s3(step: SourceStep | SinkStep, schema: StructType | None = None) -> None:
    """The store answers, takes the credentials and has the bucket; partition columns
    are columns of the rows."""
    options = step.options
    assert isinstance(options, S3SinkOptions)
    for env in (options.access_key_env, options.secret_key_env):
        if env not in os.environ:
            raise CompileError(step.id, f"s3: ${env} is not set (the credentials)")
    if schema is not None:
        absent = [c for c in options.partition_by if c not in schema.fieldNames()]
        if absent:
            raise CompileError(step.id, f"s3 partition_by {absent}: not columns of the rows")
    try:
        client(options).head_bucket(Bucket=options.bucket)
    except Exception as exc:
        where = options.endpoint or "AWS"
        raise CompileError(step.id, f"s3 bucket {options.bucket!r} ({where}): {exc}") from None


@writes("s3")
class S3Writer(BatchWriter):
    def __init__(self, ctx: SinkContext, sink_id: str, options: S3SinkOptions) -> None:
        self.ctx = ctx
        self.options = options
        self.prefix = prefix_of(options, ctx.pipeline, sink_id)
        self._client: Any = None

    def write(self, batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        keep = [n for n in table.column_names if not n.startswith("_")]
        table = table.select(keep)
        if self._client is None:
            self._client = client(self.options)
        self.ctx.check_fence()
        objects = []
        for folder, part in _partitions(table, self.options.partition_by):
            for n, lo in enumerate(
                range(0, max(part.num_rows, 1), self.options.max_rows_per_object)
            ):
                if part.num_rows == 0:
                    break
                chunk = part.slice(lo, self.options.max_rows_per_object)
                key = self._key(folder, batch_id, n)
                self._client.put_object(
                    Bucket=self.options.bucket, Key=key, Body=_encode(chunk, self.options.format)
                )
                objects.append({"key": key, "rows": chunk.num_rows})
        manifest = {
            "batch": batch_id,
            "written": datetime.now(UTC).isoformat(timespec="seconds"),
            "format": self.options.format,
            "rows": sum(o["rows"] for o in objects),
            "objects": objects,
        }
        self._client.put_object(
            Bucket=self.options.bucket,
            Key=f"{self.prefix}/_manifests/batch={batch_id:012d}.json",
            Body=json.dumps(manifest, indent=1).encode(),
            ContentType="application/json",
        )

    def _key(self, folder: str, batch_id: int, n: int) -> str:
        ext = "parquet" if self.options.format == "parquet" else "jsonl"
        parts = [self.prefix, folder, f"batch={batch_id:012d}", f"part-{n:05d}.{ext}"]
        return "/".join(p for p in parts if p)

    def close(self) -> None:
        self._client = None


def _partitions(table: pa.Table, columns: tuple[str, ...]) -> list[tuple[str, pa.Table]]:
    """(folder, rows) per distinct value of the partition columns, folders sorted."""
    if not columns or table.num_rows == 0:
        return [("", table)]
    values = table.select(list(columns)).to_pylist()
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, row in enumerate(values):
        groups.setdefault(tuple(row[c] for c in columns), []).append(i)
    out = []
    for key in sorted(groups, key=lambda k: tuple((v is None, str(v)) for v in k)):
        folder = "/".join(
            f"{c}={quote(str(v), safe='') if v is not None else '__null__'}"
            for c, v in zip(columns, key, strict=True)
        )
        out.append((folder, table.take(pa.array(groups[key]))))
    return out


def _encode(table: pa.Table, fmt: str) -> bytes:
    if fmt == "parquet":
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        return buffer.getvalue()
    rows = table.to_pylist()
    options = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z
    return b"".join(orjson.dumps(r, option=options) + b"\n" for r in rows)
