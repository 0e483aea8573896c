"""The MQTT door of a site: devices publish over MQTT 3.1.1, and a PUBACK means the
reading is **stored** in JetStream.

nats-server has its own MQTT listener, but it acknowledges a QoS 1 publish once the
server has taken it, not once a stream has stored it: into a full stream (``discard:
new``) it acknowledged 100 readings and stored 12. This gateway acknowledges only what
JetStream acknowledged, in the order the device sent it (MQTT 3.1.1, 4.6). A reading
JetStream refuses (stream full, no stream for the subject, not permitted) is not
acknowledged; the connection is closed with the reason logged once per device and
subject, so the device keeps the reading and sends it again when it reconnects (what
every MQTT client does with unacknowledged QoS 1 messages).

- QoS 0: published and forgotten (the device asked for at most once).
- QoS 1: stored, then PUBACK. A resend (DUP) after a lost PUBACK is stored once: the
  message id is the client id, packet id and payload digest, inside the stream's
  duplicate window; a first send that happens to repeat one is stored anew.
- QoS 2: stored with the same id, then PUBREC; PUBREL → PUBCOMP.
- SUBSCRIBE: core NATS subscriptions delivered at QoS 0 (commands to devices).
- Locked mode (docs/security.md): TLS, and each device logs in with its own user and
  password (``spanflow secrets device``); the gateway connects to NATS **as that
  device**, so NATS itself enforces what the device may publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.errors import Error as NatsClientError

from spanflow.errors import SecurityError, SpanflowError
from spanflow.nats.streams import NoStreamCaptures, connect, publish_patiently
from spanflow.protocol import mqtt
from spanflow.protocol.subjects import covers
from spanflow.security.secrets import NatsIdentity, Secrets
from spanflow.security.throttle import LoginThrottle

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 10.0
"""Seconds a reading may wait for JetStream's ack before the device is disconnected
(it resends after reconnecting)."""
CONNECT_TIMEOUT = 10.0
"""Seconds a new connection has to finish its TLS handshake, and then to send CONNECT."""
MAX_CONNECT = 64 * 1024
"""Bytes a packet may have before its device logged in: a CONNECT carries a client id,
a user, a password and a will of a few hundred bytes; a stranger must not make the
gateway hold megabytes per connection (16 connections with 8 MB CONNECTs took 126 MB)."""
MAX_IN_FLIGHT = 1000
"""Unacknowledged QoS 1/2 publishes per connection before reading pauses."""

Authenticate = Callable[[mqtt.Connect], Awaitable[NatsIdentity | None]]


@dataclass
class GatewayStats:
    connections: int = 0
    refused_logins: int = 0
    throttled_logins: int = 0
    stored: int = 0
    duplicates: int = 0
    not_stored: int = 0
    malformed: int = 0


@dataclass
class _Session:
    client_id: str
    nc: Client
    writer: asyncio.StreamWriter
    pending: asyncio.Queue[tuple[int, int, asyncio.Future[bool]] | None] = field(
        default_factory=lambda: asyncio.Queue(MAX_IN_FLIGHT)
    )
    subscriptions: dict[str, Any] = field(default_factory=dict)
    failed: str | None = None
    may_subscribe: tuple[str, ...] | None = None
    """Locked: the subjects the device may subscribe to (its commands); None: open."""


def device_login(secrets: Secrets) -> Authenticate:
    """Locked mode: a device's MQTT user and password are its NATS user's; the shared
    ``device`` role logs in as ``device``. None: refused."""

    async def check(packet: mqtt.Connect) -> NatsIdentity | None:
        if not packet.username or packet.password is None:
            return None
        creds = secrets.credentials()
        if packet.username == "device":
            identity = secrets.identity("device")
        elif packet.username in creds.devices:
            identity = secrets.device_identity(packet.username)
        else:
            return None
        if not hmac.compare_digest(identity.password.encode(), packet.password.encode()):
            return None
        return identity

    return check


class MqttGateway:
    """``await start()`` to listen, ``await close()`` to stop (idempotent)."""

    def __init__(
        self,
        nats_url: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        secrets: Secrets | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.host, self.port = host, port
        self.secrets = secrets
        self.authenticate: Authenticate | None = device_login(secrets) if secrets else None
        self.tls = tls if tls is not None else (server_tls(secrets) if secrets else None)
        self.stats = GatewayStats()
        self.throttle = LoginThrottle()
        self._server: asyncio.base_events.Server | None = None
        self._shared: Client | None = None
        self._sessions: set[asyncio.Task[None]] = set()
        self._reported: set[tuple[str, str]] = set()

    @property
    def locked(self) -> bool:
        return self.authenticate is not None

    async def start(self) -> MqttGateway:
        if not self.locked:
            self._shared = await connect(self.nats_url)
            log.warning(
                "MQTT on %s:%s is OPEN: any device may publish anything (lock it with "
                "`spanflow secrets init`)",
                self.host,
                self.port,
            )
        self._server = await asyncio.start_server(
            self._serve,
            self.host,
            self.port,
            ssl=self.tls,
            ssl_handshake_timeout=CONNECT_TIMEOUT if self.tls else None,
            limit=mqtt.MAX_PACKET + 8,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("MQTT gateway on %s:%d (%s)", self.host, self.port, "TLS" if self.tls else "plain")
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._sessions):
            task.cancel()
        for task in list(self._sessions):
            with contextlib.suppress(BaseException):
                await task
        if self._shared is not None:
            await self._shared.close()
            self._shared = None

    # ------------------------------------------------------------ a connection

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions.add(task)
        peer = writer.get_extra_info("peername")
        session: _Session | None = None
        try:
            session = await self._login(reader, writer, peer)
            if session is not None:
                await self._run(session, reader)
        except (mqtt.MqttError, asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            if isinstance(exc, mqtt.MqttError):
                self.stats.malformed += 1
                log.warning("MQTT %s: %s; connection closed", peer, exc)
        finally:
            if session is not None:
                await self._end(session)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._sessions.discard(task)

    async def _login(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object
    ) -> _Session | None:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            first, body = await _read_packet(reader, MAX_CONNECT)
        packet = mqtt.parse(first, body)
        if not isinstance(packet, mqtt.Connect):
            raise mqtt.MqttError("the first packet is not CONNECT")
        if packet.protocol_level not in (3, 4):
            writer.write(mqtt.connack(mqtt.BAD_PROTOCOL))
            return None
        identity: NatsIdentity | None = None
        if self.authenticate is not None:
            address = peer[0] if isinstance(peer, tuple) else str(peer)
            user, now = packet.username or "", time.monotonic()
            # Checking costs the NATS server a password hash: throttled before it, per
            # address and per user; a device that logged in from here before is judged
            # by its own failures only (security/throttle.py)
            if not self.throttle.may_check(address, user, now):
                self.stats.throttled_logins += 1
                writer.write(mqtt.connack(mqtt.NOT_AUTHORIZED))
                return None
            identity = await self.authenticate(packet)
            if identity is not None:
                self.throttle.login_succeeded(address, user)
            else:
                self.throttle.login_failed(address, user, now)
                self.stats.refused_logins += 1
                log.warning(
                    "MQTT %s: login refused for user %r (client %r): bad user or password",
                    peer,
                    packet.username,
                    packet.client_id,
                )
                writer.write(mqtt.connack(mqtt.BAD_CREDENTIALS))
                return None
        nc = self._shared
        if identity is not None:

            async def cut_off() -> None:
                """NATS dropped the device's own connection (a revoked user after a
                reload, a server restart): end its MQTT session at once, so it logs in
                again — and is refused if it was revoked — instead of publishing into
                a client that only buffers."""
                writer.close()

            try:
                nc = await connect(
                    self.nats_url,
                    identity=identity,
                    name=f"mqtt:{packet.client_id}",
                    disconnected_cb=cut_off,
                )
            except SecurityError as exc:
                log.warning("MQTT %s: %s", peer, exc)
                writer.write(mqtt.connack(mqtt.NOT_AUTHORIZED))
                return None
        assert nc is not None
        self.stats.connections += 1
        writer.write(mqtt.connack(mqtt.ACCEPTED))
        client_id = packet.client_id or f"anon-{id(writer):x}"
        session = _Session(client_id, nc, writer)
        if identity is not None and self.secrets is not None:
            device = self.secrets.credentials().devices.get(identity.user)
            session.may_subscribe = device.subscribe if device is not None else ()
        return session

    async def _run(self, session: _Session, reader: asyncio.StreamReader) -> None:
        acks = asyncio.create_task(self._send_acks(session))
        try:
            while session.failed is None:
                first, body = await _read_packet(reader)
                packet = mqtt.parse(first, body)
                if isinstance(packet, mqtt.Publish):
                    await self._publish(session, packet)
                elif isinstance(packet, mqtt.Subscribe):
                    await self._subscribe(session, packet)
                elif isinstance(packet, mqtt.Unsubscribe):
                    for name in packet.filters:
                        sub = session.subscriptions.pop(name, None)
                        if sub is not None:
                            await sub.unsubscribe()
                    session.writer.write(mqtt.ack(mqtt.UNSUBACK, packet.packet_id))
                elif isinstance(packet, mqtt.Control):
                    if packet.kind == mqtt.DISCONNECT:
                        break
                    if packet.kind == mqtt.PINGREQ:
                        session.writer.write(mqtt.pingresp())
                    elif packet.kind == mqtt.PUBREL and packet.packet_id is not None:
                        await self._queue(session, mqtt.PUBCOMP, packet.packet_id, _done())
        finally:
            await session.pending.put(None)
            with contextlib.suppress(BaseException):
                await acks

    async def _publish(self, session: _Session, packet: mqtt.Publish) -> None:
        subject = mqtt.topic_to_subject(packet.topic)
        if packet.qos == 0:
            await session.nc.publish(subject, packet.payload)
            return
        assert packet.packet_id is not None
        stored = asyncio.ensure_future(self._store(session, subject, packet))
        reply = mqtt.PUBACK if packet.qos == 1 else mqtt.PUBREC
        await self._queue(session, reply, packet.packet_id, stored)

    async def _queue(
        self, session: _Session, kind: int, packet_id: int, done: asyncio.Future[bool]
    ) -> None:
        await session.pending.put((kind, packet_id, done))

    async def _store(self, session: _Session, subject: str, packet: mqtt.Publish) -> bool:
        """Whether JetStream stored the reading (or had it already: a resend)."""
        digest = hashlib.blake2b(packet.payload, digest_size=8).hexdigest()
        msg_id = f"mqtt:{session.client_id}:{packet.packet_id}:{digest}"
        js = session.nc.jetstream(timeout=PUBLISH_TIMEOUT)
        try:  # through a leader election: the device is not disconnected for it
            ack = await publish_patiently(
                js,
                subject,
                packet.payload,
                headers={"Nats-Msg-Id": msg_id},
                timeout=PUBLISH_TIMEOUT,
            )
            if ack.duplicate and not packet.dup:
                # A new reading that repeats an old one's id (packet ids wrap): store it.
                await js.publish(subject, packet.payload)
            elif ack.duplicate:
                self.stats.duplicates += 1
        except (TimeoutError, NatsClientError, NoStreamCaptures) as exc:
            self._not_stored(session, subject, exc)
            return False
        self.stats.stored += 1
        return True

    def _not_stored(self, session: _Session, subject: str, exc: BaseException) -> None:
        self.stats.not_stored += 1
        reason = str(exc) or type(exc).__name__
        session.failed = reason
        if (session.client_id, subject) not in self._reported:
            self._reported.add((session.client_id, subject))
            log.warning(
                "MQTT %s: reading on %s not stored (%s): not acknowledged; the connection "
                "is closed so the device sends it again",
                session.client_id,
                subject,
                reason,
            )

    async def _send_acks(self, session: _Session) -> None:
        """Acknowledge in the order the device sent, each once JetStream has stored it;
        at the first reading not stored, stop (the connection closes)."""
        while True:
            item = await session.pending.get()
            if item is None:
                return
            kind, packet_id, done = item
            if not await done:
                session.writer.close()
                return
            session.writer.write(mqtt.ack(kind, packet_id))

    async def _subscribe(self, session: _Session, packet: mqtt.Subscribe) -> None:
        codes = []
        for topic_filter, _qos in packet.filters:
            try:
                subject = mqtt.filter_to_subject(topic_filter)
            except mqtt.MqttError:
                codes.append(0x80)
                continue
            allowed = session.may_subscribe
            if allowed is not None and not any(covers(p, subject) for p in allowed):
                if (session.client_id, topic_filter) not in self._reported:
                    self._reported.add((session.client_id, topic_filter))
                    log.warning(
                        "MQTT %s: may not subscribe to %s (its commands: %s)",
                        session.client_id,
                        topic_filter,
                        ", ".join(allowed) or "none",
                    )
                codes.append(0x80)  # a failure the device sees, not a silent no-op
                continue
            writer = session.writer

            async def deliver(msg: Any, writer: asyncio.StreamWriter = writer) -> None:
                writer.write(mqtt.publish(mqtt.subject_to_topic(msg.subject), msg.data))

            try:
                session.subscriptions[topic_filter] = await session.nc.subscribe(
                    subject, cb=deliver
                )
                codes.append(0)
            except NatsClientError:
                codes.append(0x80)
        session.writer.write(mqtt.suback(packet.packet_id, codes))

    async def _end(self, session: _Session) -> None:
        for sub in session.subscriptions.values():
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if session.nc is not self._shared:
            with contextlib.suppress(Exception):
                if session.nc.is_connected:
                    await session.nc.drain()
                else:  # reconnecting (a revoked user, a server away): stop trying
                    await session.nc.close()


def _done() -> asyncio.Future[bool]:
    future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    future.set_result(True)
    return future


async def _read_packet(
    reader: asyncio.StreamReader, limit: int = mqtt.MAX_PACKET
) -> tuple[int, bytes]:
    """One packet; a length over ``limit`` is refused before its body is read."""
    header = bytearray(await reader.readexactly(2))
    while True:
        found = mqtt.remaining_length(header)
        if found is not None:
            break
        header += await reader.readexactly(1)
    length, _ = found
    if length > limit:
        raise mqtt.MqttError(f"packet of {length} bytes exceeds {limit}")
    body = await reader.readexactly(length) if length else b""
    return header[0], body


def server_tls(secrets: Secrets) -> ssl.SSLContext:
    """The gateway's TLS: the deployment's server certificate; devices log in with a
    password, so no client certificate is asked for."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(secrets.server_cert), str(secrets.server_key))
    return ctx


class GatewayThread:
    """The gateway on an event loop of its own thread, for commands whose main thread
    runs Spark or a status view (``spanflow run --mqtt``, ``spanflow site-server``)."""

    def __init__(
        self, nats_url: str, host: str, port: int, *, secrets: Secrets | None = None
    ) -> None:
        self.gateway = MqttGateway(nats_url, host, port, secrets=secrets)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="mqtt-gateway", daemon=True
        )

    @property
    def host(self) -> str:
        return self.gateway.host

    @property
    def port(self) -> int:
        return self.gateway.port

    def start(self) -> GatewayThread:
        """Listen; an address this host cannot listen on is a :class:`SpanflowError`
        naming it (not a traceback)."""
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.gateway.start(), self._loop).result(30)
        except OSError as exc:
            self.stop()
            where = f"{self.gateway.host}:{self.gateway.port}"
            raise SpanflowError(
                f"the MQTT gateway cannot listen on {where}: {exc.strerror or exc}"
            ) from None
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.gateway.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
