"""Shared fixtures: one real NATS server and one SparkSession per test session."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

_ids = itertools.count(1)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from spanflow.nats import EmbeddedNats

    server = EmbeddedNats(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: object) -> str:
    return nats_server.url  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from spanflow.spark.session import build_session

    session = build_session(app_name="spanflow-tests", realtime_slots=4)
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()


@pytest.fixture
def uid() -> str:
    """A short unique token for stream and pipeline names within this session."""
    return f"t{next(_ids)}"


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints"


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Apache Kafka (one KRaft broker, from Maven Central's jars) for the session: its
    bootstrap."""
    from spanflow.local.kafka_broker import LocalKafka

    broker = LocalKafka(log_dir=tmp_path_factory.mktemp("kafka")).start()
    yield broker.bootstrap
    broker.stop()


PG_PASSWORD_ENV = "SPANFLOW_TEST_PG_PASSWORD"


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A real PostgreSQL 15 server for the session: its DSN (no password in it); the
    password is in the environment variable ``PG_PASSWORD_ENV``."""
    from spanflow.local.postgres import LocalPostgres

    server = LocalPostgres().start()
    os.environ[PG_PASSWORD_ENV] = server.password
    yield server.dsn
    server.stop()


S3_KEY_ENV, S3_SECRET_ENV = "SPANFLOW_TEST_S3_KEY", "SPANFLOW_TEST_S3_SECRET"


@pytest.fixture(scope="session")
def s3() -> Iterator[object]:
    """A real S3-compatible server (rclone serve s3, SigV4) for the session, its
    credentials in the environment variables ``S3_KEY_ENV`` and ``S3_SECRET_ENV``."""
    from spanflow.local.s3 import LocalS3

    server = LocalS3().start()
    os.environ[S3_KEY_ENV], os.environ[S3_SECRET_ENV] = server.access_key, server.secret_key
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ceph_s3() -> Iterator[object]:
    """A full S3 server (Ceph's RADOS Gateway on a one-OSD cluster in memory) for the
    session: what Hadoop's S3A needs (rclone's folder-backed S3 is not enough)."""
    from spanflow.local.ceph_s3 import LocalCephS3

    with LocalCephS3() as server:
        yield server


@pytest.fixture(scope="session")
def mongodb() -> Iterator[str]:
    """A MongoDB wire-protocol server for the session — nx-27017, an emulator (no real
    mongod installs here) — its URI."""
    from spanflow.local.mongodb import LocalMongo

    server = LocalMongo().start()
    yield server.uri
    server.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the modules holding slow (multi-process, SIGKILL) tests first: pytest-xdist
    hands whole modules to workers in this order, so the long ones start at once and
    the short ones fill the gaps instead of one long module finishing last, alone."""

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slow_modules = {module(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: module(item) not in slow_modules)
