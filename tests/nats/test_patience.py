"""SyncNats.run_patiently: calls a micro-batch makes on its way to commit wait out a
leader election instead of failing the query — but not a refusal, nor forever."""

from __future__ import annotations

import time

import pytest
from nats.js.errors import NotFoundError

from spanflow.nats import streams
from spanflow.nats.streams import SyncNats


class Unanswered:
    """A call that goes unanswered ``silent`` times (hangs past the try's time-out),
    then answers."""

    def __init__(self, silent: int) -> None:
        self.silent, self.calls = silent, 0

    async def __call__(self) -> str:
        import asyncio

        self.calls += 1
        if self.calls <= self.silent:
            await asyncio.sleep(10)
        return "answered"


@pytest.fixture
def client(nats_url: str) -> SyncNats:
    c = SyncNats(nats_url)
    yield c  # type: ignore[misc]
    c.close()


def test_a_call_unanswered_for_a_while_is_tried_again_until_it_answers(client: SyncNats) -> None:
    call = Unanswered(silent=2)
    started = time.monotonic()
    assert client.run_patiently(call, "test", attempt=0.3, patience=5) == "answered"
    assert call.calls == 3
    assert time.monotonic() - started < 2.0  # two cut tries, not two 10-s waits


def test_a_refusal_ends_it_at_once(client: SyncNats) -> None:
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise PermissionError("fenced")

    with pytest.raises(PermissionError):
        client.run_patiently(refused, "test", permanent=(PermissionError,), patience=5)
    assert calls == 1

    async def missing() -> None:
        raise NotFoundError()

    with pytest.raises(NotFoundError):
        client.run_patiently(missing, "test", patience=5)


def test_silence_longer_than_the_patience_is_an_error(
    client: SyncNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams, "RETRY_PAUSE", 0.05)
    call = Unanswered(silent=100)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        client.run_patiently(call, "test", attempt=0.2, patience=1.0)
    assert 1.0 <= time.monotonic() - started < 3.0
    assert call.calls >= 3
