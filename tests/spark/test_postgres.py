"""The PostgreSQL sink against a real PostgreSQL 15: exact rows, upserts of window
updates by key, and clear errors at start."""

from __future__ import annotations

import psycopg
import pytest

import spanflow as sf
from spanflow.errors import CompileError, SpecError
from spanflow.spark.runner import PipelineRunner
from tests.conftest import PG_PASSWORD_ENV
from tests.helpers import wait_for
from tests.spark import sink_cases

SCHEMA = sink_cases.SCHEMA


def rows(dsn: str, query: str) -> list[tuple]:
    import os

    with psycopg.connect(dsn, password=os.environ[PG_PASSWORD_ENV]) as conn:
        try:
            return conn.execute(query).fetchall()
        except psycopg.errors.UndefinedTable:
            return []


def test_rows_inserted_and_window_updates_upserted_by_key(
    spark, nats_url, postgres, checkpoints, uid
):
    records, readings = sink_cases.readings(uid, "pg")
    plain = readings.filter("id % 4 != 0").sink_postgres(
        f"readings_{uid}", dsn=postgres, password_env=PG_PASSWORD_ENV
    )
    windows = sink_cases.windows_of(readings).sink_postgres(
        f"windows_{uid}", dsn=postgres, password_env=PG_PASSWORD_ENV,
        key=["device", "window_start"],
    )  # fmt: skip
    expected_rows = sorted((r["id"], r["device"], r["v"]) for r in records if r["id"] % 4)
    runner = PipelineRunner(
        spark, plain.merge(windows).spec(), nats_url=nats_url, checkpoint_dir=checkpoints
    ).start()
    try:
        sink_cases.publish_readings(nats_url, uid, "pg", records[:20])
        wait_for(lambda: len(rows(postgres, f"SELECT id FROM readings_{uid}")) >= 15)
        sink_cases.publish_readings(nats_url, uid, "pg", records[20:])
        wait_for(lambda: len(rows(postgres, f"SELECT id FROM readings_{uid}")) >= 30)

        def windows_done() -> bool:
            got = rows(postgres, f"SELECT n FROM windows_{uid}")
            return sum(n for (n,) in got) >= len(records)

        wait_for(windows_done)
        runner.await_idle()
    finally:
        runner.stop()
    got = rows(postgres, f"SELECT id, device, v FROM readings_{uid} ORDER BY id")
    assert got == expected_rows
    got_windows = rows(
        postgres,
        f"SELECT device, extract(epoch from window_start)::bigint, n, total FROM windows_{uid}",
    )
    assert {(d, s): (n, t) for d, s, n, t in got_windows} == sink_cases.expected_windows(records)
    markers = rows(postgres, f"SELECT sink FROM spanflow_sink_batches WHERE pipeline = 'pg-{uid}'")
    assert len(markers) == 2


def test_a_wrong_password_a_missing_table_or_column_is_one_clear_error_at_start(
    spark, nats_url, postgres, checkpoints, uid, monkeypatch
):
    def start(sink_kwargs: dict) -> None:
        flow = (
            sf.Pipeline(f"pgerr-{uid}")
            .source(f"PGE_{uid}", subjects=[f"pge{uid}"], schema=SCHEMA)
            .sink_postgres(f"t_{uid}", dsn=postgres, **sink_kwargs)
        )
        PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints).start()

    monkeypatch.setenv("WRONG_PG_PASSWORD", "not-it")
    with pytest.raises(CompileError, match="password authentication failed"):
        start({"password_env": "WRONG_PG_PASSWORD"})
    with pytest.raises(CompileError, match=r"\$NO_SUCH_VARIABLE is not set"):
        start({"password_env": "NO_SUCH_VARIABLE"})
    with pytest.raises(CompileError, match=rf"table t_{uid} does not exist \(create: false\)"):
        start({"password_env": PG_PASSWORD_ENV, "create": False})
    import os

    with psycopg.connect(postgres, password=os.environ[PG_PASSWORD_ENV]) as conn:
        conn.execute(f"CREATE TABLE t_{uid} (id bigint, device text)")
    with pytest.raises(CompileError, match=rf"table t_{uid} has no column v, ts"):
        start({"password_env": PG_PASSWORD_ENV})
    with psycopg.connect(postgres, password=os.environ[PG_PASSWORD_ENV]) as conn:
        conn.execute(f"ALTER TABLE t_{uid} ADD COLUMN v float8, ADD COLUMN ts timestamptz")
    with pytest.raises(CompileError, match="no unique constraint on \\(id\\)"):
        start({"password_env": PG_PASSWORD_ENV, "key": "id"})
    assert not [q for q in spark.streams.active if q.name and f"pgerr-{uid}" in q.name]


