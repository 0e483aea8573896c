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
