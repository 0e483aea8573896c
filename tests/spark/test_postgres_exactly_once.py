"""JetStream to PostgreSQL exactly once through crashes: ``spanflow run`` is SIGKILLed
mid-stream, twice, and restarted from its checkpoint; the table holds every expected
row once (plain inserts: a replayed batch would show as duplicates)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter

import psycopg
import pytest

from tests.conftest import PG_PASSWORD_ENV
from tests.helpers import publish, run_pipeline_process, wait_for

pytestmark = pytest.mark.slow

N = 3000


def _pipeline(uid: str, dsn: str) -> str:
    return f"""
name: pgeo-{uid}
trigger: 0s
sources:
  - id: readings
    stream: PGEO_{uid}
    subjects: ["pgeo{uid}.>"]
    schema: {{id: long, device: string, v: long}}
    max_rows_per_batch: 200
    to: [keep]
processors:
  - {{id: keep, type: filter, where: "v % 3 != 0", to: [out]}}
sinks:
  - {{id: out, type: postgres, dsn: "{dsn}", password_env: {PG_PASSWORD_ENV}, table: eo_{uid}}}
"""


def _count(dsn: str, uid: str) -> int:
    with psycopg.connect(dsn, password=os.environ[PG_PASSWORD_ENV]) as conn:
        try:
            return int(conn.execute(f"SELECT count(*) FROM eo_{uid}").fetchone()[0])
        except psycopg.errors.UndefinedTable:
            return 0


def _crash(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_postgres_rows_exactly_once_across_sigkill_restarts(nats_url, postgres, tmp_path, uid):
    records = [{"id": i, "device": "abc"[i % 3], "v": i} for i in range(N)]
    publish(nats_url, f"PGEO_{uid}", f"pgeo{uid}.r", records)
    expected = Counter(r["id"] for r in records if r["v"] % 3 != 0)
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_pipeline(uid, postgres))
    data_dir, log = tmp_path / "node", tmp_path / "run.log"
    for fraction in (0.15, 0.5):
        proc = run_pipeline_process(pipeline, nats_url, data_dir, log)
        try:
            wait_for(lambda f=fraction: _count(postgres, uid) >= len(expected) * f, timeout=180)
        finally:
            _crash(proc)
    proc = run_pipeline_process(pipeline, nats_url, data_dir, log)
    try:
        wait_for(lambda: _count(postgres, uid) >= len(expected), timeout=180)
    finally:
        proc.terminate()
        proc.wait(60)
    with psycopg.connect(postgres, password=os.environ[PG_PASSWORD_ENV]) as conn:
        got = Counter(i for (i,) in conn.execute(f"SELECT id FROM eo_{uid}").fetchall())
    assert got == expected, log.read_text()[-3000:]
