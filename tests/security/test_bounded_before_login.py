"""Bounded before login, against real processes: a locked coordinator (its own embedded
NATS, the REST API on uvicorn) and a locked site server's MQTT gateway and HTTP ingest.
A stranger's huge body or CONNECT is refused before it is read, memory stays within
50 MB of idle, and the API keeps answering while a token holder's large pipeline file
is parsed."""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from spanflow.security.secrets import Secrets

MB = 1024 * 1024


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPANFLOW_")}
    return {**env, **extra}


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def _wait_for(condition: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _raw_post(
    host: str,
    port: int,
    path: str,
    size: int,
    headers: str = "",
    chunked: bool = False,
    send_body: bool = True,
) -> bytes:
    """POST ``size`` bytes the way an attacker would: headers, then as much of the body
    as the server takes (none without ``send_body``); returns whatever the server
    answered. A server that answers and closes with body bytes still unread resets
    the connection, which may cut the answer after its status line: read what a
    server says in full by sending no body."""
    sock = socket.create_connection((host, port), timeout=30)
    length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"{headers}{length}\r\n\r\n".encode()
    )
    block = b"x" * MB
    sent = 0 if send_body else size
    try:
        while sent < size:
            if chunked:
                sock.sendall(b"%x\r\n" % len(block) + block + b"\r\n")
            else:
                sock.sendall(block)
            sent += len(block)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed: what we want
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    sock.close()
    return answer


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, str]]:
    """(pid, port, token) of a locked coordinator process."""
    data = tmp_path_factory.mktemp("coordinator")
    secrets = Secrets(data / "secrets")
    secrets.init()
    port_file, log = data / "port", data / "coordinator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spanflow.cli", "coordinator", "--port", "0",
             "--port-file", str(port_file), "--data-dir", str(data)],
            stdout=out, stderr=subprocess.STDOUT, env=_clean_env(),
        )  # fmt: skip
    try:
        _wait_for(lambda: port_file.exists() and port_file.read_text(), "no port")
        port = int(port_file.read_text())

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).is_success
            except httpx.HTTPError:
                return False

        _wait_for(healthy, "the coordinator never answered /healthz")
        yield proc.pid, port, secrets.credentials().rest_token or ""
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_strangers_huge_body_is_refused_before_it_is_read(
    coordinator: tuple[int, int, str],
) -> None:
    pid, port, token = coordinator
    idle = _rss(pid)
    answer = _raw_post("127.0.0.1", port, "/api/v1/pipelines", 256 * MB)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    answer = _raw_post("127.0.0.1", port, "/api/v1/pipelines", 256 * MB, chunked=True)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    # the token holder's oversized body: refused on its length, and when it declares none
    auth = f"Authorization: Bearer {token}\r\n"
    answer = _raw_post("127.0.0.1", port, "/api/v1/pipelines", 64 * MB, headers=auth)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    answer = _raw_post("127.0.0.1", port, "/api/v1/pipelines", 64 * MB, auth, chunked=True)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # what the refusal says, read in full (no body bytes left unread to reset it)
    answer = _raw_post("127.0.0.1", port, "/api/v1/pipelines", 64 * MB, auth, send_body=False)
    assert answer.startswith(b"HTTP/1.1 413") and b"at most" in answer, answer[:300]
    assert _rss(pid) - idle < 50 * MB, f"{(_rss(pid) - idle) / MB:.0f} MB over idle"
    # the API still works for the token holder
    ok = httpx.get(
        f"http://127.0.0.1:{port}/api/v1/pipelines", headers={"Authorization": f"Bearer {token}"}
    )
    assert ok.status_code == 200


def test_the_api_answers_while_a_large_pipeline_file_is_parsed(
    coordinator: tuple[int, int, str],
) -> None:
    _, port, token = coordinator
    # a pipeline file of 300 KB: a long list that YAML parses for seconds
    lines = ["name: big", "description: many", "sources:"]
    lines += [
        f"  - {{id: s{n}, stream: S{n}, schema: {{x: long}}, to: [out]}}" for n in range(5000)
    ]
    text = "\n".join(lines) + "\n"
    assert 256 * 1024 < len(json.dumps({"yaml": text})) < 2 * MB
    answers: list[int] = []

    def submit() -> None:
        answers.append(
            httpx.post(
                f"http://127.0.0.1:{port}/api/v1/pipelines",
                json={"yaml": text},
                headers={"Authorization": f"Bearer {token}"},
                timeout=120,
            ).status_code
        )

    worker = threading.Thread(target=submit)
    began = time.monotonic()
    worker.start()
    slowest, asked = 0.0, 0
    while worker.is_alive():
        start = time.monotonic()
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).is_success
        slowest = max(slowest, time.monotonic() - start)
        asked += 1
        time.sleep(0.05)
    worker.join()
    parsing = time.monotonic() - began
    assert answers and 400 <= answers[0] < 500  # refused for what it says, not for its size
    # Parsed on the event loop, /healthz would wait for the whole parse; off it, the
    # slowest answer is a small part of it (relative: the machine may be busy).
    assert asked >= 5 and slowest < parsing / 4, (slowest, parsing, asked)


