"""PostgreSQL on Spark: a transactional batch writer (see
:mod:`spanflow.spec.connectors.postgres` for the guarantee).

Each micro-batch comes to the driver as Arrow (``toArrow``), is copied (``COPY``)
into a temporary table and moved into the target in one statement — ``INSERT ...
ON CONFLICT (key) DO UPDATE`` with a key (the last row of a key in the batch wins),
a plain ``INSERT`` without — in the same transaction that records the batch id in
``spanflow_sink_batches`` (row locked, so a stale writer waits and then skips).
Columns starting with ``_`` (source metadata) are not written.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spanflow.errors import CompileError
from spanflow.spark.connectors import BatchWriter, SinkContext, checks, writes
from spanflow.spec.connectors.postgres import PostgresSinkOptions
from spanflow.spec.steps.io import SinkStep, SourceStep

log = logging.getLogger(__name__)

MARKERS = "spanflow_sink_batches"
_TYPES: dict[type[DataType], str] = {
    StringType: "text",
    LongType: "bigint",
    IntegerType: "integer",
    ShortType: "smallint",
    DoubleType: "double precision",
    FloatType: "real",
    BooleanType: "boolean",
    TimestampType: "timestamptz",
    TimestampNTZType: "timestamp",
    DateType: "date",
    BinaryType: "bytea",
}
"""Spark types → PostgreSQL column types; anything else (structs, maps, arrays,
decimals) is stored as jsonb."""


def pg_type(data_type: DataType) -> str:
    return _TYPES.get(type(data_type), "jsonb")


def written_columns(schema: StructType) -> list[tuple[str, str]]:
    """(column, PostgreSQL type) of what a sink writes: metadata columns stay behind."""
    return [(f.name, pg_type(f.dataType)) for f in schema.fields if not f.name.startswith("_")]


def connect(options: PostgresSinkOptions) -> Any:
    import psycopg

    password = os.environ.get(options.password_env, "") if options.password_env else None
    return psycopg.connect(
        options.dsn,
        password=password,
        connect_timeout=max(1, round(options.connect_timeout)),
        application_name="spanflow",
    )


def _table_parts(table: str) -> tuple[str | None, str]:
    schema, _, name = table.rpartition(".")
    return schema or None, name


def _identifier(table: str) -> Any:
    from psycopg import sql

    schema, name = _table_parts(table)
    return sql.Identifier(schema, name) if schema else sql.Identifier(name)


@checks("postgres")
def check_postgres(step: SourceStep | SinkStep, schema: StructType | None = None) -> None:
    """The server answers and takes the password; the table exists (or is created from
    the rows' columns) with every column the sink writes and a unique key to upsert by."""
    options = step.options
    assert isinstance(options, PostgresSinkOptions)
    if options.password_env and options.password_env not in os.environ:
        raise CompileError(step.id, f"password_env: ${options.password_env} is not set")
    try:
        conn = connect(options)
    except Exception as exc:
        raise CompileError(step.id, f"postgres ({options.dsn}): {_first_line(exc)}") from None
    try:
        with conn.transaction():
            _ensure_markers(conn)
            if schema is not None:
                _ensure_table(conn, step.id, options, written_columns(schema))
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(step.id, f"postgres table {options.table}: {_first_line(exc)}") from None
    finally:
        conn.close()


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _ensure_markers(conn: Any) -> None:
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {MARKERS} (pipeline text NOT NULL, sink text NOT NULL, "
        "batch bigint NOT NULL, rows bigint NOT NULL, written timestamptz NOT NULL "
        "DEFAULT now(), PRIMARY KEY (pipeline, sink))"
    )


def _existing_columns(conn: Any, table: str) -> dict[str, str] | None:
    schema, name = _table_parts(table)
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = %s AND table_schema = COALESCE(%s, current_schema())",
        (name, schema),
    ).fetchall()
    return {c: t for c, t in rows} or None


