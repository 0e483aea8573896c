"""A record as a broker stored it, before any decoding: what every source's reader
hands the decoders (:mod:`spanflow.spark.formats`), whichever broker it came from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One stored record: where it came from and its bytes."""

    seq: int
    """Its position: a JetStream stream sequence, a Kafka offset."""
    subject: str
    """Where it was published: a NATS subject, a Kafka topic."""
    data: bytes
    published_us: int
    """When the broker stored it, microseconds since the epoch."""
