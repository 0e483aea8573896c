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
import threading
import time
from typing import Any

import orjson
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
from spanflow.faults import pause_here
from spanflow.spark.connectors import BatchWriter, SinkContext, checks, content_ids, writes
from spanflow.spark.deadletter import DeadLetter, send_dead_letters
from spanflow.spec.connectors.postgres import PostgresSinkOptions
from spanflow.spec.steps.io import SinkStep, SourceStep
from spanflow.spec.steps.joins import EnrichStep, mirror_bucket

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
                refused = self._move(conn, columns, rows) if rows else []
                conn.execute(
                    f"INSERT INTO {MARKERS} (pipeline, sink, batch, rows) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (pipeline, sink) DO UPDATE SET batch = EXCLUDED.batch, "
                    "rows = EXCLUDED.rows, written = now()",
                    (self.ctx.pipeline, self.sink_id, batch_id, len(rows) - len(refused)),
                )
                pause_here("postgres-sink-open-transaction")  # rows and marker, uncommitted
        except Exception:
            self.close()  # a broken connection is not reused
            raise
        if refused:
            self._dead_letter(batch_id, refused)

    def _move(
        self, conn: Any, columns: list[tuple[str, str]], rows: list[dict[str, Any]]
    ) -> list[tuple[dict[str, Any], str]]:
        """Stage and move the batch's rows; if the table refuses the batch (a value that
        breaks a constraint or does not fit a column), each row alone, in a savepoint
        of its own, so the others are written. The refused rows, with the reason."""
        import psycopg

        names = [c for c, _ in columns]
        try:
            with conn.transaction():
                self._stage(conn, columns, rows)
                conn.execute(_move_statement(self.options, names))
            return []
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError):
            pass
        refused = []
        for row in rows:
            try:
                with conn.transaction():
                    self._stage(conn, columns, [row])
                    conn.execute(_move_statement(self.options, names))
                    conn.execute("TRUNCATE spanflow_staged")
            except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                refused.append((row, f"postgres {self.options.table}: {_first_line(exc)}"))
        return refused

    def _dead_letter(self, batch_id: int, refused: list[tuple[dict[str, Any], str]]) -> None:
        option = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z | orjson.OPT_SORT_KEYS
        payloads = [orjson.dumps(row, option=option, default=str) for row, _ in refused]
        prefix = f"{self.ctx.pipeline}:{self.sink_id}:{batch_id}"
        letters = [
            DeadLetter(msg_id=f"postgres:{key}", data=payload, reason=reason,
                       stream=f"postgres:{self.options.table}", subject=self.sink_id)
            for key, payload, (_, reason) in zip(
                content_ids(prefix, payloads), payloads, refused, strict=True
            )
        ]  # fmt: skip
        send_dead_letters(
            self.ctx.nats_url, self.ctx.pipeline, self.sink_id, letters, epoch=self.ctx.epoch
        )

    def _already_written(self, conn: Any, batch_id: int) -> bool:
        """Whether the sink's marker holds ``batch_id`` or a later one. Writers of the
        same sink (hot standby replicas) take its lock in turn first, for the whole
        transaction: a row lock alone would not serialise the first batch, whose marker
        row does not exist yet, and a table without a key would get its rows twice."""
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"spanflow:{self.ctx.pipeline}:{self.sink_id}",),
        )
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


class TableMirror:
    """A PostgreSQL table copied into the key-value bucket an ``enrich`` step looks up
    live (:func:`spanflow.spec.steps.joins.mirror_bucket`), keyed by its column named
    like the step's ``on``.

    Each sync reads the table's key and the step's fields and puts what changed since
    the last sync (deleting keys whose rows are gone); a sync runs every ``refresh``,
    and at once when a NOTIFY arrives on ``notify``. The enrichment itself then is the
    live ``kv:`` lookup: table changes are stored in JetStream in order with the
    records, so a replayed micro-batch sees the table it saw the first time."""

    def __init__(self, nats_url: str, step: EnrichStep) -> None:
        assert step.pg_table is not None and step.postgres is not None
        self.step = step
        self.settings = step.postgres
        self.table = step.pg_table
        self.bucket = mirror_bucket(self.table)
        self.nats_url = nats_url
        self.last: dict[str, bytes] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _connect(self) -> Any:
        import psycopg

        env = self.settings.password_env
        return psycopg.connect(
            self.settings.dsn,
            password=os.environ.get(env, "") if env else None,
            connect_timeout=10,
            autocommit=True,
            application_name="spanflow-mirror",
        )

    def read(self, conn: Any) -> dict[str, bytes]:
        """The table as bucket entries: key → JSON of the step's fields."""
        from psycopg import sql

        fields = list(self.step.schema_)
        pairs = sql.SQL(", ").join(
            sql.SQL("{}, {}").format(sql.Literal(f), sql.Identifier(f)) for f in fields
        )
        query = sql.SQL("SELECT {}::text, jsonb_build_object({}) FROM {}").format(
            sql.Identifier(self.step.on), pairs, _identifier(self.table)
        )
        rows = conn.execute(query).fetchall()
        return {str(k): orjson.dumps(v) for k, v in rows if k is not None}

    def sync(self, conn: Any | None = None) -> int:
        """Put what changed into the bucket; the number of keys put or deleted."""
        own = conn is None
        conn = conn or self._connect()
        try:
            now = self.read(conn)
        finally:
            if own:
                conn.close()
        changed = {k: v for k, v in now.items() if self.last.get(k) != v}
        gone = [k for k in self.last if k not in now]
        if changed or gone:
            _apply_to_bucket(self.nats_url, self.bucket, changed, gone)
        self.last = now
        return len(changed) + len(gone)

    def start(self) -> TableMirror:
        """A first sync now (a CompileError if the table cannot be read), then the loop."""
        try:
            self.sync()
        except Exception as exc:
            raise CompileError(
                self.step.id, f"postgres table {self.table}: {_first_line(exc)}"
            ) from None
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"mirror-{self.table}")
        self._thread.start()
        return self

    def _loop(self) -> None:
        from psycopg import sql

        while not self._stop.is_set():
            try:
                conn = self._connect()
                if self.settings.notify:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.settings.notify)))
                while not self._stop.is_set():
                    self.sync(conn)
                    self._wait(conn)
            except Exception as exc:  # the database or NATS is away: keep trying
                log.warning("mirror of %s: %s", self.table, _first_line(exc))
                self._stop.wait(min(self.settings.refresh, 10.0))

    def _wait(self, conn: Any) -> None:
        """Until ``refresh`` has passed, a NOTIFY has come, or the mirror stops."""
        if not self.settings.notify:
            self._stop.wait(self.settings.refresh)
            return
        deadline = time.monotonic() + self.settings.refresh
        while not self._stop.is_set() and time.monotonic() < deadline:
            for _ in conn.notifies(timeout=min(1.0, self.settings.refresh), stop_after=1):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)


def _apply_to_bucket(url: str, bucket: str, put: dict[str, bytes], gone: list[str]) -> None:
    from spanflow.nats.cluster import ensure_kv
    from spanflow.nats.streams import SyncNats

    client = SyncNats(url)
    try:

        async def apply() -> None:
            kv = await ensure_kv(client.js, bucket)
            for key, value in put.items():
                await kv.put(key, value)
            for key in gone:
                await kv.delete(key)

        client.run(apply)
    finally:
        client.close()
