"""MQTT 3.1.1 packets, as much as a device gateway needs: CONNECT/CONNACK,
PUBLISH/PUBACK (QoS 0 and 1) and the QoS 2 handshake, SUBSCRIBE/SUBACK,
UNSUBSCRIBE/UNSUBACK, PINGREQ/PINGRESP, DISCONNECT. Pure bytes in, values out; the
gateway (:mod:`spanflow.doors.mqtt_gateway`) does the I/O.

Topics map to NATS subjects as nats-server's own MQTT listener maps them, so devices
and pipelines see the same names either way: ``/`` separates levels (``.``), a ``.``
inside a level becomes ``//``; subscription wildcards ``+`` and ``#`` become ``*``
and ``>``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = (
    8,
    9,
    10,
    11,
    12,
    13,
    14,
)
MAX_PACKET = 8 * 1024 * 1024
"""The largest packet accepted (NATS's max_payload as spanflow configures it)."""

# CONNACK return codes (MQTT 3.1.1, 3.2.2.3)
ACCEPTED = 0
BAD_PROTOCOL = 1
IDENTIFIER_REJECTED = 2
BAD_CREDENTIALS = 4
NOT_AUTHORIZED = 5


class MqttError(ValueError):
    """A malformed or unsupported packet: the connection is closed."""


@dataclass(frozen=True)
class Connect:
    client_id: str
    keepalive: int
    clean_session: bool
    username: str | None
    password: str | None
    will_topic: str | None = None
    will_payload: bytes = b""
    protocol_level: int = 4


@dataclass(frozen=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    packet_id: int | None = None
    dup: bool = False
    retain: bool = False


@dataclass(frozen=True)
class Subscribe:
    packet_id: int
    filters: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Unsubscribe:
    packet_id: int
    filters: tuple[str, ...]


@dataclass(frozen=True)
class Control:
    """A packet with at most a packet id: PUBACK, PUBREL, PINGREQ, DISCONNECT…"""

    kind: int
    packet_id: int | None = None


Packet = Connect | Publish | Subscribe | Unsubscribe | Control


def remaining_length(data: bytes | bytearray, start: int = 1) -> tuple[int, int] | None:
    """(length, header size) of the packet starting at 0, or None if more bytes are
    needed. Raises for a length longer than four bytes or beyond ``MAX_PACKET``."""
    value, multiplier = 0, 1
    for i in range(4):
        if start + i >= len(data):
            return None
        byte = data[start + i]
        value += (byte & 0x7F) * multiplier
        if not byte & 0x80:
            if value > MAX_PACKET:
                raise MqttError(f"packet of {value} bytes exceeds {MAX_PACKET}")
            return value, start + i + 1
        multiplier *= 128
    raise MqttError("remaining length longer than four bytes")


class _Reader:
    def __init__(self, body: bytes) -> None:
        self.body, self.at = body, 0

    def u8(self) -> int:
        if self.at >= len(self.body):
            raise MqttError("packet cut short")
        self.at += 1
        return self.body[self.at - 1]

    def u16(self) -> int:
        if self.at + 2 > len(self.body):
            raise MqttError("packet cut short")
        (value,) = struct.unpack_from(">H", self.body, self.at)
        self.at += 2
        return int(value)

    def raw(self) -> bytes:
        size = self.u16()
        if self.at + size > len(self.body):
            raise MqttError("string runs past the packet")
        self.at += size
        return self.body[self.at - size : self.at]

    def text(self) -> str:
        try:
            return self.raw().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MqttError(f"a string is not UTF-8: {exc}") from None

    def rest(self) -> bytes:
        out, self.at = self.body[self.at :], len(self.body)
        return out


def parse(first: int, body: bytes) -> Packet:
    """One packet from its first byte and its body (after the remaining length)."""
    kind, flags = first >> 4, first & 0x0F
    r = _Reader(body)
    if kind == CONNECT:
        return _connect(r)
    if kind == PUBLISH:
        qos = (flags >> 1) & 3
        if qos == 3:
            raise MqttError("PUBLISH with QoS 3")
        topic = r.text()
        packet_id = r.u16() if qos else None
        return Publish(topic, r.rest(), qos, packet_id, bool(flags & 8), bool(flags & 1))
    if kind == SUBSCRIBE:
        packet_id = r.u16()
        filters = []
        while r.at < len(body):
            filters.append((r.text(), r.u8() & 3))
        if not filters:
            raise MqttError("SUBSCRIBE without a topic filter")
        return Subscribe(packet_id, tuple(filters))
    if kind == UNSUBSCRIBE:
        packet_id = r.u16()
        names = []
        while r.at < len(body):
            names.append(r.text())
        return Unsubscribe(packet_id, tuple(names))
    if kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        return Control(kind, r.u16())
    if kind in (PINGREQ, DISCONNECT):
        return Control(kind)
    raise MqttError(f"unexpected packet type {kind} from a client")


def _connect(r: _Reader) -> Connect:
    name = r.text()
    level = r.u8()
    if name not in ("MQTT", "MQIsdp") or level not in (3, 4):
        return Connect("", 0, True, None, None, protocol_level=level or -1)
    flags = r.u8()
    keepalive = r.u16()
    client_id = r.text()
    will_topic, will_payload = None, b""
    if flags & 0x04:
        will_topic, will_payload = r.text(), r.raw()
    username = r.text() if flags & 0x80 else None
    password = r.raw().decode("utf-8", "replace") if flags & 0x40 else None
    return Connect(
        client_id,
        keepalive,
        bool(flags & 0x02),
        username,
        password,
        will_topic,
        will_payload,
        level,
    )


def _length(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def connack(code: int, session_present: bool = False) -> bytes:
    return bytes([CONNACK << 4, 2, 1 if session_present else 0, code])


def ack(kind: int, packet_id: int) -> bytes:
    """PUBACK, PUBREC, PUBCOMP, UNSUBACK (PUBREL carries flags 0b0010)."""
    first = (kind << 4) | (2 if kind == PUBREL else 0)
    return bytes([first, 2]) + struct.pack(">H", packet_id)


def suback(packet_id: int, codes: list[int]) -> bytes:
    body = struct.pack(">H", packet_id) + bytes(codes)
    return bytes([SUBACK << 4]) + _length(len(body)) + body


def pingresp() -> bytes:
    return bytes([PINGRESP << 4, 0])


def publish(topic: str, payload: bytes) -> bytes:
    """A QoS 0 PUBLISH to a subscriber."""
    name = topic.encode()
    body = struct.pack(">H", len(name)) + name + payload
    return bytes([PUBLISH << 4]) + _length(len(body)) + body


# ---------------------------------------------------------------- topics ↔ subjects


def topic_to_subject(topic: str) -> str:
    """``sensors/dev1/temp`` → ``sensors.dev1.temp``; refuses what NATS cannot carry.

    >>> topic_to_subject("sensors/dev.1/temp")
    'sensors.dev//1.temp'
    """
    if not topic or any(c in topic for c in " \t\r\n*>+#") or "\x00" in topic:
        raise MqttError(f"topic {topic!r} is empty or has a wildcard or white space")
    levels = topic.split("/")
    if any(level == "" for level in levels):
        raise MqttError(f"topic {topic!r} has an empty level")
    return ".".join(level.replace(".", "//") for level in levels)


def subject_to_topic(subject: str) -> str:
    return "/".join(token.replace("//", ".") for token in subject.split("."))


def filter_to_subject(topic_filter: str) -> str:
    """``sensors/+/temp`` → ``sensors.*.temp``; ``sensors/#`` → ``sensors.>``."""
    levels = topic_filter.split("/")
    out = []
    for i, level in enumerate(levels):
        if level == "#":
            if i != len(levels) - 1:
                raise MqttError(f"'#' must be the last level of {topic_filter!r}")
            out.append(">")
        elif level == "+":
            out.append("*")
        elif not level or any(c in level for c in "+#*> "):
            raise MqttError(f"bad topic filter {topic_filter!r}")
        else:
            out.append(level.replace(".", "//"))
    return ".".join(out)
