"""What members say to each other, and its wire form.

The protocol core works on these objects; only transports encode them. The wire form
is a JSON array of messages, each ``[tag, field, …]`` in declaration order — compact
enough that a ping with a few piggybacked updates fits one datagram, and readable in a
packet capture. :func:`decode` checks every field's type: a peer's bad packet is a
:class:`CodecError` the transport logs and drops, never an exception in the protocol.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, ClassVar, get_type_hints

import orjson


class CodecError(ValueError):
    """A packet that is not a list of well-formed membership messages."""


class State(enum.IntEnum):
    """A member's state as one member sees it (the order is memberlist's)."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


@dataclass(frozen=True)
class Load:
    """A member's load as it last measured it (see ``runtime/load.py`` for the score).

    ``age`` is seconds since the measurement when the message was sent, so a receiver
    knows how fresh it is without synchronised clocks (transit time is ignored: it is
    milliseconds on a LAN, and ages are compared in seconds)."""

    score: float
    free_slots: int
    age: float
    connected: bool = True
    """Its data path is up (the agent's NATS connection): a member its peers hear but
    that cannot reach its data is not doing its job."""


@dataclass(frozen=True)
class NodeState:
    """One member in a push-pull exchange."""

    name: str
    addr: str
    incarnation: int
    state: int
    load: Load | None = None


@dataclass(frozen=True)
class Ping:
    seq: int
    target: str
    source: str
    source_addr: str
    load: Load | None = None
    TAG: ClassVar[str] = "p"


@dataclass(frozen=True)
class IndirectPing:
    """Ask the receiver to ping ``target`` and relay its ack (and, with ``nack``, to
    answer a :class:`Nack` if the target stays silent — Lifeguard)."""

    seq: int
    target: str
    target_addr: str
    nack: bool
    source: str
    source_addr: str
    TAG: ClassVar[str] = "i"


@dataclass(frozen=True)
class Ack:
    seq: int
    source: str
    load: Load | None = None
    TAG: ClassVar[str] = "a"


@dataclass(frozen=True)
class Nack:
    """An indirect helper is alive but could not reach the target: evidence the asking
    member's own network is fine (Lifeguard's local health)."""

    seq: int
    TAG: ClassVar[str] = "n"


@dataclass(frozen=True)
class Alive:
    incarnation: int
    node: str
    addr: str
    TAG: ClassVar[str] = "A"


@dataclass(frozen=True)
class Suspect:
    incarnation: int
    node: str
    sender: str
    TAG: ClassVar[str] = "S"


@dataclass(frozen=True)
class Dead:
    """``sender == node`` means a graceful leave."""

    incarnation: int
    node: str
    sender: str
    TAG: ClassVar[str] = "D"


@dataclass(frozen=True)
class PushPull:
    """A full state exchange over the reliable channel (``join`` when a new member
    contacts a seed; ``reply`` for the answer, which is not answered again)."""

    source: str
    source_addr: str
    join: bool
    reply: bool
    states: tuple[NodeState, ...]
    TAG: ClassVar[str] = "P"


Message = Ping | IndirectPing | Ack | Nack | Alive | Suspect | Dead | PushPull
Rumour = Alive | Suspect | Dead
"""The updates that are gossiped (piggybacked, retransmitted a bounded number of times)."""

_CLASSES: dict[str, type[Any]] = {
    cls.TAG: cls for cls in (Ping, IndirectPing, Ack, Nack, Alive, Suspect, Dead, PushPull)
}
MAX_PACKET = 4 * 1024 * 1024
"""A reliable-channel message larger than this is refused (a push-pull of ~30,000
members); a datagram is bounded by UDP itself."""


def encode(messages: list[Message] | tuple[Message, ...]) -> bytes:
    return orjson.dumps([_to_wire(m) for m in messages])


def encoded_size(message: Message) -> int:
    """Bytes ``message`` adds to a packet (its array plus a separating comma)."""
    return len(orjson.dumps(_to_wire(message))) + 1


