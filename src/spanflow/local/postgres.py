"""A PostgreSQL server on this machine, for examples and tests.

Uses the Debian ``postgresql-15`` binaries (``/usr/lib/postgresql/<v>/bin``; the
project's set-up installs the package where it can). ``initdb`` refuses to run as
root, so a root process runs the server as the ``postgres`` user through ``runuser``.
Host connections need the password (SCRAM); the data directory is temporary.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from spanflow.errors import SpanflowError
from spanflow.local.server import LocalServer, free_port


class PostgresError(SpanflowError):
    code = "postgres_server"


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin directory."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise PostgresError(
            "no PostgreSQL server here: apt-get install postgresql-15 (`./dev test`'s set-up "
            "does it when run as root)"
        )
    return Path(found[-1]).parent


class LocalPostgres(LocalServer):
    """One PostgreSQL server on 127.0.0.1 with a fresh data directory."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.password = secrets.token_urlsafe(16)
        self.user = "postgres"
        self._dir: Path | None = None

    @property
    def dsn(self) -> str:
        """Where to connect, without the password (give it apart)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, args: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *args]
        return args

    def start(self, timeout: float = 30.0) -> LocalPostgres:
        bin_dir = postgres_bin()
        self._dir = Path(tempfile.mkdtemp(prefix="spanflow-pg-"))
        pwfile = self._dir / "pw"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(self._dir, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        os.chmod(self._dir, 0o700)
        data = self._dir / "data"
        subprocess.run(
            self._as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-U", self.user,
                               "--auth-local=trust", "--auth-host=scram-sha-256",
                               f"--pwfile={pwfile}", "--no-sync"]),
            check=True, capture_output=True, timeout=timeout,
        )  # fmt: skip
        options = f"-p {self.port} -k {self._dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        result = subprocess.run(
            self._as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-l",
                               str(self._dir / "pg.log"), "-w", "-t", str(int(timeout)),
                               "-o", options, "start"]),
            capture_output=True, timeout=timeout + 5,
        )  # fmt: skip
        if result.returncode != 0:
            log = (self._dir / "pg.log").read_text() if (self._dir / "pg.log").exists() else ""
            raise PostgresError(f"postgres did not start: {result.stderr.decode()} {log[-500:]}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise PostgresError(f"postgres did not listen on port {self.port}")

    def stop(self) -> None:
        if self._dir is None:
            return
        subprocess.run(
            self._as_postgres([str(postgres_bin() / "pg_ctl"), "-D", str(self._dir / "data"),
                               "-m", "immediate", "stop"]),
            capture_output=True, timeout=30,
        )  # fmt: skip
        shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
