"""JetStream helpers shared by the CLI, the runner and the Spark connectors."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, ExternalStream, StreamConfig, StreamSource
from nats.js.errors import APIError, NotFoundError

import nats
from spanflow.errors import NatsError, SecurityError
from spanflow.nats.cluster import resolve_replicas
from spanflow.protocol.metrics import StreamUsage
from spanflow.security.credentials import NODE_USER_PREFIX
from spanflow.security.environment import identity_from_env
from spanflow.security.nats_config import redact_url
from spanflow.security.secrets import NatsIdentity
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.retention import DEFAULT_RETENTION, Retention

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_DUPLICATE_WINDOW = 15 * 60.0
"""Seconds a sink stream remembers message ids. Longer than any restart we expect:
a pipeline that restarts from its checkpoint replays at most the batches since the
last commit, within this window."""


def server_list(url: str) -> list[str]:
    """``"nats://a:4222,nats://b:4222"`` → each server of a cluster (one URL: itself)."""
    return [u.strip() for u in url.split(",") if u.strip()]


class _DropEofNotice(logging.Filter):
    """asyncio warns "returning true from eof_received() has no effect when using ssl"
    on every TLS connection nats-py closes: noise, not a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received()" not in record.getMessage()


_EOF_FILTER = _DropEofNotice()


def _quiet_asyncio_tls_notice() -> None:
    logging.getLogger("asyncio").addFilter(_EOF_FILTER)  # adding twice is a no-op


TLS_ALERTS = ("unknown ca", "bad certificate", "certificate expired", "certificate required")


def refusal(exc: BaseException) -> str | None:
    """Why a NATS server refused us, if ``exc`` is a refusal that retrying cannot cure
    (a wrong password, a certificate the other side does not trust); None for errors
    worth retrying (a server down, a reset link)."""
    text = str(exc)
    lowered = text.lower()
    if "authorization violation" in lowered:
        return "wrong user or password (Authorization Violation)"
    if "authentication expired" in lowered or "authentication revoked" in lowered:
        return f"credentials no longer valid ({text.strip()})"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"the server's certificate is not trusted ({exc.verify_message}): "
            "unknown CA, wrong host name, or expired"
        )
    if isinstance(exc, ssl.SSLError):
        for alert in (
            "unknown ca",
            "bad certificate",
            "certificate expired",
            "certificate required",
        ):
            if alert in lowered:
                return f"the server refused our client certificate (TLS alert: {alert})"
    return None


PING_INTERVAL = 2.0
"""Seconds between a client's pings to its server. A server whose host died, or a link
that went silent, closes nothing: the client learns of it only from pings left
unanswered (nats-py's default, one every 2 minutes, left a node writing into a dead
link for minutes, its peers told its data path was up)."""
MAX_OUTSTANDING_PINGS = 3
"""Unanswered pings after which the connection is stale and the client moves to
another server: a silent link is left within 6 to 8 s (and :data:`CONNECT_TIMEOUT` more
when the next try is the same silent server)."""
CONNECT_TIMEOUT = 5.0
"""Seconds one connection attempt may take (TCP, TLS and NATS's greeting)."""


async def connect(url: str, *, identity: NatsIdentity | None = None, **options: Any) -> Client:
    """Connect with settings suited to a long-lived data-path client. ``url`` may list
    the servers of a cluster, comma-separated: the client fails over between them.

    ``identity`` (default: this process's, from ``SPANFLOW_SECRETS``/``SPANFLOW_ROLE``;
    none in open mode) supplies the user, password and TLS files. A refusal no retry can
    cure — a wrong password, an unknown CA, an expired certificate — fails at once with
    :class:`SecurityError` naming the door and the cause, instead of retrying forever."""
    identity = identity or identity_from_env()
    if identity is not None:
        options = {**identity.connect_options(), **options}
        _quiet_asyncio_tls_notice()
    caller_cb = options.pop("error_cb", None)
    refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    reported: set[str] = set()

    async def on_error(exc: Exception) -> None:
        reason = refusal(exc)
        if reason is not None and not refused.done():
            refused.set_result(reason)
        elif "permissions violation" in str(exc).lower() and str(exc) not in reported:
            reported.add(str(exc))  # once per subject: a loop must not flood the log
            log.warning("NATS refused %s: %s", identity.user if identity else "client", exc)
        if caller_cb is not None:
            await caller_cb(exc)

    connecting = asyncio.ensure_future(
        nats.connect(
            server_list(url),
            connect_timeout=CONNECT_TIMEOUT,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            ping_interval=PING_INTERVAL,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            pending_size=64 * 1024 * 1024,
            error_cb=on_error,
            **options,
        )
    )
    waiting: set[asyncio.Future[Any]] = {connecting, refused}
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if connecting.done():
        return connecting.result()
    connecting.cancel()
    with contextlib.suppress(BaseException):
        await connecting
    who = f"user {identity.user!r}" if identity else "a client without credentials"
    hint = ""
    node = identity is not None and identity.user.startswith(NODE_USER_PREFIX)
    if node and "Authorization" in str(refused.result()):
        hint = (
            " (a node's own user is admitted by servers whose secrets were exported after "
            "the node's bundle: export the hub's and its site's bundles again, then reload)"
        )
    raise SecurityError(f"NATS at {redact_url(url)} refused {who}: {refused.result()}{hint}")


