"""A ``multivariate`` detector's normals fitted from history, out of the model registry.

``spanflow detector fit`` fits a normal per key on a stored stream and pushes them as
one version of a model of format ``normal`` (by default named after the pipeline and
step, :func:`spanflow.spec.steps.models.DetectAnomaliesStep.model_name`). Promoted to
production, a key's normal replaces what the key learnt online, from the step's next
micro-batch; a key the version lacks goes on learning online. A rollback brings the
version before back (a key it lacks learns afresh online); ``canary`` puts a share of
the keys on the staging version instead.

**One version per batch, the same on replay.** As for a ``score`` step
(:mod:`spanflow.ml.scoring`): the first task of micro-batch *N* to ask pins the version
of each stage under ``<instance>.<step>.normals.<stage>.<N>`` in the pins bucket; every
other task, and the batch replayed after a crash, reads the pin. A version that does
not load, or whose fields are not the step's, is refused and logged, and the one
before stays (noted under ``….rejected``).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spanflow.errors import InvalidModel, ModelError, ModelNotFound, SpecError
from spanflow.ml.model_store import ModelStore
from spanflow.ml.normal import Normals
from spanflow.ml.registry import ModelVersion
from spanflow.protocol.names import MODEL_PINS_BUCKET, token
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.models import DetectAnomaliesStep
from spanflow.store.pins import Pins
from spanflow.store.session import JetStream, run_with_jetstream

log = logging.getLogger("spanflow.ml.fitted")
STAGES = ("production", "staging")

Fitted = tuple[int, Normals]
"""A version number and its normals."""

_loaded: dict[tuple[str, int, str], Normals] = {}
_lock = threading.Lock()


def canary_key(key_text: str, share: float) -> bool:
    """Whether a key is one of the ``share`` of keys on the staging version (a stable
    hash of the key: the same keys every batch, on every worker)."""
    return share > 0 and zlib.crc32(key_text.encode()) % 10_000 < share * 10_000


@dataclass(frozen=True)
class FittedNormals:
    """Where a detect_anomalies step finds its fitted normals (pickled to the workers)."""

    url: str
    instance: str
    """The spec's instance (pipeline plus fragment): the pins' namespace."""
    step: str
    model: str
    fields: tuple[str, ...]
    stages: tuple[str, ...] = ("production",)

    def pin_key(self, stage: str, batch: str) -> str:
        return f"{token(self.instance)}.{token(self.step)}.normals.{stage}.{batch}"

    def for_batch(self, batch: str | None) -> dict[str, Fitted | None]:
        """The version (and normals) of each stage for micro-batch ``batch``."""
        return run_with_jetstream(self.url, lambda js: self._for_batch(js, batch))

    async def _for_batch(self, js: JetStream, batch: str | None) -> dict[str, Fitted | None]:
        out: dict[str, Fitted | None] = {}
        for stage in self.stages:
            version = await self._pinned(js, stage, batch)
            out[stage] = None if version is None else await self._load(js, version)
        return out

    async def _pinned(self, js: JetStream, stage: str, batch: str | None) -> ModelVersion | None:
        pins, store = Pins(js, MODEL_PINS_BUCKET), ModelStore(js)
        if batch is None:  # outside Spark (a harness): the stage's version now
            chosen = await self._decide(pins, store, stage)
        else:
            chosen = await pins.pinned(
                self.pin_key(stage, batch), lambda: self._decide(pins, store, stage)
            )
        number = chosen.get("version")
        if number is None:
            return None
        manifest, _ = await store.manifest(self.model)
        return manifest.version(int(number))

    async def _decide(self, pins: Pins, store: ModelStore, stage: str) -> dict[str, Any]:
        """The stage's newest version when it loads and fits, else the last one pinned."""
        last_key = self.pin_key(stage, "last")
        last = await pins.get(last_key) or {"version": None}
        try:
            manifest, _ = await store.manifest(self.model)
        except ModelNotFound:
            return {"version": None}  # never fitted: every key learns online
        candidate = manifest.at_stage(stage)  # type: ignore[arg-type]
        choice: dict[str, Any] = {"version": None if candidate is None else candidate.version}
        if candidate is not None and candidate.version != last.get("version"):
            try:
                await self._load(store.js, candidate)
            except ModelError as exc:
                log.error("%s: keeping version %s: %s", self.step, last.get("version"), exc)
                await pins.put(self.pin_key(stage, "rejected"), {"reason": str(exc)})
                return dict(last)
        await pins.put(last_key, choice)
        return choice

    async def _load(self, js: JetStream, version: ModelVersion) -> Fitted:
        cache = (self.model, version.version, version.sha256)
        with _lock:
            cached = _loaded.get(cache)
        if cached is None:
            if version.format != "normal":
                raise InvalidModel(
                    f"model {self.model} version {version.version} is {version.format}, not "
                    "the normals 'spanflow detector fit' pushes"
                )
            loaded = await ModelStore(js).load(self.model, version)
            cached = loaded.model
            if cached.fields != self.fields:
                raise InvalidModel(
                    f"model {self.model} version {version.version} was fitted on "
                    f"{list(cached.fields)}; the step watches {list(self.fields)}"
                )
            with _lock:
                _loaded[cache] = cached
        return version.version, cached


def stages_for(canary: float, shadow: bool = False) -> tuple[str, ...]:
    """The stages a step reads: production, and staging for a canary or a shadow."""
    return STAGES if canary > 0 or shadow else STAGES[:1]


def staged(fitted: Mapping[str, Fitted | None], key_text: str) -> tuple[int | None, Any]:
    """(version, the key's normal) of the staging version, for a shadow score."""
    chosen = fitted.get("staging")
    normal = chosen[1].keys.get(key_text) if chosen is not None else None
    return (chosen[0], normal) if chosen is not None and normal is not None else (None, None)


def choose(
    fitted: Mapping[str, Fitted | None], key_text: str, canary: float
) -> tuple[int | None, Any]:
    """(version, the key's normal) for one key: the staging version's for a canary key
    when there is one, else production's; (None, None) when no version has the key."""
    stage = "staging" if canary_key(key_text, canary) and fitted.get("staging") else "production"
    chosen = fitted.get(stage)
    if chosen is None:
        return None, None
    version, normals = chosen
    normal = normals.keys.get(key_text)
    return (version, normal) if normal is not None else (None, None)


def detector_step(spec: PipelineSpec, step_id: str | None) -> DetectAnomaliesStep:
    """The pipeline's multivariate detect_anomalies step ``step_id`` (or its only one)."""
    steps = [s for s in spec.expanded().steps if isinstance(s, DetectAnomaliesStep)]
    if step_id is not None:
        steps = [s for s in steps if s.id == step_id]
    if len(steps) != 1:
        known = [s.id for s in spec.steps if isinstance(s, DetectAnomaliesStep)]
        what = f"no detect_anomalies step {step_id!r}" if step_id else "name the step"
        raise SpecError(f"pipeline {spec.name}: {what} (detect_anomalies steps: {known})")
    step = steps[0]
    if step.method_or_default != "multivariate":
        raise SpecError(
            f"{spec.name}/{step.id} uses method {step.method_or_default}: only multivariate "
            "learns a normal that can be fitted from history"
        )
    return step
