"""Bounded before login: an ASGI middleware in front of the REST API and HTTP ingest.

FastAPI reads and parses a request's body before it runs the dependency that checks
the token, so a stranger's 256 MB body was held in memory before its 401. This layer
runs first, on the raw ASGI messages:

1. **Who**: a request the app guards (``guarded(method, path)``) must carry a bearer
   token ``authenticate`` knows before one byte of its body is read; a wrong one is
   answered 401 and the connection closed, a principal ``permits`` does not allow to
   do this is answered 403. Wrong tokens are throttled per address and per first
   characters (:class:`~spanflow.security.throttle.LoginThrottle`): 429 — but a valid
   token is always let in, whoever else failed from its address. The principal is
   left in the request's state (``request.state.principal``).
2. **How much**: a ``Content-Length`` over the path's limit is answered 413 at once;
   a body sent without one (chunked) is counted as it arrives and cut off at the
   limit. What the app then reads is the body held here, never more than the limit.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable
from typing import Any

from spanflow.security.throttle import LoginThrottle

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]

BODYLESS = ("GET", "HEAD", "OPTIONS")
TOKEN_PREFIX = 8
"""A wrong token's first characters, throttled as one guesser (from any address)."""


def bearer(headers: list[tuple[bytes, bytes]]) -> str:
    """The bearer token of raw ASGI headers ('' without one)."""
    for name, value in headers:
        if name.lower() == b"authorization":
            text = value.decode("latin-1").strip()
            if text[:7].lower() == "bearer ":
                return text[7:].strip()
    return ""


def token_matches(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


def one_token(token: str | None, principal: str = "operator") -> Callable[[str], str | None]:
    """``authenticate`` for a door with one token (None: the door is open)."""

    def authenticate(given: str) -> str | None:
        if token is None:
            return principal
        return principal if token_matches(given, token) else None

    return authenticate


class RequestLimits:
    """``RequestLimits(app, authenticate=..., guarded=..., limit_for=...)``.

    ``guarded(method, path)``: whether the request needs a token.
    ``authenticate(token)``: who holds it (a principal name), None for nobody.
    ``permits(principal, method, path)``: whether that principal may (default: yes).
    ``limit_for(path)``: the most bytes its body may have.
    """

    def __init__(
        self,
        app: Any,
        *,
        authenticate: Callable[[str], str | None],
        guarded: Callable[[str, str], bool],
        limit_for: Callable[[str], int],
        permits: Callable[[str, str, str], bool] | None = None,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.guarded = guarded
        self.permits = permits or (lambda principal, method, path: True)
        self.limit_for = limit_for
        self.throttle = throttle or LoginThrottle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if self.guarded(method, path):
            address = (scope.get("client") or ("?", 0))[0]
            given = bearer(scope["headers"])
            principal = self.authenticate(given)
            if principal is None:
                # Checking a token is cheap (a constant-time compare), so it is always
                # checked: a valid one is never refused for others' wrong ones from its
                # address; wrong ones are throttled per address and per first characters
                now, prefix = time.monotonic(), given[:TOKEN_PREFIX]
                if not self.throttle.may_check(address, prefix, now):
                    await _answer(send, 429, "throttled", "too many wrong tokens: wait")
                    return
                self.throttle.login_failed(address, prefix, now)
                await _answer(send, 401, "unauthorized", "missing or wrong bearer token")
                return
            if not self.permits(principal, method, path):
                await _answer(send, 403, "forbidden", f"{principal} may not {method} {path}")
                return
            scope.setdefault("state", {})["principal"] = principal
        if method in BODYLESS:
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(path)
        declared = _content_length(scope["headers"])
        if declared is not None and declared > limit:
            await _answer(
                send, 413, "too_large", f"body of {declared:,} bytes; at most {limit:,} here"
            )
            return
        body = await _read_body(receive, limit)
        if body is None:
            await _answer(
                send, 413, "too_large", f"body over {limit:,} bytes; at most {limit:,} here"
            )
            return
        await self.app(scope, _replay(body, receive), send)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes ``limit`` (or the client left)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as the server would

    return replay


async def _answer(send: Send, status: int, code: str, detail: str) -> None:
    """A JSON error, shaped as the API's others, that closes the connection (the
    unread body is not drained)."""
    data = json.dumps({"code": code, "detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"connection", b"close"),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