def subject_covers(pattern: str, subject: str) -> bool:
    """Whether every subject matched by ``subject`` is matched by ``pattern``.

    >>> subject_covers("windows.>", "windows.a.*"), subject_covers("windows.a.*", "windows.b.*")
    (True, False)
    """
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or s[i] == ">" or (token != "*" and (s[i] == "*" or token != s[i])):
            return False
    return len(p) == len(s)


async def _limits(js: JetStreamContext, retention: Retention) -> dict[str, Any]:
    """A stream config's limit fields for ``retention`` (its copies: as many as asked,
    else one per server of the cluster ``js`` talks to, up to three)."""
    return {
        "max_age": retention.max_age or None,
        "max_bytes": retention.max_bytes or -1,
        "discard": DiscardPolicy.NEW if retention.discard == "new" else DiscardPolicy.OLD,
        "num_replicas": await resolve_replicas(js, retention.replicas),
    }


APPEND_ONLY: dict[str, Any] = {"deny_purge": True, "deny_delete": True}
"""Every stream spanflow makes for data (sources, sinks, cuts, dead letters): no purge
and no single-message delete through the JetStream API, for anyone. The server refuses
to lift either once set, so a stolen agent host (which may create and extend the
streams its fragments use) cannot empty devices' readings or another pipeline's output
that way; retention limits still age messages out. To start a stream over, delete it
(coordinators and administrators may)."""


def _append_only(config: StreamConfig) -> bool:
    return bool(config.deny_purge and config.deny_delete)


def _unbounded(config: StreamConfig) -> bool:
    return config.max_bytes in (None, -1) and not config.max_age and config.max_msgs in (None, -1)


async def ensure_stream(
    js: JetStreamContext,
    name: str,
    subjects: list[str] | None,
    *,
    duplicate_window: float = DEFAULT_DUPLICATE_WINDOW,
    retention: Retention = DEFAULT_RETENTION,
) -> None:
    """Create a stream if it is missing, or add subjects it does not capture yet.

    Several pipelines may write one stream under different subjects (every site's
    windows into one stream); each adds its own. A new stream gets ``retention``'s
    limits; an existing one keeps its own, unless it has none at all (made before
    streams were bounded), which then get ``retention``'s. Every stream is made, or
    made again, :data:`APPEND_ONLY`.
    """
    for attempt in range(3):
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            try:
                await js.add_stream(
                    StreamConfig(
                        name=name,
                        subjects=subjects,
                        duplicate_window=duplicate_window,
                        **await _limits(js, retention),
                        **APPEND_ONLY,
                    )
                )
                return
            except APIError as exc:
                if attempt == 2:
                    raise NatsError(
                        f"cannot create stream {name} for {subjects}: {exc.description}"
                    ) from None
                continue  # created meanwhile by someone else: look again
        have = list(info.config.subjects or [])
        missing = [x for x in subjects or [] if not any(subject_covers(h, x) for h in have)]
        bound = _unbounded(info.config)
        if not missing and not bound and _append_only(info.config):
            return
        # A wider subject replaces the ones it covers (the server refuses overlaps).
        kept = [h for h in have if not any(subject_covers(m, h) for m in missing)]
        config = replace(info.config, subjects=[*kept, *missing], **APPEND_ONLY)
        if bound:
            config = replace(config, **await _limits(js, retention))
        try:
            await js.update_stream(config)
            return
        except APIError as exc:
            if attempt == 2:
                raise NatsError(
                    f"cannot add subjects {missing} to stream {name}: {exc.description}"
                ) from None


