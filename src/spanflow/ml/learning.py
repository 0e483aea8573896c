"""Online learning as keyed state: a River model per key (or one for the stream) that
predicts each event, then learns from it when it has a label (prequential
evaluation), with running River metrics.

The model and metrics are kept as :mod:`snapshot` text in Spark state and written
with the batch's output, so a batch that Spark replays after a crash starts from the
state before it: an event is never learnt twice.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from spanflow.api.processor import Context, KeyedProcessor, Record, StateDeclarations
from spanflow.errors import ModelNotFound
from spanflow.ml import snapshot
from spanflow.ml.river_classes import river_class
from spanflow.protocol.names import token
from spanflow.store.session import run_sync

log = logging.getLogger("spanflow.ml.learning")
PREDICTION, PROBABILITY, LEARNED = "prediction", "probability", "learned"
CLASSIFICATION_METRICS = ("accuracy", "f1")
REGRESSION_METRICS = ("mae", "rmse")


class Learner:
    """Builds the model and metrics of a ``learn`` step; predicts then learns."""

    def __init__(
        self,
        model: str,
        features: tuple[str, ...],
        target: str,
        params: Mapping[str, Any],
        scale: str,
        binary: bool,
    ) -> None:
        from river import base

        self.cls = river_class(model)
        self.features, self.target = features, target
        self.params, self.scale, self.binary = dict(params), scale, binary
        probe = self.cls(**self.params)  # a bad parameter fails here, at pipeline start
        if isinstance(probe, base.Classifier):
            self.task = "classification"
        elif isinstance(probe, base.Regressor):
            self.task = "regression"
        else:
            raise ValueError(f"{model} is neither a River classifier nor a regressor")

    @property
    def metric_names(self) -> tuple[str, ...]:
        return CLASSIFICATION_METRICS if self.task == "classification" else REGRESSION_METRICS

    def build_model(self) -> Any:
        from river import preprocessing

        model = self.cls(**self.params)
        if self.scale == "standard":
            return preprocessing.StandardScaler() | model
        if self.scale == "minmax":
            return preprocessing.MinMaxScaler() | model
        return model

    def build_metrics(self) -> list[Any]:
        from river import metrics

        if self.task == "regression":
            return [metrics.MAE(), metrics.RMSE()]
        return [metrics.Accuracy(), metrics.F1() if self.binary else metrics.MacroF1()]

    def load(self, state: Any) -> tuple[Any, list[Any], int]:
        if state is None:
            return self.build_model(), self.build_metrics(), 0
        model = snapshot.restore(state["model"], self.build_model())
        kept = snapshot.restore(state["metrics"], self.build_metrics())
        return model, kept, state["n"]

    def save(self, model: Any, kept: list[Any], n: int) -> Any:
        return {"model": snapshot.dump(model), "metrics": snapshot.dump(kept), "n": n}

    def step(
        self, model: Any, kept: list[Any], record: Mapping[str, Any]
    ) -> tuple[Any, float | None, bool]:
        """(prediction, probability of it, learnt?) — predicted before learning."""
        x = {f: float(record[f]) for f in self.features if record.get(f) is not None}
        probability = None
        if self.task == "classification":
            probabilities = model.predict_proba_one(x)
            prediction = model.predict_one(x)
            if prediction is not None:
                probability = float(probabilities.get(prediction, 0.0))
        else:
            prediction = model.predict_one(x)
        y = record.get(self.target)
        if y is None:
            return prediction, probability, False
        if self.task == "regression":
            y = float(y)
        if prediction is not None:
            for metric in kept:
                metric.update(y, prediction)
        model.learn_one(x, y)
        return prediction, probability, True


@dataclass(frozen=True)
class Publishing:
    """Where and how often a learn step publishes its models to the registry."""

    url: str
    name: str
    every: float | None
    """Seconds between publications; None: only when asked."""
    per_key: bool
    origin: str  # pipeline/step, for the version's note


_REQUESTS: dict[tuple[str, str], tuple[float, int]] = {}
"""(url, name) → (when read, request number): one registry read per second per worker."""
REQUEST_CACHE_SECONDS = 1.0


def publication_request(settings: Publishing) -> int:
    """The latest "publish now" request for ``settings.name`` (0: none), read at most
    once a second per Python worker (every key of every batch asks)."""
    from spanflow.ml.model_store import ModelStore, with_store

    cache_key = (settings.url, settings.name)
    now = time.monotonic()
    cached = _REQUESTS.get(cache_key)
    if cached is not None and now - cached[0] < REQUEST_CACHE_SECONDS:
        return cached[1]

    async def work(store: ModelStore) -> int:
        return await store.publication_request(settings.name)

    request = run_sync(with_store(settings.url, work))
    _REQUESTS[cache_key] = (now, request)
    return request


def publish_model(
    settings: Publishing, key: Any, model: Any, features: tuple[str, ...], learned: int
) -> int | None:
    """Push ``model`` (pickled: the River format) as a new staging version, unless the
    newest version is the same file (a replayed batch publishes nothing new). The
    version number, or None when nothing was pushed."""
    from spanflow.ml.artifacts import sha256_of
    from spanflow.ml.model_store import ModelStore, with_store

    name = settings.name
    if settings.per_key:
        name = f"{name}-{token(key)}"[:64]
    data = pickle.dumps(model)
    digest = sha256_of(data)

    async def work(store: ModelStore) -> int | None:
        try:
            manifest, _ = await store.manifest(name)
            if manifest.versions and manifest.versions[-1].sha256 == digest:
                return None
        except ModelNotFound:
            pass
        note = f"learnt by {settings.origin} from {learned} records"
        version = await store.push(name, data, format="river", features=features, note=note)
        return version.version

    return run_sync(with_store(settings.url, work))


class OnlineLearning(KeyedProcessor):
    """Adds ``prediction``, ``probability`` (classifiers), the running metrics and
    ``learned`` (events learnt so far by this key's model) to every record; publishes
    each key's model to the registry every ``publish.every`` seconds when asked."""

    def __init__(
        self,
        *,
        learner: Callable[[], Learner],
        hidden: tuple[str, ...] = (),
        publish: Publishing | None = None,
    ) -> None:
        self.learner = learner()
        self.hidden = frozenset(hidden)
        self.publish = publish

    def init(self, state: StateDeclarations) -> None:
        self.state = state.value("model", "binary")

    def process(self, key: Any, rows: list[Record], ctx: Context) -> Iterator[Record]:
        blob = self.state.get()
        last: dict[str, Any] = orjson.loads(blob) if blob else {}
        model, kept, n = self.learner.load(last or None)
        out = []
        for row in rows:
            prediction, probability, learnt = self.learner.step(model, kept, row)
            n += learnt
            record = {k: v for k, v in row.items() if k not in self.hidden}
            record[PREDICTION] = prediction
            if self.learner.task == "classification":
                record[PROBABILITY] = probability
            for name, metric in zip(self.learner.metric_names, kept, strict=True):
                record[name] = float(metric.get())
            record[LEARNED] = n
            out.append(record)
        saved = self.learner.save(model, kept, n)
        published = last.get("published", 0.0), last.get("request", 0)
        saved["published"], saved["request"] = self._maybe_publish(key, model, n, *published)
        self.state.set(orjson.dumps(saved))
        yield from out

    def _maybe_publish(
        self, key: Any, model: Any, n: int, last: float, handled: int
    ) -> tuple[float, int]:
        """Publish when due (``every`` seconds since the last publication, or a "publish
        now" request not handled yet); the time of the last publication and the last
        request handled. A failure is logged and tried again next batch: it never
        fails the batch."""
        if self.publish is None or n == 0:
            return last, handled
        now = time.time()
        try:
            request = publication_request(self.publish)
        except Exception as exc:
            log.error("reading publish requests for %r failed: %s", self.publish.name, exc)
            request = handled
        every = self.publish.every
        due = every is not None and now - last >= every
        if not due and request <= handled:
            return last, handled
        try:
            publish_model(self.publish, key, model, self.learner.features, n)
        except Exception as exc:
            log.error("publishing the model of key %r failed: %s", key, exc)
            return last, handled
        return now, max(request, handled)