def decode(data: bytes) -> list[Message]:
    if len(data) > MAX_PACKET:
        raise CodecError(f"packet of {len(data)} bytes exceeds {MAX_PACKET}")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise CodecError("a packet is a JSON array of messages")
    return [_from_wire(item) for item in raw]


def _to_wire(message: Any) -> list[Any]:
    return [
        message.TAG,
        *(_field_to_wire(getattr(message, f.name)) for f in _fields(type(message))),
    ]


def _field_to_wire(value: Any) -> Any:
    if isinstance(value, Load):
        return [value.score, value.free_slots, round(value.age, 3), value.connected]
    if isinstance(value, tuple):
        return [_state_to_wire(s) for s in value]
    return value


def _state_to_wire(state: NodeState) -> list[Any]:
    return [state.name, state.addr, state.incarnation, state.state, _field_to_wire(state.load)]


def _from_wire(item: Any) -> Message:
    if not isinstance(item, list) or not item or not isinstance(item[0], str):
        raise CodecError("a message is an array starting with its tag")
    cls = _CLASSES.get(item[0])
    if cls is None:
        raise CodecError(f"unknown message tag {item[0]!r}")
    fields = _fields(cls)
    values = item[1:]
    if len(values) != len(fields):
        raise CodecError(f"{cls.__name__} has {len(fields)} fields, got {len(values)}")
    hints = _hints(cls)
    checked = [_check(cls, f.name, hints[f.name], v) for f, v in zip(fields, values, strict=True)]
    message: Message = cls(*checked)
    return message


def _check(cls: type[Any], name: str, hint: Any, value: Any) -> Any:
    where = f"{cls.__name__}.{name}"
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise CodecError(f"{where} must be an integer")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise CodecError(f"{where} must be true or false")
        return value
    if hint is str:
        if not isinstance(value, str) or len(value) > 256:
            raise CodecError(f"{where} must be a string of at most 256 characters")
        return value
    if hint == Load | None:
        return None if value is None else _load(where, value)
    if hint == tuple[NodeState, ...]:
        if not isinstance(value, list):
            raise CodecError(f"{where} must be an array")
        return tuple(_node_state(where, v) for v in value)
    raise CodecError(f"{where}: unsupported field type")  # pragma: no cover - a coding error


def _load(where: str, value: Any) -> Load:
    if (
        not isinstance(value, list)
        or len(value) != 4
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value[:3])
        or not isinstance(value[3], bool)
    ):
        raise CodecError(f"{where} must be [score, free_slots, age, connected]")
    return Load(
        score=float(value[0]),
        free_slots=int(value[1]),
        age=max(0.0, float(value[2])),
        connected=value[3],
    )


def _node_state(where: str, value: Any) -> NodeState:
    if not isinstance(value, list) or len(value) != 5:
        raise CodecError(f"{where}: a member is [name, addr, incarnation, state, load]")
    name, addr, incarnation, state, load = value
    if not isinstance(name, str) or not isinstance(addr, str):
        raise CodecError(f"{where}: name and addr must be strings")
    if isinstance(incarnation, bool) or not isinstance(incarnation, int):
        raise CodecError(f"{where}: incarnation must be an integer")
    if state not in tuple(State):
        raise CodecError(f"{where}: unknown state {state!r}")
    return NodeState(
        name, addr, incarnation, int(state), None if load is None else _load(where, load)
    )


_FIELDS: dict[type[Any], tuple[dataclasses.Field[Any], ...]] = {}
_HINTS: dict[type[Any], dict[str, Any]] = {}


def _fields(cls: type[Any]) -> tuple[dataclasses.Field[Any], ...]:
    if cls not in _FIELDS:
        _FIELDS[cls] = dataclasses.fields(cls)
    return _FIELDS[cls]


def _hints(cls: type[Any]) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]
