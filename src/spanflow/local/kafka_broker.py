"""Apache Kafka on this machine, for examples and tests: one broker or a cluster of
three, in KRaft mode (no ZooKeeper), from Maven Central's jars.

The broker is the real thing (``org.apache.kafka:kafka_2.13``), so what the tests see
of transactions, ``read_committed`` readers, fencing and leader changes is what a
production cluster does. Its jars are fetched once with Maven (``spanflow.maven``);
each node runs in its own JVM (a small heap, the serial collector) over a temporary
log directory, and is both broker and controller. A node listens on two ports of
127.0.0.1: clients on ``port``, the controller quorum on ``controller_port``.
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import uuid
from pathlib import Path

from spanflow.errors import SpanflowError
from spanflow.local.server import LocalServer, ProcessServer, free_port
from spanflow.maven import Artifacts, classpath

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
BROKER_JARS = Artifacts(
    "kafka-broker",
    (f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}", "org.slf4j:slf4j-simple:1.7.36"),
)
JVM_OPTIONS = ["-Xms64m", "-Xmx320m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"]  # fmt: skip
"""A small heap and the C1 compiler only: a test broker starts sooner and takes less of
a two-core machine; Kafka's own defaults are sized for a server of its own."""


class BrokerError(SpanflowError):
    code = "kafka_broker"


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding, never
    starting with '-' (Kafka's own ``Uuid.randomUuid`` draws again then: the storage
    tool would read ``-t -x…`` as a missing id and refuse to format, 1 start in 64)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


class KafkaNode(ProcessServer):
    """One KRaft node (broker and controller) of a cluster of ``len(voters)`` nodes."""

    def __init__(self, node_id: int, voters: dict[int, int], cluster_id: str,
                 port: int | None = None, log: Path | None = None) -> None:  # fmt: skip
        self.node_id = node_id
        self.voters = voters
        """node id → controller port, for every node of the cluster."""
        self.cluster_id = cluster_id
        self.port = port or free_port()
        self.log = log
        self._config: Path | None = None

    @property
    def controller_port(self) -> int:
        return self.voters[self.node_id]

    def properties(self, log_dir: Path) -> dict[str, str]:
        replicas = str(min(3, len(self.voters)))
        in_sync = "2" if len(self.voters) >= 3 else "1"
        quorum = ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(self.voters.items()))
        return {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": quorum,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(log_dir),
            "default.replication.factor": replicas,
            "min.insync.replicas": in_sync,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            "transaction.state.log.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0",
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "log.flush.interval.messages": "1000000",
        }

    def start(self, timeout: float = 60.0) -> KafkaNode:
        self.launch()
        self.wait(timeout)
        return self

    def launch(self) -> None:
        """Start the node's JVM without waiting: a broker opens its port only once a
        majority of the controllers has elected a leader, so a cluster's nodes are all
        launched before any is awaited."""
        jars = os.pathsep.join(str(j) for j in classpath(BROKER_JARS))
        if self._config is None:  # the first start formats the node's storage
            folder = self._temporary_dir(f"spanflow-kafka{self.node_id}-")
            self._config = folder / "server.properties"
            lines = (f"{k}={v}" for k, v in self.properties(folder / "data").items())
            self._config.write_text("\n".join(lines) + "\n")
            self._format(jars)
        self._launch([java_binary(), *JVM_OPTIONS, "-cp", jars, "kafka.Kafka", str(self._config)],
                     self.log)  # fmt: skip

    def wait(self, timeout: float) -> None:
        self._await_port(timeout, f"kafka node {self.node_id}", self.log)

    def _format(self, jars: str) -> None:
        assert self._config is not None
        args = [java_binary(), "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", jars,
                "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c",
                str(self._config), "--ignore-formatted"]  # fmt: skip
        for attempt in (1, 2):  # it failed now and then in tests, cause not seen yet
            done = subprocess.run(args, capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                return
            log.warning("kafka storage format failed (exit %d, try %d): %s",
                        done.returncode, attempt, done.stderr[-2000:])  # fmt: skip
        raise BrokerError(
            f"kafka storage format failed (exit {done.returncode}): "
            f"{done.stderr[-2000:] or done.stdout[-2000:]}"
        )

    def stop(self) -> None:
        """Kill the node and remove its data (a test broker's data is temporary, and a
        controlled shutdown waits for a quorum that may be stopping too)."""
        self.kill()
        super().stop()

    def kill(self) -> None:
        """SIGKILL the node (its data stays, for ``start`` again)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None


class LocalKafka(LocalServer):
    """Apache Kafka on 127.0.0.1: ``brokers`` KRaft nodes (1 or 3), each broker and
    controller; topics replicated ``min(3, brokers)`` times, ``min.insync.replicas``
    2 on three nodes. A context manager; ``bootstrap`` names every node."""

    def __init__(self, brokers: int = 1, log_dir: Path | None = None) -> None:
        if brokers < 1:
            raise BrokerError("a Kafka cluster needs at least one broker")
        voters = {n: free_port() for n in range(1, brokers + 1)}
        cluster_id = new_cluster_id()
        self.nodes = [
            KafkaNode(n, voters, cluster_id, log=log_dir / f"kafka{n}.log" if log_dir else None)
            for n in voters
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 90.0) -> LocalKafka:
        """Start every node at once (a quorum of controllers elects its leader only
        when most of them are up) and wait until each listens."""
        classpath(BROKER_JARS)  # fetched once, before any node needs it
        try:
            for node in self.nodes:
                node.launch()
            for node in self.nodes:
                node.wait(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def fetch_jars() -> int:
    """Fetch the broker's jars now (the project's set-up does, so tests need not)."""
    return len(classpath(BROKER_JARS))


if __name__ == "__main__":
    print(f"kafka broker: {fetch_jars()} jars ready")
