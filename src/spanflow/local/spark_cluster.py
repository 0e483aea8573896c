"""A Spark standalone cluster from the pyspark wheel: one master and its workers.

The wheel ships no ``start-master.sh``, but ``bin/spark-class`` runs the master and
worker classes. ``spanflow spark-cluster`` starts one for a site (all on this machine,
or ``--master-only`` here and ``spanflow spark-cluster --join spark://…`` on each other
machine); a node then runs its fragments on it with ``spanflow node --master
spark://HOST:PORT``. The master's web UI answers ``/json/`` with the cluster's workers,
cores and memory: what a node on the cluster offers the planner
(:func:`cluster_capacity`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from spanflow.errors import SpanflowError
from spanflow.local.server import free_port
from spanflow.spark.jvm.java import ensure_java_home

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(SpanflowError):
    code = "spark_cluster"


@dataclass(frozen=True)
class Capacity:
    """What a Spark cluster's alive workers offer."""

    workers: int
    cores: int
    memory_mb: int


def spark_home() -> Path:
    """The pyspark wheel's directory (its ``bin/spark-class`` and ``jars``)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkClusterError("pyspark is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def cluster_capacity(ui_url: str, timeout: float = 5.0) -> Capacity:
    """The alive workers' cores and memory, from the master's web UI (``/json/``)."""
    url = ui_url.rstrip("/") + "/json/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            doc = json.loads(answer.read())
    except (OSError, ValueError) as exc:
        raise SparkClusterError(
            f"the Spark master's web UI at {url} did not answer: {exc}"
        ) from exc
    alive = [w for w in doc.get("workers", []) if w.get("state") == "ALIVE"]
    return Capacity(
        workers=len(alive),
        cores=sum(int(w.get("cores", 0)) for w in alive),
        memory_mb=sum(int(w.get("memory", 0)) for w in alive),
    )


def master_ui_of(master: str) -> str:
    """The web UI of a standalone master by convention: its host, port 8080."""
    host = urlparse(master.replace("spark://", "http://", 1)).hostname or "127.0.0.1"
    return f"http://{host}:8080"


class LocalSparkCluster:
    """A master and ``workers`` workers on this machine (``with`` starts and stops them);
    with ``join``, only workers, for a master that runs elsewhere (another machine of
    the site)."""

    def __init__(
        self,
        *,
        workers: int = 1,
        cores: int = 1,
        memory: str = "1g",
        host: str = "127.0.0.1",
        port: int | None = None,
        ui_port: int | None = None,
        work_dir: Path | None = None,
        join: str | None = None,
        join_ui: str | None = None,
    ) -> None:
        self.workers, self.cores, self.memory, self.host = workers, cores, memory, host
        self.join = join
        """A running master's ``spark://HOST:PORT``: start only workers here, for it."""
        self.port = port or free_port(host)
        self.ui_port = ui_port or free_port(host)
        self._join_ui = join_ui
        self._own_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="spanflow-spark-"))
        self._procs: list[subprocess.Popen[bytes]] = []
        self._workers: dict[int, subprocess.Popen[bytes]] = {}
        self.worker_ui_ports: list[int] = []
        """Each worker's web UI port, by index (how its executors' log links name it)."""

    @property
    def master_url(self) -> str:
        return self.join or f"spark://{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        if self.join:
            return self._join_ui or master_ui_of(self.join)
        return f"http://{self.host}:{self.ui_port}"

    def start(self, timeout: float = 120.0) -> LocalSparkCluster:
        ensure_java_home()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        if self.join is None:
            self._spawn(
                "master",
                [
                    *(MASTER_CLASS, "--host", self.host, "--port", str(self.port)),
                    *("--webui-port", str(self.ui_port)),
                ],
            )
        self._wait(deadline, lambda: self._capacity() is not None, "the master")
        before = self._capacity()
        expected = (before.workers if before and self.join else 0) + self.workers
        for i in range(self.workers):
            self._spawn_worker(i)
        self._wait(deadline, lambda: self._alive(expected), f"{self.workers} worker(s)")
        return self

    def add_worker(self, timeout: float = 120.0) -> int:
        """One more worker (a machine joining the site's cluster); its index, once the
        master counts it alive."""
        index = len(self.worker_ui_ports)
        self._spawn_worker(index)
        alive = self._capacity()
        expected = (alive.workers if alive else 0) + 1
        self._wait(time.monotonic() + timeout, lambda: self._alive(expected), "the new worker")
        return index

    def kill_worker(self, index: int) -> None:
        """SIGKILL a worker and the executors it launched (its process group), as a
        machine's death would."""
        proc = self._workers[index]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def _spawn_worker(self, index: int) -> None:
        worker_dir = self.work_dir / f"worker-{index}"
        worker_dir.mkdir(exist_ok=True)
        ui_port = free_port(self.host)
        self.worker_ui_ports.append(ui_port)
        self._spawn(
            f"worker-{index}",
            [
                *(WORKER_CLASS, "--host", self.host, "--cores", str(self.cores)),
                *("--memory", self.memory, "--work-dir", str(worker_dir)),
                *("--webui-port", str(ui_port), self.master_url),
            ],
        )
        self._workers[index] = self._procs[-1]

    def _alive(self, workers: int) -> bool:
        capacity = self._capacity()
        return capacity is not None and capacity.workers >= workers

    def _capacity(self) -> Capacity | None:
        try:
            return cluster_capacity(self.ui_url, timeout=1.0)
        except SparkClusterError:
            return None

    def _spawn(self, name: str, args: list[str]) -> None:
        home = spark_home()
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": self.host}
        env.setdefault("SPARK_NO_DAEMONIZE", "1")
        log = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 (the child's)
        self._procs.append(
            subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        )

    def _wait(self, deadline: float, ready: Callable[[], bool], what: str) -> None:
        killed = {id(p) for i, p in self._workers.items() if p.poll() is not None}
        while time.monotonic() < deadline:
            if any(p.poll() is not None and id(p) not in killed for p in self._procs):
                self._terminate()  # the logs stay, for the error to point at
                raise SparkClusterError(f"{what} exited at start-up (logs in {self.work_dir})")
            if ready():
                return
            time.sleep(0.25)
        self._terminate()
        raise SparkClusterError(f"{what} did not come up (logs in {self.work_dir})")

    def stop(self) -> None:
        self._terminate()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _terminate(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs = []

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
