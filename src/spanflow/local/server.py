"""What every server started on this machine shares: a free port, a context manager."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spanflow.errors import SpanflowError
from spanflow.nats.server import Managed


def venv_tool(name: str, extra: str) -> Path:
    """A program a wheel installs beside this Python (or one on PATH)."""
    beside = Path(sys.executable).parent / name
    found = beside if beside.exists() else shutil.which(name)
    if not found:
        raise SpanflowError(f"no {name} here: pip install 'spanflow[{extra}]'")
    return Path(found)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalServer(Managed):
    """A server started on this machine (a test or example server, a broker)."""


class ProcessServer(LocalServer):
    """A server that is one child process listening on ``port`` of 127.0.0.1."""

    port: int
    _proc: subprocess.Popen[bytes] | None = None
    _dir: Path | None = None
    """Its temporary data directory, removed when it stops."""

    def _spawn(self, args: list[str], timeout: float, log: Path | None = None) -> None:
        """Start ``args`` and wait until the port accepts connections (a SpanflowError
        naming the program when it exits or stays silent)."""
        self._launch(args, log)
        self._await_port(timeout, Path(args[0]).name, log)

    def _launch(self, args: list[str], log: Path | None = None) -> None:
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _await_port(self, timeout: float, name: str, log: Path | None = None) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                raise SpanflowError(
                    f"{name} exited with {code}" + (f" (log: {log})" if log else "")
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self._terminate()
        raise SpanflowError(f"{name} did not listen on port {self.port} within {timeout:g} s")

    def _temporary_dir(self, prefix: str) -> Path:
        self._dir = Path(tempfile.mkdtemp(prefix=prefix))
        return self._dir

    def stop(self) -> None:
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _terminate(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