def test_a_password_in_the_dsn_is_refused():
    with pytest.raises(SpecError, match="password_env"):
        sf.Pipeline("p").source("S", schema=SCHEMA).sink_postgres(
            "t", dsn="postgresql://u:secret@host/db"
        ).spec()


def test_records_are_enriched_from_a_postgres_table_that_changes_while_running(
    spark, nats_url, postgres, checkpoints, uid
):
    import os

    from tests.helpers import publish, read_all, read_records

    with psycopg.connect(postgres, password=os.environ[PG_PASSWORD_ENV], autocommit=True) as c:
        c.execute(f"CREATE TABLE dev_{uid} (device text PRIMARY KEY, line text, t_max float8)")
        c.execute(f"INSERT INTO dev_{uid} VALUES ('a', 'L1', 40), ('b', 'L2', 50)")
    flow = (
        sf.Pipeline(f"pge-{uid}", trigger="0.3s")
        .source(f"PGE_{uid}", subjects=[f"pge{uid}.>"], schema={"device": "string", "n": "long"})
        .enrich(
            f"postgres:dev_{uid}", on="device", schema={"line": "string", "t_max": "double"},
            postgres={"dsn": postgres, "password_env": PG_PASSWORD_ENV, "refresh": "1h",
                      "notify": f"dev_{uid}"},
        )
        .sink_jetstream(f"PGEO_{uid}", subject=f"pgeo{uid}")
    )  # fmt: skip
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()  # copies the table before any query runs
    try:
        publish(nats_url, f"PGE_{uid}", f"pge{uid}.r", [
            {"device": "a", "n": 1}, {"device": "b", "n": 2}, {"device": "c", "n": 3}])  # fmt: skip
        wait_for(lambda: len(read_records(nats_url, f"PGEO_{uid}")) >= 3)
        with psycopg.connect(postgres, password=os.environ[PG_PASSWORD_ENV], autocommit=True) as c:
            c.execute(f"UPDATE dev_{uid} SET line = 'L9' WHERE device = 'a'")
            c.execute(f"DELETE FROM dev_{uid} WHERE device = 'b'")
            c.execute(f"NOTIFY dev_{uid}")

        def mirrored() -> bool:  # the new row for a, and a delete marker for b
            latest = {s.rsplit(".", 1)[-1]: d for _, d, s in read_all(nats_url, bucket)}
            return b"L9" in latest.get("a", b"") and latest.get("b") == b""

        bucket = f"KV_PG_dev_{uid}"
        wait_for(mirrored)
        publish(nats_url, f"PGE_{uid}", f"pge{uid}.r", [
            {"device": "a", "n": 4}, {"device": "b", "n": 5}])  # fmt: skip
        wait_for(lambda: len(read_records(nats_url, f"PGEO_{uid}")) >= 5)
        runner.await_idle()
    finally:
        runner.stop()
    got = {
        r["n"]: (r["device"], r["line"], r["t_max"]) for r in read_records(nats_url, f"PGEO_{uid}")
    }
    assert got == {
        1: ("a", "L1", 40.0), 2: ("b", "L2", 50.0), 3: ("c", None, None),
        4: ("a", "L9", 40.0), 5: ("b", None, None),
    }  # fmt: skip


def test_rows_the_table_refuses_are_dead_lettered_and_the_others_written(
    spark, nats_url, postgres, checkpoints, uid
):
    import os

    import orjson

    from tests.helpers import publish

    with psycopg.connect(postgres, password=os.environ[PG_PASSWORD_ENV], autocommit=True) as c:
        c.execute(f"CREATE TABLE chk_{uid} (id bigint, device text, v float8 CHECK (v < 100))")
    flow = (
        sf.Pipeline(f"pgc-{uid}", trigger="0.3s")
        .source(f"PGC_{uid}", subjects=[f"pgc{uid}.>"], schema={"id": "long", "device": "string",
                                                                  "v": "double"})
        .sink_postgres(f"chk_{uid}", dsn=postgres, password_env=PG_PASSWORD_ENV, create=False)
    )  # fmt: skip
    records = [{"id": i, "device": "a", "v": 95.0 + i} for i in range(10)]  # 5.. break the check
    runner = PipelineRunner(spark, flow.spec(), nats_url=nats_url, checkpoint_dir=checkpoints)
    runner.start()
    try:
        publish(nats_url, f"PGC_{uid}", f"pgc{uid}.r", records)
        wait_for(lambda: len(rows(postgres, f"SELECT id FROM chk_{uid}")) >= 5)
        wait_for(lambda: len(_letters(nats_url, f"pgc-{uid}")) >= 5)
        runner.await_idle()
    finally:
        runner.stop()
    assert [i for (i,) in rows(postgres, f"SELECT id FROM chk_{uid} ORDER BY id")] == [
        0,
        1,
        2,
        3,
        4,
    ]
    letters = _letters(nats_url, f"pgc-{uid}")
    assert sorted(orjson.loads(d)["id"] for _, d in letters) == [5, 6, 7, 8, 9]
    assert all("violates check constraint" in h["Spanflow-Reason"] for h, _ in letters)