async def stream_usage(
    js: JetStreamContext, name: str, *, warn_at: float = 0.8
) -> StreamUsage | None:
    """How full stream ``name`` is against its limits (None: no such stream)."""
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        return None
    config = info.config
    max_bytes = config.max_bytes if config.max_bytes not in (None, -1) else None
    return StreamUsage(
        stream=name,
        messages=int(info.state.messages),
        bytes=int(info.state.bytes),
        max_bytes=max_bytes,
        max_age=config.max_age or None,
        discard="old" if config.discard == DiscardPolicy.OLD else "new",
        warn_at=warn_at,
    )


async def ensure_source_streams(
    js: JetStreamContext,
    spec: PipelineSpec,
    domain: str | None = None,
    retention: Retention = DEFAULT_RETENTION,
) -> list[str]:
    """The streams ``spec``'s sources read, created (or given their subjects) here; a
    source of another JetStream domain is sourced from there. Called before anything
    that feeds them is announced (an MQTT listener): a device told its reading is
    stored must find it stored. Returns the streams' names."""
    names: list[str] = []
    for src in spec.sources():
        if src.stream is None:
            continue  # an external system's source
        if src.source_domain and src.source_domain != domain:
            await ensure_sourced(js, src.stream, src.source_domain, retention=retention)
        elif src.subjects:
            await ensure_stream(js, src.stream, list(src.subjects), retention=retention)
        else:
            continue
        names.append(src.stream)
    return names


async def ensure_sourced(
    js: JetStreamContext, name: str, domain: str, *, retention: Retention = DEFAULT_RETENTION
) -> None:
    """Make stream ``name`` here also source the stream of the same name in JetStream
    domain ``domain`` (another site's server, over the leaf-node link). The server keeps
    the source's position, so after a cut it resumes where it stopped: nothing is lost
    or copied twice."""
    api = f"$JS.{domain}.API"
    source = StreamSource(name=name, external=ExternalStream(api=api, deliver=""))
    for attempt in range(3):
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            try:
                limits = await _limits(js, retention)
                config = StreamConfig(name=name, sources=[source], **limits, **APPEND_ONLY)
                await js.add_stream(config)
                return
            except APIError as exc:
                if attempt == 2:
                    raise NatsError(
                        f"cannot create stream {name} from {api}: {exc.description}"
                    ) from None
                continue
        sources = list(info.config.sources or [])
        sourced = any(s.external is not None and s.external.api == api for s in sources)
        if sourced and _append_only(info.config):
            return
        if not sourced:
            sources.append(source)
        try:
            await js.update_stream(replace(info.config, sources=sources, **APPEND_ONLY))
            return
        except APIError as exc:
            if attempt == 2:
                raise NatsError(f"cannot source {name} from {api}: {exc.description}") from None


ATTEMPT_TIMEOUT = 1.0
"""Seconds one try of :meth:`SyncNats.run_patiently` waits for its answer."""
ELECTION_PATIENCE = 30.0
"""Seconds :meth:`SyncNats.run_patiently` keeps trying: longer than a leader election
(4 to 9 s), short enough that a lost server is reported as an error."""
RETRY_PAUSE = 0.2


def unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` is how a call fails while a stream or bucket has no leader, or
    the connection fails over to another server: no answer in time, no responders, a
    503 "temporarily unavailable", a lost connection — worth trying again, unlike a
    refusal or a missing stream."""
    from nats.errors import ConnectionClosedError, NoRespondersError, StaleConnectionError
    from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

    quiet = (
        TimeoutError,
        ConnectionError,
        NoRespondersError,
        NoStreamResponseError,
        ServiceUnavailableError,
        ConnectionClosedError,
        StaleConnectionError,
    )
    return isinstance(exc, quiet) or (isinstance(exc, APIError) and (exc.code or 0) >= 500)


def through_elections(
    call: Callable[[], T],
    what: str,
    *,
    permanent: tuple[type[BaseException], ...] = (),
    patience: float = ELECTION_PATIENCE,
) -> T:
    """``call()`` again while it fails as a leader election makes calls fail
    (:func:`unanswered`), for up to ``patience`` seconds; any other error, and those
    of the ``permanent`` types, end it at once.

    For the calls a micro-batch makes on its way to commit (reading its range, a fence
    check, the sink's ledger): while the stream or bucket behind one elects a leader
    after a NATS server died (4 to 9 s) the call goes unanswered, and failing it would
    fail the query, whose restart costs seconds more than the election. Short tries
    one after another answer within a fraction of a second of the election's end."""
    deadline = time.monotonic() + patience
    warned = False
    while True:
        try:
            return call()
        except Exception as exc:
            if isinstance(exc, permanent) or not unanswered(exc):
                raise
            if time.monotonic() >= deadline:
                raise
            if not warned:
                log.warning("%s: no answer yet (%s); trying again", what, type(exc).__name__)
                warned = True
            time.sleep(RETRY_PAUSE)


class NoStreamCaptures(NatsError):
    """No stream captures the subject published to (a permanent refusal)."""


async def publish_patiently(
    js: JetStreamContext,
    subject: str,
    data: bytes,
    *,
    headers: dict[str, str] | None = None,
    timeout: float,
) -> Any:
    """Publish to a stream and return its ack, waiting out a leader election.

    While the stream elects a leader (a NATS server died: 4 to 9 s) a publish gets "no
    responders" at once or no answer. "No responders" stored nothing, so it is sent
    again — unless no stream captures ``subject`` at all (:class:`NoStreamCaptures`,
    asked of JetStream, which the caller reports as its own error). A publish left
    unanswered may have been stored; it is sent again only with a ``Nats-Msg-Id``
    (JetStream keeps one copy), each try cut at a second so the first one after the
    election goes through. Past ``timeout`` the last error is raised."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import NoStreamResponseError

    deadline = time.monotonic() + timeout
    retry_unanswered = bool(headers and headers.get("Nats-Msg-Id"))
    while True:
        left = deadline - time.monotonic()
        attempt = min(ATTEMPT_TIMEOUT, left) if retry_unanswered else left
        try:
            return await js.publish(subject, data, headers=headers, timeout=max(attempt, 0.05))
        except (NoRespondersError, NoStreamResponseError):
            if not await _captured(js, subject):
                raise NoStreamCaptures(f"no stream captures subject {subject!r}") from None
            if time.monotonic() + RETRY_PAUSE >= deadline:
                raise
        except NatsTimeout:
            if not retry_unanswered or time.monotonic() + RETRY_PAUSE >= deadline:
                raise
        await asyncio.sleep(RETRY_PAUSE)


async def _captured(js: JetStreamContext, subject: str) -> bool:
    """Whether some stream captures ``subject`` (True when JetStream cannot say now)."""
    try:
        await asyncio.wait_for(js.find_stream_name_by_subject(subject), ATTEMPT_TIMEOUT)
    except NotFoundError:
        return False
    except Exception:
        return True
    return True


class SyncNats:
    """A NATS connection on a private event-loop thread, for synchronous callers.

    Spark calls data-source hooks synchronously; this lets them make many requests
    over one connection instead of connecting per call.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="nats-sync"
        )
        self._thread.start()
        self.nc: Client = self.run(lambda: connect(url))
        self.js: JetStreamContext = self.nc.jetstream()

    def run(self, factory: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
        async def wrapper() -> T:
            return await factory()

        coro: Coroutine[Any, Any, T] = wrapper()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def run_patiently(
        self,
        factory: Callable[[], Awaitable[T]],
        what: str,
        *,
        permanent: tuple[type[BaseException], ...] = (),
        attempt: float = ATTEMPT_TIMEOUT,
        patience: float = ELECTION_PATIENCE,
    ) -> T:
        """:meth:`run` through a leader election (see :func:`through_elections`), each
        try cut at ``attempt`` seconds."""
        return through_elections(
            lambda: self.run(lambda: asyncio.wait_for(factory(), attempt), attempt + 5),
            what,
            permanent=permanent,
            patience=patience,
        )

    def submit(self, factory: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Start ``factory()`` on the connection's loop without waiting for it."""

        async def wrapper() -> T:
            return await factory()

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop)

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the connection's loop (from any thread)."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(callback)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):  # closing is best-effort
            self.run(self.nc.drain, timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()


async def publish_lines(js: JetStreamContext, subject: str, lines: list[bytes]) -> int:
    """Publish each line as one message with acks (2,000 in flight); the count."""
    sent = 0
    for lo in range(0, len(lines), 2000):
        futures = [await js.publish_async(subject, line) for line in lines[lo : lo + 2000]]
        await asyncio.wait_for(asyncio.gather(*futures), 60)
        sent += len(futures)
    return sent
