"""HTTP ingest: devices and services POST JSON readings; the answer comes once
JetStream has stored them.

``POST /ingest/<subject>`` with a JSON body — one object (or value) is one message, a
JSON array is one message per element, ``application/x-ndjson`` is one per line —
publishes each to ``<subject>`` and waits for JetStream's acknowledgement:

* **200** ``{"stored": n, "stream": ..., "first_seq": ..., "last_seq": ...}``: every
  message is stored (a reading told 200 is never lost);
* **400** with the reason (and the line or element) for a body that is not JSON, or
  an empty one; **413** for one over ``max_body`` bytes; **401** without the token
  when one is configured;
* **403** for a subject of spanflow's own (``spanflow.>``: the control plane, heartbeats,
  reports, fragment cuts) or of NATS's (``_INBOX``): ingest takes readings only; and
  for a subject a device group's token does not cover (security/ingest_tokens.py);
* **404** when no stream captures the subject; **503** when JetStream does not answer
  in time or refuses (a full stream with ``discard: new``): nothing is acknowledged,
  so the client retries.

Bounded before login (spanflow.security.limits): the token is checked before the body is
read, and a body over ``max_body`` is refused on its ``Content-Length`` or cut off as it
arrives. Locked, ingest publishes as the ``device`` role, so NATS itself keeps it to
readings whatever a request names.

An ``Idempotency-Key`` header makes a retried POST store nothing twice: each
message's ``Nats-Msg-Id`` is ``<key>`` (or ``<key>:<n>`` for the n-th element), which
JetStream de-duplicates within the stream's duplicate window. Stored messages carry
no other change: what a pipeline's source reads is the JSON as posted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from spanflow.nats.streams import NoStreamCaptures, connect, publish_patiently, subject_covers
from spanflow.security import ingest_tokens
from spanflow.security.environment import secrets_from_env
from spanflow.security.https import require_tls
from spanflow.security.limits import RequestLimits
from spanflow.security.policy import require_token
from spanflow.security.secrets import NatsIdentity

MAX_BODY = 4 * 1024 * 1024
INGEST_TIMEOUT = 10.0
RESERVED_PREFIXES = ("spanflow.", "_INBOX")
"""Subjects ingest never publishes on (403)."""


class BadBody(ValueError):
    """The body is not what the endpoint takes; the message says why and where."""


def split_body(body: bytes, content_type: str) -> list[bytes]:
    """The messages a body stands for, each as compact JSON (BadBody if malformed).

    >>> split_body(b'[{"t": 1}, 2]', "application/json")
    [b'{"t":1}', b'2']
    >>> split_body(b'{"t": 1}\\n{"t": 2}\\n', "application/x-ndjson")
    [b'{"t":1}', b'{"t":2}']
    """
    if not body.strip():
        raise BadBody("empty body: send a JSON object, a JSON array or JSON lines")
    if "ndjson" in content_type or "jsonlines" in content_type:
        out = []
        for n, line in enumerate(body.splitlines(), start=1):
            if line.strip():
                out.append(_compact(line, f"line {n}"))
        return out
    value = _parse(body, "body")
    if isinstance(value, list):
        if not value:
            raise BadBody("an empty JSON array has no readings")
        return [orjson.dumps(v) for v in value]
    return [orjson.dumps(value)]


def _parse(data: bytes, where: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadBody(f"{where}: not valid JSON: {exc}") from None


def _compact(data: bytes, where: str) -> bytes:
    return orjson.dumps(_parse(data, where))


def ingest_identity() -> NatsIdentity | None:
    """Locked: the shared ``device`` role (readings only, never ``spanflow.>``,
    ``$JS.>``, ``$KV.>``); open: none."""
    found = secrets_from_env()
    return None if found is None else found.identity("device")


def create_ingest_app(
    nats_url: str, token: str | None = None, *, identity: NatsIdentity | None = None
) -> FastAPI:
    """The ingest endpoint over the NATS server at ``nats_url``, publishing as
    ``identity`` (default :func:`ingest_identity`)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.nc = await connect(nats_url, identity=identity or ingest_identity())
        yield
        await app.state.nc.close()

    app = FastAPI(title="spanflow ingest", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/ingest/{subject}")
    async def ingest(subject: str, request: Request) -> JSONResponse:
        # the token and the body's size were checked before the body was read (limits)
        if not _valid_subject(subject):
            return _error(400, f"{subject!r} is not a subject (tokens of letters, digits, -_)")
        if subject.startswith(RESERVED_PREFIXES):
            return _error(403, f"{subject!r} is spanflow's own subject: ingest takes readings")
        pattern = ingest_tokens.group_pattern(getattr(request.state, "principal", None))
        if pattern is not None and not subject_covers(pattern, subject):
            return _error(403, f"this token publishes on {pattern} only, not {subject}")
        body = await request.body()
        try:
            messages = split_body(body, request.headers.get("content-type", ""))
        except BadBody as exc:
            return _error(400, str(exc))
        key = request.headers.get("idempotency-key")
        return await _store(request.app.state.nc, subject, messages, key)

    app.add_middleware(
        RequestLimits,
        authenticate=ingest_tokens.ingest_authenticator(token),
        guarded=lambda method, path: token is not None and path.startswith("/ingest/"),
        limit_for=lambda path: MAX_BODY,
    )
    return app


def _valid_subject(subject: str) -> bool:
    tokens = subject.split(".")
    return all(t and all(c.isalnum() or c in "-_" for c in t) for t in tokens)


async def _store(nc: Any, subject: str, messages: list[bytes], key: str | None) -> JSONResponse:
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import APIError, NoStreamResponseError

    js = nc.jetstream()
    acks = []
    try:
        for n, message in enumerate(messages):
            headers = None
            if key:
                headers = {"Nats-Msg-Id": key if len(messages) == 1 else f"{key}:{n}"}
            ack = await publish_patiently(
                js, subject, message, headers=headers, timeout=INGEST_TIMEOUT
            )
            acks.append(ack)
    except NoStreamCaptures as exc:
        return _error(404, str(exc), stored=len(acks))
    except (NoRespondersError, NoStreamResponseError):
        return _error(503, "the stream elects a leader: retry", stored=len(acks))
    except NatsTimeout:
        return _error(503, "JetStream did not acknowledge in time: retry", stored=len(acks))
    except APIError as exc:
        return _error(503, f"JetStream refused: {exc.description}", stored=len(acks))
    return JSONResponse(
        {
            "stored": len(acks),
            "duplicates": sum(bool(a.duplicate) for a in acks),
            "stream": acks[0].stream,
            "first_seq": acks[0].seq,
            "last_seq": acks[-1].seq,
        }
    )


def _error(status: int, detail: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status)


class IngestServer:
    """The ingest app served by uvicorn in a background thread (``spanflow run``,
    ``spanflow site-server``). ``tls``: (certificate, key) to serve HTTPS with; beyond
    loopback it is required (a token must not cross the network in clear)."""

    def __init__(
        self,
        nats_url: str,
        host: str,
        port: int,
        token: str | None = None,
        *,
        tls: tuple[str, str] | None = None,
    ) -> None:
        import uvicorn

        require_token("HTTP ingest", host, token, "--http-token")
        require_tls("HTTP ingest", host, tls is not None)
        config = uvicorn.Config(
            create_ingest_app(nats_url, token),
            host=host,
            port=port,
            log_level="warning",
            ssl_certfile=tls[0] if tls else None,
            ssl_keyfile=tls[1] if tls else None,
        )
        self.server = uvicorn.Server(config)
        self.host, self.port = host, port
        self.scheme = "https" if tls else "http"
        self._thread: Any = None

    def start(self, timeout: float = 10.0) -> IngestServer:
        import threading
        import time

        self._thread = threading.Thread(target=self.server.run, name="ingest", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"HTTP ingest did not start on {self.host}:{self.port}")
            time.sleep(0.05)
        if self.port == 0:  # a free port was asked for: which one it got
            self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