def _site_server(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    secrets = Secrets(tmp_path / "secrets")
    secrets.init()
    log = tmp_path / "site.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spanflow.cli", "site-server", "--site", "s1",
             "--listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0",
             "--http-listen", "127.0.0.1:0", "--data-dir", str(tmp_path)],
            stdout=out, stderr=subprocess.STDOUT, env=_clean_env(),
        )  # fmt: skip
    return proc, log


def _ingest_token_printed(secrets_dir: Path, site: str) -> str:
    """What ``spanflow secrets ingest-token SITE`` prints."""
    done = subprocess.run(
        [sys.executable, "-m", "spanflow.cli", "secrets", "ingest-token", site,
         "--secrets-dir", str(secrets_dir)],
        capture_output=True, text=True, env=_clean_env(), check=True,
    )  # fmt: skip
    return done.stdout.strip()


def _line(log: Path, pattern: str, proc: subprocess.Popen[bytes]) -> re.Match[str]:
    found: list[re.Match[str]] = []

    def seen() -> bool:
        assert proc.poll() is None, log.read_text()
        match = re.search(pattern, log.read_text(errors="replace"))
        if match:
            found.append(match)
        return bool(match)

    _wait_for(seen, f"no {pattern!r} in the site server's output")
    return found[0]


def test_oversized_connects_and_bodies_before_login_stay_bounded(tmp_path: Path) -> None:
    proc, log = _site_server(tmp_path)
    try:
        mqtt_port = int(_line(log, r"MQTT listener on [\d.]+:(\d+)", proc).group(1))
        http_port = int(_line(log, r"HTTP ingest on [\d.]+:(\d+)", proc).group(1))
        idle = _rss(proc.pid)
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        # 16 connections each announcing an 8 MB CONNECT (0x10, remaining length 8 MB)
        refused = 0
        for _ in range(16):
            raw = socket.create_connection(("127.0.0.1", mqtt_port), timeout=15)
            tls = context.wrap_socket(raw)
            tls.sendall(b"\x10\x80\x80\x80\x04")  # 8 MB remaining length
            try:
                for _ in range(8):
                    tls.sendall(b"\0" * MB)
                refused += tls.recv(1) == b""
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
                refused += 1
            tls.close()
        assert refused == 16, "the gateway read an 8 MB CONNECT before login"
        # a stranger's 64 MB ingest body and a token holder's: refused before reading
        answer = _raw_post("127.0.0.1", http_port, "/ingest/sensors.x", 64 * MB)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        # the hub's ingest takes its site's own ingest token, never the operator's
        creds = Secrets(tmp_path / "secrets").credentials()
        token = _ingest_token_printed(tmp_path / "secrets", "s1")
        assert token.startswith("ingest.s1.") and token != creds.rest_token
        operator = httpx.post(f"http://127.0.0.1:{http_port}/ingest/sensors.x", json={"t": 1},
                              headers={"Authorization": f"Bearer {creds.rest_token}"})  # fmt: skip
        assert operator.status_code == 401, operator.text
        auth = f"Authorization: Bearer {token}\r\n"
        answer = _raw_post("127.0.0.1", http_port, "/ingest/sensors.x", 64 * MB, auth, True)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert _rss(proc.pid) - idle < 50 * MB, f"{(_rss(proc.pid) - idle) / MB:.0f} MB"
        # ingest never publishes on spanflow's own subjects
        for subject in ("spanflow.wal.site", "spanflow.heartbeat.n1", "_INBOX.x"):
            denied = httpx.post(
                f"http://127.0.0.1:{http_port}/ingest/{subject}",
                json={"kind": "site"},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert denied.status_code == 403, (subject, denied.text)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