def _letters(nats_url: str, pipeline: str) -> list:
    from tests.helpers import read_all

    return [(h, d) for h, d, s in read_all(nats_url, "SPANFLOW_DLQ") if pipeline in s]


@pytest.mark.parametrize("batches", [1, 3])
def test_two_standby_replicas_writing_at_once_write_each_batch_once(spark, postgres, uid, batches):
    """Hot standby: two replicas' writers of one sink write the same batches at the same
    moment (the first batch included, whose marker row does not exist yet). A table
    without a key shows a second copy of any row; the sink's lock keeps one."""
    from spanflow.spark.connectors import SinkContext
    from spanflow.spark.connectors.postgres import PostgresWriter, check_postgres
    from tests.spark.sink_replica import write_in_step

    flow = (
        sf.Pipeline(f"pgsb-{uid}")
        .source("S", schema={"id": "long"})
        .sink_postgres(f"standby_{uid}", dsn=postgres, password_env=PG_PASSWORD_ENV)
    )
    step = flow.spec().sinks()[0]
    frames = [spark.range(i * 100, (i + 1) * 100).toDF("id") for i in range(batches)]
    check_postgres(step, frames[0].schema)
    ctx = SinkContext(pipeline=f"pgsb-{uid}", check_fence=lambda: None, step=step, spark=spark)
    writers = [PostgresWriter(ctx, step.id, step.options) for _ in range(2)]  # type: ignore[arg-type]
    assert write_in_step(writers, frames) == []  # type: ignore[arg-type]
    got = sorted(i for (i,) in rows(postgres, f"SELECT id FROM standby_{uid}"))
    assert got == list(range(100 * batches))


def test_a_replica_killed_inside_its_transaction_leaves_the_batch_to_its_peer(
    postgres, uid, tmp_path
):
    """Hot standby: replica A is SIGKILLed with batch 2's transaction open (rows and
    marker written, the sink's lock held) while replica B waits for that lock.
    PostgreSQL rolls A's transaction back when its connection dies; B gets the lock,
    finds batches 0 and 1 recorded and writes batch 2: every row once."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    from pathlib import Path

    from spanflow.spark.connectors.postgres import check_postgres
    from tests.spark.sink_replica import ArrowBatch, flow, writer

    table, pipeline = f"standby_kill_{uid}", f"pgk-{uid}"
    check_postgres(flow("postgres", postgres, table, pipeline).spec().sinks()[0], ArrowBatch.schema)
    faults = tmp_path / "faults"
    faults.mkdir()
    root = Path(__file__).resolve().parents[2]
    a = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.sink_replica", "postgres", postgres, table,
         pipeline, "3", str(faults)],
        cwd=root, start_new_session=True,
    )  # fmt: skip
    b = writer("postgres", postgres, table, pipeline)
    errors: list[BaseException] = []

    def replica_b() -> None:
        try:
            for batch_id in range(3):
                b.write(ArrowBatch(batch_id), batch_id)  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)

    waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    thread = threading.Thread(target=replica_b)
    try:
        wait_for(lambda: (faults / "postgres-sink-open-transaction.reached").exists(), timeout=90)
        thread.start()
        wait_for(lambda: rows(postgres, waiting)[0][0] > 0, timeout=30)  # B waits for A's lock
    finally:
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(10)
    thread.join(60)
    b.close()
    assert thread.ident is not None and not thread.is_alive() and errors == []
    got = sorted(i for (i,) in rows(postgres, f"SELECT id FROM {table}"))
    assert got == list(range(300))
