"""The ``score`` step's runtime: which registry version scores a micro-batch, and
scoring records with it, in a Spark worker.

**One version per batch, the same on replay.** The first task of micro-batch *N* to
ask reads the model's manifest, takes the version at the step's stage and *pins*
it: ``create`` on the key ``<pipeline>.<step>.<stage>.<N>`` in the
``SPANFLOW_MODEL_PINS`` bucket, which only the first writer wins. Every other task
of the batch, and the same batch replayed after a crash, reads the pin. So a
promotion takes effect at the next batch boundary (hot swap, no restart), a batch
is never scored by two versions, and a replay scores as the first run did.

**A bad version never stops the query.** Before pinning a new version it is
loaded (file checked against its sha256) and its inputs are checked against the
stream's fields; when that fails the previous pinned version stays (the reason is
logged and kept in the pin bucket under ``...<stage>.rejected``).

Loaded models are cached per worker process by (model, version).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from spanflow.errors import InvalidModel, ModelError
from spanflow.ml.artifacts import LoadedModel
from spanflow.ml.model_store import ModelStore
from spanflow.ml.registry import ModelVersion
from spanflow.protocol.names import MODEL_PINS_BUCKET as PINS
from spanflow.protocol.names import token
from spanflow.store.pins import Pins
from spanflow.store.session import JetStream, run_with_jetstream

START = "start"
"""Batch names beginning with this are the check made when a pipeline starts: a
problem there is raised, not worked around."""
log = logging.getLogger("spanflow.ml.scoring")
T = TypeVar("T")

_models: dict[tuple[str, int, str], LoadedModel] = {}
_lock = threading.Lock()


def check_fits(version: ModelVersion, fields: Mapping[str, str], name: str) -> None:
    """InvalidModel unless the stream has every input of the version, as a number (and
    the version is a model that predicts: a detector's normals are not)."""
    if version.format == "normal":
        raise InvalidModel(
            f"model {name} version {version.version} holds a detector's normals "
            "(spanflow detector fit): a detect_anomalies step uses it, not a score step"
        )
    missing = [f for f in version.inputs if f not in fields]
    if missing:
        raise InvalidModel(
            f"model {name} version {version.version} reads {list(version.inputs)}; the stream "
            f"has no {missing} (fields: {sorted(fields)})"
        )
    wrong = [f for f in version.inputs if fields[f].rstrip("?") not in ("long", "double")]
    if wrong:
        raise InvalidModel(
            f"model {name} version {version.version}: inputs {wrong} are not numbers"
        )


@dataclass(frozen=True)
class Pinning:
    """Where a score step keeps its per-batch choices."""

    pipeline: str
    step: str
    model: str
    fields: Mapping[str, str]

    def key(self, stage: str, batch: str) -> str:
        return f"{token(self.pipeline)}.{token(self.step)}.{stage}.{batch}"


async def _load(store: ModelStore, pin: Pinning, version: ModelVersion) -> LoadedModel:
    cache_key = (pin.model, version.version, version.sha256)
    with _lock:
        cached = _models.get(cache_key)
    if cached is not None:
        return cached
    check_fits(version, pin.fields, pin.model)
    loaded = await store.load(pin.model, version)
    with _lock:
        _models[cache_key] = loaded
    return loaded


async def _choose(js: JetStream, pin: Pinning, stage: str, batch: str) -> LoadedModel | None:
    """The model version that scores ``batch`` at ``stage`` (pinned on first ask)."""
    pins, store = Pins(js, PINS), ModelStore(js)
    key = pin.key(stage, batch)
    pinned = await pins.get(key)
    if pinned is None:
        pinned = await _decide(pins, store, pin, stage, key)
    if pinned.get("version") is None:
        return None
    manifest, _ = await store.manifest(pin.model)
    return await _load(store, pin, manifest.version(pinned["version"]))


async def _decide(
    pins: Pins, store: ModelStore, pin: Pinning, stage: str, key: str
) -> dict[str, Any]:
    last_key = pin.key(stage, "last")
    last = await pins.get(last_key) or {"version": None}
    choice = dict(last)
    try:
        manifest, _ = await store.manifest(pin.model)
        candidate = manifest.at_stage(stage)  # type: ignore[arg-type]
        if candidate is not None and candidate.version != last.get("version"):
            await _load(store, pin, candidate)  # refuses a bad file or a misfit
            choice = {"version": candidate.version}
        elif candidate is None and stage != "production":
            choice = {"version": None}  # no staging version: no shadow, no canary
    except ModelError as exc:
        if key.rsplit(".", 1)[-1].startswith(START):
            raise  # checked when the pipeline starts: say so now
        log.error("score %s: keeping version %s: %s", pin.step, last.get("version"), exc)
        await pins.put(pin.key(stage, "rejected"), {"reason": str(exc)})
    pinned, mine = await pins.first(key, choice)  # another task may pin first: theirs counts
    if mine:
        await pins.put(last_key, choice)
    return dict(pinned)


def models_for_batch(
    url: str, pin: Pinning, stages: Sequence[str], batch: str
) -> dict[str, LoadedModel | None]:
    """The model of each stage for one micro-batch (see the module doc)."""

    async def choose(js: JetStream) -> dict[str, LoadedModel | None]:
        return {stage: await _choose(js, pin, stage, batch) for stage in stages}

    return run_with_jetstream(url, choose)
