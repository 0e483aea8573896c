"""Steps with a model: anomaly detection and online learning (the model is keyed
engine state), and scoring with a model from the registry. A learnt model is keyed
engine state — per key, or one for the whole stream when the stream has no key
(then the step needs every site's data: a global step)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from spanflow.spec.durations import Duration, parse_duration
from spanflow.spec.steps.base import Placement, Rate, StepBase, StreamFacts, one_or_many

METHOD = r"^(likelihood|cad|multivariate|mewma|robust|hst|river:[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+)$"
_CALL = re.compile(r"^\s*(quantile|adaptive)\s*\(\s*([0-9.eE+-]+)\s*\)\s*$")
ADDED_FIELDS = ("anomaly_score", "is_anomaly", "anomaly_field")
WARMUPS = {"likelihood": 300, "cad": 300, "multivariate": 400, "mewma": 200}
"""Default warm-up per method (docs/ml.md); 100 for the others."""
CAD_THRESHOLD = 0.75
"""cad's alarm score: the reference's own (a score this high starts its rest period)."""


def _with_added(up: StreamFacts, added: Sequence[str]) -> StreamFacts:
    """The facts of a stream that passes its records on with ``added`` fields set."""
    return StreamFacts(
        key=up.key if not set(added) & set(up.key) else (),
        entity=frozenset(up.entity - set(added)),
        event_time=up.event_time,
    )


def parse_threshold(value: float | str) -> tuple[str, float]:
    """A threshold as (kind, number): ``0.7`` → static, ``"quantile(0.99)"``,
    ``"adaptive"`` or ``"adaptive(3)"`` (k standard deviations).

    >>> parse_threshold("quantile(0.99)")
    ('quantile', 0.99)
    """
    if isinstance(value, bool):
        raise ValueError("a threshold is a score, 'quantile(q)' or 'adaptive(k)'")
    if isinstance(value, str) and value.strip() == "adaptive":
        return "adaptive", 3.0
    if isinstance(value, str):
        match = _CALL.match(value)
        if match is None:
            try:
                value = float(value)
            except ValueError:
                raise ValueError(
                    f"unknown threshold {value!r}: give a score like 0.7, 'quantile(0.99)', "
                    "'adaptive' or 'adaptive(3)'"
                ) from None
        else:
            kind, number = match.group(1), float(match.group(2))
            if kind == "quantile" and not 0 < number < 1:
                raise ValueError(f"quantile(q) needs 0 < q < 1, not {number}")
            if kind == "adaptive" and number <= 0:
                raise ValueError(f"adaptive(k) needs k > 0, not {number}")
            return kind, number
    if not 0 < value <= 1:
        raise ValueError(f"a static threshold is a score in (0, 1], not {value}")
    return "static", float(value)


class DetectAnomaliesStep(StepBase):
    """Scores every record for how anomalous it is, per key (or over the whole stream
    when it has no key), and adds ``anomaly_score`` (0 to 1), ``is_anomaly`` and
    ``anomaly_field`` (the field that contributed most).

    ``method``: ``likelihood`` (the default: an anomaly likelihood over two streaming
    predictors, with the period of a cycle found in the data), ``multivariate`` (a
    MEWMA T-squared chart over the fields together; a fault stays flagged until it is
    undone), ``robust`` (a
    streaming baseline with a daily profile), ``hst`` (River's Half-Space Trees) or
    any River detector as ``river:<module>.<Class>``; ``params`` go to it.
    ``threshold``: a score (static), ``quantile(q)`` of the key's scores so far, or
    ``adaptive``/``adaptive(k)`` (mean + k standard deviations of recent scores). The
    first ``warmup`` records of a key get scores but are never anomalies. ``emit:
    anomalies`` keeps only the anomalies.
    """

    placement: ClassVar[Placement] = Placement.KEYED

    upgrade_free: ClassVar[frozenset[str]] = frozenset(
        {"threshold", "warmup", "quiet", "model", "canary", "shadow"}
    )
    """The models, the records seen and the threshold's learned limits stay as they are
    when these change (a threshold of another kind is a change of state)."""

    def keeps_python_state(self) -> bool:
        return True

    def state_shape(self) -> dict[str, Any]:
        kind, _ = parse_threshold(self.threshold_or_default)
        return {**super().state_shape(), "threshold kind": kind}

    type: Literal["detect_anomalies"] = "detect_anomalies"
    fields: tuple[str, ...] = Field(min_length=1, description="Numeric fields to watch.")
    method: str | None = Field(
        default=None,
        pattern=METHOD,
        description="multivariate, cad, likelihood, mewma, robust, hst or "
        "river:<module>.<Class>. Default: multivariate over two or more fields; over one, "
        "cad when its range is declared, else likelihood.",
    )
    range: tuple[float, float] | dict[str, tuple[float, float]] | None = Field(
        default=None,
        description="The fields' range, as a plant knows its sensors': [low, high] for "
        "every field, or {field: [low, high]}. Used by cad to quantize readings (without "
        "it, cad uses the range seen so far).",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="Parameters of the method (plain data)."
    )
    threshold: float | str | None = Field(
        default=None,
        description="A score, 'quantile(q)' or 'adaptive(k)' (default: 0.5 for likelihood, "
        "multivariate and robust, 0.75 — one reading in 1,000 per key — for hst and river:).",
    )
    warmup: int | None = Field(
        default=None,
        ge=0,
        description="Records per key before any anomaly (default: 400 for multivariate "
        "and 200 for mewma, the records a key's normal is fitted on; 300 for likelihood "
        "and cad, the records they learn from first; 100 for the others).",
    )
    emit: Literal["all", "anomalies", "episodes"] = Field(
        default="all",
        description="all records, only anomalies, or episodes: a row when an episode of "
        "anomalies starts and one when it ends.",
    )
    quiet: int | str | None = Field(
        default=None,
        description="emit: episodes: an episode ends after this many of the key's "
        "readings (a number) or this much event time (a duration such as '10m') without "
        "an anomaly (default: 100 readings).",
    )
    model: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="multivariate: the registry model whose production version holds "
        "normals fitted from history per key (spanflow detector fit); a key it has a "
        "normal for starts from it, the others learn online. Default: "
        "<pipeline>-<step>.",
    )
    canary: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="multivariate: the share of keys on the model's staging version.",
    )
    shadow: bool = Field(
        default=False,
        description="multivariate: also score every record with the model's staging "
        "version (shadow_score, shadow_anomaly, shadow_version; null without one).",
    )
    seasonality: str | None = Field(
        default=None,
        description="Period of the cycle the detector expects: a duration such as '1d', "
        "or 'none'. Default: likelihood finds the period in each key's data (in "
        "records, without event time); robust assumes 1d when the stream has event time.",
    )

    @field_validator("fields", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return one_or_many(v)

    @model_validator(mode="after")
    def _valid(self) -> DetectAnomaliesStep:
        if self.threshold is not None:
            parse_threshold(self.threshold)
        if self.seasonality not in (None, "none"):
            if self.method_or_default not in ("robust", "likelihood"):
                raise ValueError("seasonality applies to the likelihood and robust methods only")
            parse_duration(self.seasonality)
        self._check_range()
        fitted = self.model is not None or self.canary or self.shadow
        if fitted and self.method_or_default != "multivariate":
            raise ValueError(
                "model, canary and shadow apply to method multivariate (normals fitted "
                "from history)"
            )
        if self.shadow and self.emit == "episodes":
            raise ValueError("shadow scores records: emit all or anomalies, not episodes")
        clash = set(self.fields) & set(ADDED_FIELDS)
        if clash:
            raise ValueError(f"{sorted(clash)} are fields this step adds, not inputs")
        if self.quiet is not None:
            if self.emit != "episodes":
                raise ValueError("quiet applies to emit: episodes")
            if isinstance(self.quiet, bool) or (isinstance(self.quiet, int) and self.quiet < 1):
                raise ValueError(
                    f"quiet is a number of readings >= 1 or a duration, not {self.quiet!r}"
                )
            if isinstance(self.quiet, str):
                parse_duration(self.quiet)
        return self

    def _check_range(self) -> None:
        ranges = self.ranges()
        for name, (low, high) in ranges.items():
            if name not in self.fields:
                raise ValueError(f"range of {name!r}: not one of the fields {list(self.fields)}")
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise ValueError(f"range of {name!r} is [low, high] with low <= high, not "
                                 f"{[low, high]}")  # fmt: skip
        if ranges and self.method_or_default != "cad":
            raise ValueError(
                f"range applies to method cad (the default over one field), not "
                f"{self.method_or_default}"
            )

    def ranges(self) -> dict[str, tuple[float, float]]:
        """The declared range of each field that has one."""
        if self.range is None:
            return {}
        if isinstance(self.range, dict):
            return {name: (float(lo), float(hi)) for name, (lo, hi) in self.range.items()}
        low, high = self.range
        return dict.fromkeys(self.fields, (float(low), float(high)))

    @property
    def method_or_default(self) -> str:
        """The method: the one named, else ``multivariate`` over two or more fields and,
        over one, ``cad`` when its range is declared (it quantizes by it), else
        ``likelihood`` (better than cad on a range it has to learn: docs/benchmarks.md)."""
        if self.method is not None:
            return self.method
        if len(self.fields) >= 2:
            return "multivariate"
        return "cad" if self.range is not None else "likelihood"

    def model_name(self, pipeline: str) -> str:
        """The registry model a multivariate step reads its fitted normals from: its
        ``model``, else the pipeline's and step's names (letters, digits, - and _; at
        most 64)."""
        if self.model is not None:
            return self.model
        name = re.sub(r"[^A-Za-z0-9_-]", "-", f"{pipeline}-{self.id}")
        return name[:64]

    def quiet_readings_or_seconds(self) -> tuple[int | None, float | None]:
        """The episode's quiet period: (readings, None) or (None, seconds)."""
        if isinstance(self.quiet, str):
            return None, parse_duration(self.quiet)
        return self.quiet, None

    @property
    def threshold_or_default(self) -> float | str:
        if self.threshold is not None:
            return self.threshold
        method = self.method_or_default
        if method == "cad":
            return CAD_THRESHOLD
        return 0.5 if method in ("likelihood", "multivariate", "mewma", "robust") else 0.75

    @property
    def warmup_or_default(self) -> int:
        if self.warmup is not None:
            return self.warmup
        return WARMUPS.get(self.method_or_default, 100)

    def season_seconds(self, has_event_time: bool) -> float | None:
        """The period of the profile the detector is given, or None (likelihood: none
        given, it looks for one unless ``seasonality: none``)."""
        method = self.method_or_default
        if method not in ("robust", "likelihood") or self.seasonality == "none":
            return None
        if self.seasonality is None:
            return 86400.0 if has_event_time and method == "robust" else None
        return parse_duration(self.seasonality)

    def detector_params(self) -> dict[str, Any]:
        """``params``, plus what ``seasonality: none`` means for the likelihood method,
        the warm-up a fitted normal is fitted on, and cad's declared ranges."""
        method = self.method_or_default
        if method == "likelihood" and self.seasonality == "none":
            return {**self.params, "detect_period": False}
        if method in ("multivariate", "mewma"):  # fitted on the warm-up
            return {**self.params, "warmup": self.warmup_or_default}
        if method == "cad" and self.range is not None:
            return {**self.params, "ranges": self.ranges()}
        return dict(self.params)

    def check_inputs(self, inputs: Sequence[StreamFacts]) -> None:
        if self.seasonality not in (None, "none") and inputs[0].event_time is None:
            raise ValueError(
                f"detect_anomalies {self.id!r} has seasonality but its input has no event "
                "time: set event_time on the source, or seasonality: none"
            )
        if isinstance(self.quiet, str) and inputs[0].event_time is None:
            raise ValueError(
                f"detect_anomalies {self.id!r} has a quiet period in time but its input has "
                "no event time: set event_time on the source, or give quiet in readings"
            )

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        return _with_added(inputs[0], ADDED_FIELDS)


MODEL_REF = r"^river:[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$"
LEARN_FIELDS = ("prediction", "probability", "learned", "accuracy", "f1", "mae", "rmse")


class LearnStep(StepBase):
    """Online learning: a River model per key (or one for the whole stream) predicts
    each record, then learns from it when ``target`` is set (prequential), and emits
    the record with ``prediction``, ``probability`` (classifiers), running metrics —
    ``accuracy`` and ``f1`` for classifiers, ``mae`` and ``rmse`` for regressors —
    and ``learned``, the number of records its model has learnt from.

    ``model`` is a River class, ``river:<module>.<Class>``, built with ``params``;
    ``scale`` puts a StandardScaler (default), a MinMaxScaler or nothing before it.
    Model and metrics are keyed state, checkpointed with the output: a record is
    never learnt twice, even when Spark replays a batch after a crash.
    """

    placement: ClassVar[Placement] = Placement.KEYED

    def keeps_python_state(self) -> bool:
        return True

    type: Literal["learn"] = "learn"
    model: str = Field(pattern=MODEL_REF, description="river:<module>.<Class>.")
    features: tuple[str, ...] = Field(min_length=1, description="Numeric input fields.")
    target: str = Field(description="The label field (null: predict only).")
    params: dict[str, Any] = Field(default_factory=dict, description="Model parameters.")
    scale: Literal["standard", "minmax", "none"] = "standard"
    publish_as: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,48}$",
        description="Publish the learnt model to the registry under this name "
        "(per key: '<name>-<key>'), as a new staging version: every publish_every, and "
        "at the next batch after 'spanflow model publish <name>'.",
    )
    publish_every: Duration | None = Field(
        default=600.0,
        gt=0,
        description="How often a key's model is published (null: only when asked).",
    )

    @field_validator("features", mode="before")
    @classmethod
    def _many(cls, v: Any) -> Any:
        return one_or_many(v)

    @model_validator(mode="after")
    def _valid(self) -> LearnStep:
        if self.target in self.features:
            raise ValueError(f"the target {self.target!r} cannot also be a feature")
        clash = (set(self.features) | {self.target}) & set(LEARN_FIELDS)
        if clash:
            raise ValueError(f"{sorted(clash)} are fields this step adds, not inputs")
        return self

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        return _with_added(inputs[0], LEARN_FIELDS)


