"""The REST API's door before login (spanflow.security.limits), driven with raw ASGI
requests from chosen client addresses: wrong tokens are throttled per address and per
first characters; a valid token is never refused for others' wrong ones."""

from __future__ import annotations

import asyncio
from typing import Any

from spanflow.security.limits import RequestLimits, one_token
from spanflow.security.throttle import LoginThrottle

TOKEN = "operator-token-0123456789abcdef"


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _door() -> RequestLimits:
    return RequestLimits(
        _ok,
        authenticate=one_token(TOKEN),
        guarded=lambda method, path: True,
        limit_for=lambda path: 1024,
        throttle=LoginThrottle(failures=3, window=60, penalty=30),
    )


def _status(door: RequestLimits, client: str, token: str) -> int:
    scope = {"type": "http", "method": "GET", "path": "/api/v1/nodes", "client": (client, 5000),
             "headers": [(b"authorization", f"Bearer {token}".encode())]}  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(door(scope, receive, send))
    return int(sent[0]["status"])


def test_a_valid_token_gets_in_from_an_address_throttled_for_wrong_ones() -> None:
    door = _door()
    answers = [_status(door, "10.0.0.1", f"guess-{n:04d}-xyz") for n in range(5)]
    assert answers == [401, 401, 401, 429, 429]
    assert _status(door, "10.0.0.1", TOKEN) == 200  # the operator behind the same NAT
    assert _status(door, "10.0.0.1", "guess-9999-xyz") == 429  # the guesser still is not
    assert _status(door, "10.0.0.2", "other-guess") == 401  # another address is not


def test_one_token_guessed_from_many_addresses_is_throttled_by_its_first_characters() -> None:
    door = _door()
    answers = [_status(door, f"10.0.1.{n}", f"operator-guess-{n}") for n in range(5)]
    assert answers == [401, 401, 401, 429, 429]  # "operator" from five addresses
    assert _status(door, "10.0.1.9", TOKEN) == 200  # the real token shares them: let in
