"""A write that reaches a standby is redirected to the leader, and the client follows
with its token (httpx's own redirect following drops the Authorization header on the
way to another host: every node behind a standby then got 401 forever). Real HTTP
servers on loopback, one a standby that redirects, one a leader that checks the token."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from spanflow.protocol.client import CoordinatorClient

TOKEN = "node.edge-a-1.secret"


class _Leader(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Leader.seen.append((self.path, self.headers.get("Authorization"), body))
        ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def leader() -> Iterator[str]:
    _Leader.seen.clear()
    yield from _serve(_Leader)


def _standby_towards(target: str) -> type[BaseHTTPRequestHandler]:
    class Standby(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(307)
            self.send_header("Location", f"{target}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    return Standby


def test_a_redirect_to_the_leader_keeps_the_token_method_and_body(leader: str) -> None:
    for standby in _serve(_standby_towards(leader)):
        client = CoordinatorClient([standby, leader], TOKEN)
        r = client.request("POST", "/api/v1/nodes", {"name": "edge-a-1"})
        assert r.status_code == 200
        assert _Leader.seen == [("/api/v1/nodes", f"Bearer {TOKEN}", b'{"name":"edge-a-1"}')]
        assert client.url == leader  # the next request goes to the leader first


def test_a_redirect_from_https_to_plain_http_is_not_followed(
    leader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An https coordinator's answer naming a plain-http leader (no such coordinator
    exists here: the answer is made up) comes back as it is."""
    answer = httpx.Response(307, headers={"location": f"{leader}/api/v1/nodes"})
    answer.request = httpx.Request("POST", "https://127.0.0.1:1/api/v1/nodes")
    monkeypatch.setattr(httpx, "request", lambda *a, **k: answer)
    client = CoordinatorClient(["https://127.0.0.1:1"], TOKEN)
    assert client.request("POST", "/api/v1/nodes", {}).status_code == 307
    assert _Leader.seen == []  # the token never went out in the clear
