"""Rebaselining a detector: an operator's "this is the new normal".

A detector holds its judgement while a key stays anomalous (docs/ml.md, "Faults are
states"), so a machine that was repaired differently, re-rigged or moved keeps being
flagged until someone says its current behaviour is fine. ``spanflow detector
rebaseline PIPELINE KEY`` (REST ``POST /api/v1/pipelines/{name}/rebaseline``, the
dashboard's events page) says so: the coordinator writes a ``DetectorRebaselined``
record to the control log, which raises the step's *generation* for that key (``*``:
every key) in the pipeline's record.

**One view per batch, the same on replay.** The first task of micro-batch *N* to ask
reads the step's generations from the pipeline's projected record and *pins* them
(``create`` on ``<instance>.<step>.rebaseline.<N>`` in the pins bucket, first writer
wins), like a score step pins its model version (:mod:`spanflow.ml.scoring`). Every
other task of the batch, and the batch replayed after a crash, reads the pin, so a
replay forgets exactly what the first run forgot.

A key whose state was learnt under an older generation starts afresh: its detector,
threshold and warm-up begin again from its next reading, and an open episode ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError

from spanflow.nats.cluster import ensure_kv, get_json
from spanflow.nats.streams import token
from spanflow.nats.sync import run_sync
from spanflow.protocol.names import MODEL_PINS_BUCKET, PIPELINES_BUCKET

EVERY_KEY = "*"
PIN_TTL = 7 * 86400.0


def key_text(key: Any) -> str:
    """How a key is named to a rebaseline: its value, or its values joined by commas
    (a compound key), as text."""
    if isinstance(key, tuple | list):
        return ",".join(str(part) for part in key)
    return str(key)


def requested(generations: Mapping[str, int], key: Any) -> int:
    """The generation ``key`` must have learnt under (0: never rebaselined)."""
    return max(generations.get(key_text(key), 0), generations.get(EVERY_KEY, 0))


@dataclass(frozen=True)
class Rebaselining:
    """Where a detect_anomalies step reads its rebaselines (pickled to the workers)."""

    url: str
    pipeline: str
    """The pipeline's name: its key in the projected pipelines bucket."""
    instance: str
    """The spec's instance (pipeline plus fragment): the pin's namespace."""
    step: str

    def pin_key(self, batch: str) -> str:
        return f"{token(self.instance)}.{token(self.step)}.rebaseline.{batch}"

    def for_batch(self, batch: str | None) -> dict[str, int]:
        """The generations that hold for micro-batch ``batch`` (pinned on first ask;
        with no batch, as outside Spark, the current ones)."""
        return run_sync(self._for_batch(batch))

    async def _for_batch(self, batch: str | None) -> dict[str, int]:
        from spanflow.nats.streams import connect

        nc = await connect(self.url)
        try:
            js = nc.jetstream()
            if batch is None:
                return await self._current(js)
            pins = await ensure_kv(js, MODEL_PINS_BUCKET, ttl=PIN_TTL)
            key = self.pin_key(batch)
            pinned = await get_json(pins, key)
            if pinned is not None:
                return dict(pinned)
            current = await self._current(js)
            try:
                await pins.create(key, orjson.dumps(current))
            except KeyWrongLastSequenceError:
                return dict(await get_json(pins, key) or current)  # another task pinned first
            return current
        finally:
            await nc.close()

    async def _current(self, js: Any) -> dict[str, int]:
        """The step's generations in the pipeline's projected record ({} when the
        pipeline is not in the control plane's projection, as in a local run)."""
        try:
            kv = await js.key_value(PIPELINES_BUCKET)
        except BucketNotFoundError:  # no control plane: nothing was ever rebaselined
            return {}
        record = await get_json(kv, self.pipeline)
        if not isinstance(record, dict):
            return {}
        steps = record.get("rebaselines") or {}
        return {str(k): int(v) for k, v in (steps.get(self.step) or {}).items()}
