"""How much a stream spanflow creates may hold, and what happens when it is full.

Every stream spanflow creates — the streams devices publish to, the ones fragments
write, the planner's cut streams, dead letters — is bounded: an edge site buffering
through a long uplink cut must not fill its disk unnoticed. A site sets its own
limits in the topology (``sites[].retention``), a stream a node hosts may override
them (``nodes[].streams[].retention``).

By default a stream is bounded by age (7 days) and by its server's JetStream store
(which JetStream caps at 75 % of the free disk when the server starts, refusing new
messages once reached), not by a size of its own: JetStream **reserves** a stream's
``max_bytes`` on disk when the stream is created, so a size per stream by default
would make a site with a dozen streams refuse to create more long before its disk
is full. Give ``max_bytes`` to the streams that need their own cap.

When a stream is full:

* ``discard: new`` (the default) — new messages are refused: the publisher gets an
  error and keeps (or retries) its data; nothing already acknowledged is lost. A
  fragment whose sink stream is full stops at that batch and retries, so its input
  buffers upstream.
* ``discard: old`` — the oldest messages are dropped to make room: for data that
  loses its value with age (a live dashboard feed), never for data that must arrive.

``max_age`` drops messages older than that either way.

>>> r = Retention.model_validate({"max_age": "2d", "max_bytes": "512MiB", "discard": "old"})
>>> r.max_age, r.max_bytes, r.discard
(172800.0, 536870912, 'old')
>>> DEFAULT_RETENTION.max_age, DEFAULT_RETENTION.max_bytes, DEFAULT_RETENTION.discard
(604800.0, None, 'new')
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from spanflow.spec.durations import Duration

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(value: object) -> int:
    """Bytes from ``"512MiB"``/``"10GB"``/``"1g"``-style text or a number of bytes
    (K, M, G, T are powers of 1024 with or without the ``i``, as disks are sold in
    the cloud consoles spanflow users read).

    >>> parse_size("1KiB"), parse_size("2m"), parse_size("1.5GB"), parse_size(100)
    (1024, 2097152, 1610612736, 100)
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size like '512MiB', got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float):
        size = int(value)
    elif isinstance(value, str):
        match = _SIZE.match(value)
        if not match:
            raise ValueError(f"expected a size like '512MiB', '10GB' or '1g', got {value!r}")
        size = int(float(match.group(1)) * 1024 ** _POWERS[match.group(2).lower()])
    else:
        raise ValueError(f"expected a size like '512MiB', got {value!r}")
    if size <= 0:
        raise ValueError(f"a size must be positive, got {value!r}")
    return size


Size = Annotated[int, BeforeValidator(parse_size), PlainSerializer(int)]
"""Bytes; accepts ``"512MiB"``-style text."""


class Retention(BaseModel):
    """Limits of one stream (see the module documentation)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_age: Duration | None = Field(
        default=7 * 86400.0, description="Messages older than this are dropped; null: no limit."
    )
    max_bytes: Size | None = Field(
        default=None,
        description="Size at which the stream is full (reserved on disk by JetStream); "
        "null: bounded by the server's JetStream store.",
    )
    discard: Literal["new", "old"] = Field(
        default="new", description="When full: refuse new messages, or drop the oldest."
    )
    warn_at: float = Field(
        default=0.8, gt=0, le=1, description="Share of max_bytes at which usage is a warning."
    )
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=5,
        description="Copies of the stream on a clustered NATS server (3: it survives the "
        "loss of a server); null: one per server of the cluster, up to 3. A coordinator "
        "run with --replicas N raises it to N for streams on the cluster's own servers.",
    )


DEFAULT_RETENTION = Retention()
"""7 days, no size of its own (the server's store bounds it), refuse new messages when
full, warn at 80 %."""
