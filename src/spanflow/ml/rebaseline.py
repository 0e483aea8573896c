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

from spanflow.protocol.names import MODEL_PINS_BUCKET, PIPELINES_BUCKET, token
from spanflow.store.documents import read_json
from spanflow.store.pins import Pins
from spanflow.store.session import JetStream, run_with_jetstream

EVERY_KEY = "*"


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
        return run_with_jetstream(self.url, lambda js: self._for_batch(js, batch))

    async def _for_batch(self, js: JetStream, batch: str | None) -> dict[str, int]:
        if batch is None:
            return await self._current(js)
        pins = Pins(js, MODEL_PINS_BUCKET)
        return dict(await pins.pinned(self.pin_key(batch), lambda: self._current(js)))

    async def _current(self, js: JetStream) -> dict[str, int]:
        """The step's generations in the pipeline's projected record ({} when the
        pipeline is not in the control plane's projection, as in a local run)."""
        record = await read_json(js, PIPELINES_BUCKET, self.pipeline)
        if not isinstance(record, dict):
            return {}
        steps = record.get("rebaselines") or {}
        return {str(k): int(v) for k, v in (steps.get(self.step) or {}).items()}