def _ensure_table(
    conn: Any, step_id: str, options: PostgresSinkOptions, columns: list[tuple[str, str]]
) -> None:
    from psycopg import sql

    names = [c for c, _ in columns]
    missing_key = [k for k in options.key if k not in names]
    if missing_key:
        raise CompileError(step_id, f"key {missing_key} is not among the columns {names}")
    existing = _existing_columns(conn, options.table)
    if existing is None:
        if not options.create:
            raise CompileError(
                step_id, f"postgres table {options.table} does not exist (create: false)"
            )
        parts = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns]
        if options.key:
            keys = sql.SQL(", ").join(map(sql.Identifier, options.key))
            parts.append(sql.SQL("PRIMARY KEY ({})").format(keys))
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                _identifier(options.table), sql.SQL(", ").join(parts)
            )
        )
        return
    absent = [c for c in names if c not in existing]
    if absent:
        raise CompileError(
            step_id,
            f"postgres table {options.table} has no column {', '.join(absent)} "
            f"(it has {', '.join(existing)})",
        )
    if options.key:  # ON CONFLICT needs a unique index on exactly the key
        try:
            conn.execute(_move_statement(options, names, "EXPLAIN "))
        except Exception as exc:
            raise CompileError(
                step_id,
                f"postgres table {options.table}: no unique constraint on "
                f"({', '.join(options.key)}) to upsert by: {_first_line(exc)}",
            ) from None


def _move_statement(options: PostgresSinkOptions, names: list[str], prefix: str = "") -> Any:
    """INSERT the staged rows into the target (upsert by key, the last row of a key wins)."""
    from psycopg import sql

    cols = sql.SQL(", ").join(map(sql.Identifier, names))
    target = _identifier(options.table)
    if not options.key:
        return sql.SQL(prefix + "INSERT INTO {} ({}) SELECT {} FROM spanflow_staged").format(
            target, cols, cols
        )
    keys = sql.SQL(", ").join(map(sql.Identifier, options.key))
    updates = [c for c in names if c not in options.key]
    action = (
        sql.SQL("DO UPDATE SET ")
        + sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
            for c in updates
        )
        if updates
        else sql.SQL("DO NOTHING")
    )
    return sql.SQL(
        prefix + "INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM spanflow_staged "
        "ORDER BY {}, spanflow_row DESC ON CONFLICT ({}) {}"
    ).format(target, cols, keys, cols, keys, keys, action)


@writes("postgres")
class PostgresWriter(BatchWriter):
    """One transaction per micro-batch; the batch id recorded in the same transaction."""

    def __init__(self, ctx: SinkContext, sink_id: str, options: PostgresSinkOptions) -> None:
        self.ctx = ctx
        self.sink_id = sink_id
        self.options = options
        self._conn: Any = None

    def write(self, batch: DataFrame, batch_id: int) -> None:
        columns = written_columns(batch.schema)
        table = batch.toArrow()
        names = [c for c, _ in columns]
        rows = table.select(names).to_pylist() if names else []
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.options)
        conn = self._conn
        try:
            with conn.transaction():
                if self._already_written(conn, batch_id):
                    log.info("postgres sink %s: batch %d written before", self.sink_id, batch_id)
                    return
                self.ctx.check_fence()
                if rows:
                    self._stage(conn, columns, rows)
                    conn.execute(_move_statement(self.options, names))
                conn.execute(
                    f"INSERT INTO {MARKERS} (pipeline, sink, batch, rows) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (pipeline, sink) DO UPDATE SET batch = EXCLUDED.batch, "
                    "rows = EXCLUDED.rows, written = now()",
                    (self.ctx.pipeline, self.sink_id, batch_id, len(rows)),
                )
        except Exception:
            self.close()  # a broken connection is not reused
            raise

    def _already_written(self, conn: Any, batch_id: int) -> bool:
        found = conn.execute(
            f"SELECT batch FROM {MARKERS} WHERE pipeline = %s AND sink = %s FOR UPDATE",
            (self.ctx.pipeline, self.sink_id),
        ).fetchone()
        return found is not None and int(found[0]) >= batch_id

    def _stage(self, conn: Any, columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> None:
        from psycopg import sql
        from psycopg.types.json import Jsonb

        defs = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns]
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE IF NOT EXISTS spanflow_staged "
                "(spanflow_row bigserial, {}) ON COMMIT DROP"
            ).format(sql.SQL(", ").join(defs))
        )
        jsonb = [t == "jsonb" for _, t in columns]
        names = [c for c, _ in columns]
        copy_sql = sql.SQL("COPY spanflow_staged ({}) FROM STDIN").format(
            sql.SQL(", ").join(map(sql.Identifier, names))
        )
        with conn.cursor().copy(copy_sql) as copy:
            for row in rows:
                copy.write_row(
                    [
                        Jsonb(json.loads(json.dumps(row[c], default=str))) if j else row[c]
                        for c, j in zip(names, jsonb, strict=True)
                    ]
                )

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