SCORE_FIELDS = ("prediction", "probability", "model_version", "shadow_prediction", "shadow_version")


class ScoreStep(StepBase):
    """Scores each record with a model from the registry, loaded where the step runs.

    The version at ``stage`` (production by default) scores; when the registry's
    pointer moves, the next micro-batch is scored by the new version — no restart,
    one version per batch, the same version when a batch is replayed. A new version
    that cannot be loaded or does not fit the stream is refused and the previous one
    keeps scoring. ``shadow: true`` also scores every record with the staging version
    (``shadow_prediction``, ``shadow_version``); ``canary: 0.1`` lets the staging
    version score a tenth of the keys (by a hash of ``canary_key``, default the
    stream's key) instead of production. ``model_version`` names the version that
    made each ``prediction``.
    """

    rate: ClassVar[Rate] = Rate.KEEPS

    type: Literal["score"] = "score"
    model: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="Registry model name.")
    stage: Literal["production", "staging"] = "production"
    prediction_type: Literal["double", "long", "string", "boolean"] = Field(
        default="double", description="Type of the model's prediction."
    )
    shadow: bool = False
    canary: float | None = Field(default=None, gt=0, lt=1)
    canary_key: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> ScoreStep:
        if self.canary is not None and self.stage != "production":
            raise ValueError("canary splits keys between production and staging: stage production")
        return self

    def check_inputs(self, inputs: Sequence[StreamFacts]) -> None:
        if self.canary is not None and not (self.canary_key or inputs[0].key):
            raise ValueError(
                f"score {self.id!r}: a canary splits by key; add key_by(...) or canary_key"
            )

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        return _with_added(inputs[0], SCORE_FIELDS)
