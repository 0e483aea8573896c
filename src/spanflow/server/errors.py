"""Errors at the edge of the server: every spanflow error class has an HTTP status.

A write that reaches a standby coordinator is redirected (307) to the leader.

Rooms and stores raise :class:`~spanflow.errors.SpanflowError` subclasses with a stable
``code``; the API answers ``{"code": ..., "detail": ...}`` with the status below.
:class:`RequestError` is for what only HTTP knows about (a bad body, a missing token).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from nats.errors import Error as NatsError

from spanflow.cep.rules import RuleSetError, RuleSetNotFound
from spanflow.control.errors import (
    Conflict,
    Invalid,
    NotFound,
    NotLeader,
    Unauthorized,
    Unavailable,
)
from spanflow.errors import InvalidModel, ModelError, ModelNotFound, SpanflowError, SpecError
from spanflow.nats.ranges import RangeCutShort


class RequestError(SpanflowError):
    """A request refused before it reaches the control plane."""

    def __init__(self, status: int, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


STATUSES: tuple[tuple[type[SpanflowError], int], ...] = (
    (Unauthorized, 401),
    (NotFound, 404),
    (ModelNotFound, 404),
    (RuleSetNotFound, 404),
    (RuleSetError, 409),
    (InvalidModel, 422),
    (ModelError, 409),
    (Conflict, 409),
    (Invalid, 422),
    (SpecError, 422),
    (Unavailable, 503),
)
"""First match wins: subclasses before the classes they refine."""


def status_of(exc: SpanflowError) -> int:
    if isinstance(exc, RequestError):
        return exc.status
    for cls, status in STATUSES:
        if isinstance(exc, cls):
            return status
    return 400


def install(app: FastAPI) -> None:
    @app.exception_handler(SpanflowError)
    async def spanflow_error(request: Request, exc: SpanflowError) -> Response:
        if isinstance(exc, NotLeader) and exc.leader_url:
            # A write reached a standby: send it to the leader (307 keeps method and body).
            target = exc.leader_url.rstrip("/") + request.url.path
            if request.url.query:
                target += f"?{request.url.query}"
            return RedirectResponse(target, status_code=307)
        status = status_of(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(
            {"code": exc.code, "detail": str(exc)}, status_code=status, headers=headers
        )

    async def nats_unavailable(request: Request, exc: Exception) -> Response:
        """NATS did not answer (a server restarting, a stream electing its leader):
        503, which clients retry on another replica, never a 500."""
        detail = f"NATS did not answer: {type(exc).__name__} {exc}".strip()
        return JSONResponse({"code": "nats_unavailable", "detail": detail}, status_code=503)

    app.add_exception_handler(NatsError, nats_unavailable)
    app.add_exception_handler(TimeoutError, nats_unavailable)
    app.add_exception_handler(RangeCutShort, nats_unavailable)
