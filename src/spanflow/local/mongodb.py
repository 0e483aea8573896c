"""A MongoDB wire-protocol server on this machine, for examples and tests: nx-27017
(PyPI, extra ``mongodb-dev``), which keeps collections in SQLite and reports itself as
MongoDB 7.0. **It is an emulator, not MongoDB**: no real ``mongod`` can be installed
here. spanflow's MongoDB sink uses only plain driver calls (ping, bulk upserts), which
it serves.
"""

from __future__ import annotations

from spanflow.local.server import ProcessServer, free_port, venv_tool


class LocalMongo(ProcessServer):
    """nx-27017 on 127.0.0.1 with a temporary data directory."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/"

    def start(self, timeout: float = 20.0) -> LocalMongo:
        data = self._temporary_dir("spanflow-mongo-")
        program = str(venv_tool("nx-27017", "mongodb-dev"))
        args = [program, "--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(data),
                "--log-file", str(data / "nx.log"), "--pid-file", str(data / "nx.pid")]  # fmt: skip
        self._spawn(args, timeout)
        return self
