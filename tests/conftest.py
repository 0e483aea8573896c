"""Shared fixtures: one real NATS server and one SparkSession per test session."""

from __future__ import annotations

import fcntl
import functools
import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


SLOW_MARK = "pytest.mark.slow"

CLUSTER_DIRS = ("tests/cli/", "tests/cluster/", "tests/deploy/", "tests/web/")
"""Where the slow tests start whole clusters (several processes with their own Spark)."""


@functools.cache
def _is_slow_module(path: str) -> bool:
    """Whether a test module holds slow tests: read from its text, as the scheduler in
    pytest-xdist's controller sees node ids only, never the collected items."""
    file = Path(__file__).parent.parent / path
    return file.suffix == ".py" and SLOW_MARK in file.read_text(encoding="utf-8")


HEAVY_FIXTURES = frozenset(
    {"nats_server", "nats_url", "spark", "kafka", "postgres", "s3", "ceph_s3", "mongodb"}
)
"""Fixtures that start a server or a Spark session: ``--fast`` leaves their tests out."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="The fast tier: unit and pure tests only (no NATS, Spark, broker, cluster or "
        "child process). A test that starts one anyway is skipped, and says so.",
    )


def _fast_tier(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only the tests that need no server: not slow, no heavy fixture."""
    kept, left = [], []
    for item in items:
        heavy = item.get_closest_marker("slow") or HEAVY_FIXTURES & set(
            getattr(item, "fixturenames", ())
        )
        (left if heavy else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


@pytest.fixture(scope="session", autouse=True)
def _fast_tier_starts_no_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """In the fast tier, starting NATS, a cluster, Spark or a child process skips the
    test (it belongs to the full suite): a test the fixture scan missed costs its set-up,
    never a server. (A fixture, so it patches the process that runs the tests, never
    xdist's controller, which starts its workers as child processes.)"""
    if not request.config.getoption("--fast", default=False):
        yield
        return
    import subprocess

    from pyspark.sql import SparkSession

    from spanflow.local.cluster import LocalCluster
    from spanflow.nats.server import EmbeddedNats, NatsCluster

    def refuse(what: str) -> Any:
        def refused(*_: Any, **__: Any) -> Any:
            pytest.skip(f"the fast tier starts no {what}: run the full suite")

        return refused

    patches = [
        (EmbeddedNats, "start", "NATS server"),
        (NatsCluster, "start", "NATS cluster"),
        (LocalCluster, "start", "cluster"),
        (SparkSession.Builder, "getOrCreate", "Spark session"),
        (subprocess.Popen, "__init__", "child process"),
    ]
    with pytest.MonkeyPatch.context() as mp:
        for owner, name, what in patches:
            mp.setattr(owner, name, refuse(what))
        yield


FULL_BUDGET, FAST_BUDGET = 30 * 60.0, 3 * 60.0
"""Seconds the whole suite (2 cores, a fresh clone) and the fast tier may take."""


_started: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _started.append(time.monotonic())


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The run's duration against its budget, so a suite that outgrows it says so."""
    if not _started or hasattr(config, "workerinput"):  # the controller reports
        return
    took = time.monotonic() - _started[0]
    fast = config.getoption("--fast", default=False)
    budget = FAST_BUDGET if fast else FULL_BUDGET
    tier = "fast tier" if fast else "suite"
    verdict = "within" if took <= budget else "OVER"
    terminalreporter.write_line(
        f"{tier}: {took / 60:.1f} min, {verdict} its {budget / 60:.0f}-minute budget"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the modules holding slow (multi-process, SIGKILL) tests first, those that
    start clusters before the others (the worker that takes them is busy the longest).
    With ``--fast``, only the tests that need no server."""
    if config.getoption("--fast", default=False):
        _fast_tier(config, items)

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slow_modules = {module(item) for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        if module(item) not in slow_modules:
            return 2
        return 0 if module(item).startswith(CLUSTER_DIRS) else 1

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (what ``./dev test`` runs): every slow module that starts
    clusters on one worker, one after another; each other module a unit of its own. On
    two cores two clusters at once starve each other (and their timing bounds), while
    one cluster beside one single-process test leaves neither waiting. (pytest-xdist's
    own loadgroup names groups by rewriting node ids, which pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ClustersTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            clusters = module.startswith(CLUSTER_DIRS) and _is_slow_module(module)
            return "clusters" if clusters else module

    return ClustersTogether(config, log)


@pytest.fixture(autouse=True)
def _share_of_the_machine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """On parallel workers, a test marked ``solo`` (a timing bound that holds on a quiet
    machine only) has the machine to itself: it takes the workers' shared lock file
    exclusively, every other test takes it shared."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    solo = request.node.get_closest_marker("solo") is not None
    lock = tmp_path_factory.getbasetemp().parent / "machine.lock"
    with lock.open("a") as handle:
        asked = time.monotonic()
        fcntl.flock(handle, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
        _give_back_to_the_time_limit(time.monotonic() - asked)
        yield


def _give_back_to_the_time_limit(waited: float) -> None:
    """The wait for the machine (a solo test on the other worker, up to ten minutes) is
    not the test's own time: pytest-timeout's alarm (its signal method, armed for the
    whole item) is pushed back by as much."""
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    if remaining > 0 and waited > 0.5:
        signal.setitimer(signal.ITIMER_REAL, remaining + waited, interval)
