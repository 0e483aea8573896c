"""The REST error mapping: what a coordinator cannot answer because NATS is catching up
is a 503 (clients try another replica), never a 500."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from spanflow.nats.ranges import RangeCutShort
from spanflow.server.errors import install


@pytest.mark.parametrize(
    "problem",
    [RangeCutShort("behind the leader"), TimeoutError("no answer"), ValueError("a bug")],
)
def test_a_lagging_nats_read_is_a_503_and_a_bug_stays_a_500(problem: Exception) -> None:
    app = FastAPI()
    install(app)

    @app.get("/read")
    async def read() -> None:
        raise problem

    answer = TestClient(app, raise_server_exceptions=False).get("/read")
    expected = 500 if isinstance(problem, ValueError) else 503
    assert answer.status_code == expected
    if expected == 503:
        assert answer.json()["code"] == "nats_unavailable"
