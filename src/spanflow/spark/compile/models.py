"""Steps whose state is a model (:mod:`spanflow.ml`), run as built-in keyed processors:
the model of each key is Spark state, checkpointed with the query."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

from pyspark.sql.pandas.types import to_arrow_schema

from spanflow.errors import CompileError, ModelError
from spanflow.ml.anomaly import ADDED, SHADOW, AnomalyDetection
from spanflow.ml.detectors import make_detector
from spanflow.ml.episodes import EPISODE_FIELDS, Episodes
from spanflow.ml.fitted import Fitted, FittedNormals, stages_for
from spanflow.ml.learning import (
    LEARNED,
    PREDICTION,
    PROBABILITY,
    Learner,
    OnlineLearning,
    Publishing,
)
from spanflow.ml.rebaseline import Rebaselining
from spanflow.ml.scoring import START, Pinning, models_for_batch
from spanflow.ml.thresholds import make_threshold
from spanflow.spark.compile.frame import (
    CompileContext,
    Frame,
    keyed_input,
    spanflow_schema,
    user_schema,
)
from spanflow.spark.compile.process import transform_keyed
from spanflow.spark.compile.registry import compiles
from spanflow.spark.scoring_udf import ScoreSettings, score_udf
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.models import (
    LEARN_FIELDS,
    SCORE_FIELDS,
    DetectAnomaliesStep,
    LearnStep,
    ScoreStep,
)

NUMERIC = ("long", "double")


def _check_numeric(step_id: str, fields: dict[str, str], names: tuple[str, ...], what: str) -> None:
    """A CompileError unless every one of ``names`` is a numeric field."""
    for name in names:
        declared = fields.get(name)
        if declared is None:
            raise CompileError(step_id, f"no {what} {name!r}; fields: {sorted(fields)}")
        if declared.rstrip("?") not in NUMERIC:
            raise CompileError(step_id, f"{what} {name!r} is {declared}, not a number")


@compiles(DetectAnomaliesStep)
def compile_detect_anomalies(
    ctx: CompileContext, spec: PipelineSpec, step: DetectAnomaliesStep, inputs: list[Frame]
) -> Frame:
    up, frame, fields = keyed_input(step.id, inputs)
    _check_numeric(step.id, fields, step.fields, "field")
    season = step.season_seconds(has_event_time=up.event_time is not None)
    detector = functools.partial(
        make_detector, step.method_or_default, step.fields, step.detector_params(), season
    )
    try:
        detector()  # an unknown River class or a bad parameter fails now, not in a worker
    except (TypeError, ValueError) as exc:
        raise CompileError(step.id, f"method {step.method_or_default}: {exc}") from None
    output = {k: v for k, v in fields.items() if k not in ADDED}
    output.update(ADDED)
    if step.shadow:
        output.update(SHADOW)
    episodes = None
    if step.emit == "episodes":
        readings, seconds = step.quiet_readings_or_seconds()
        episodes = functools.partial(Episodes, quiet_readings=readings, quiet_seconds=seconds)
        kept = [*frame.key, *([up.event_time] if up.event_time else [])]
        output = {k: fields[k] for k in kept if k in fields}
        output.update(EPISODE_FIELDS)
    factory = functools.partial(
        AnomalyDetection,
        detector=detector,
        threshold=functools.partial(make_threshold, step.threshold_or_default),
        warmup=step.warmup_or_default,
        only_anomalies=step.emit == "anomalies",
        event_time=up.event_time,
        hidden=tuple(c for c in frame.df.columns if c not in output),
        episodes=episodes,
        rebaselines=(
            BatchRebaselines(Rebaselining(ctx.nats_url, spec.name, spec.instance, step.id))
            if ctx.nats_url
            else None
        ),
        fitted=_fitted_normals(ctx, spec, step),
        canary=step.canary,
        shadow=step.shadow,
    )
    df = transform_keyed(ctx, spec, step.id, frame, factory=factory, output=output, clock="none")
    return Frame(df, key=up.key, mode="append")


def _fitted_normals(
    ctx: CompileContext, spec: PipelineSpec, step: DetectAnomaliesStep
) -> BatchNormals | None:
    """Where a multivariate step's workers find the normals fitted from history."""
    if not ctx.nats_url or step.method_or_default != "multivariate":
        return None
    where = FittedNormals(
        ctx.nats_url,
        spec.instance,
        step.id,
        step.model_name(spec.name),
        step.fields,
        stages_for(step.canary, step.shadow),
    )
    return BatchNormals(where)


@dataclass(frozen=True)
class BatchNormals:
    """The fitted normals that hold for the micro-batch a worker's task is in."""

    where: FittedNormals

    def __call__(self) -> Mapping[str, Fitted | None]:
        from pyspark import TaskContext

        task = TaskContext.get()
        batch = task.getLocalProperty("streaming.sql.batchId") if task is not None else None
        return self.where.for_batch(batch)


@dataclass(frozen=True)
class BatchRebaselines:
    """The rebaselines that hold for the micro-batch a worker's task is in."""

    where: Rebaselining

    def __call__(self) -> Mapping[str, int]:
        from pyspark import TaskContext

        task = TaskContext.get()
        batch = task.getLocalProperty("streaming.sql.batchId") if task is not None else None
        return self.where.for_batch(batch)


@compiles(LearnStep)
def compile_learn(
    ctx: CompileContext, spec: PipelineSpec, step: LearnStep, inputs: list[Frame]
) -> Frame:
    up, frame, fields = keyed_input(step.id, inputs)
    _check_numeric(step.id, fields, step.features, "feature")
    target = fields.get(step.target)
    if target is None:
        raise CompileError(step.id, f"no target field {step.target!r}; fields: {sorted(fields)}")
    kind = target.rstrip("?")
    learner = functools.partial(
        Learner,
        step.model,
        step.features,
        step.target,
        step.params,
        step.scale,
        kind == "boolean",
    )
    try:
        probe = learner()
    except (TypeError, ValueError) as exc:
        raise CompileError(step.id, f"model {step.model}: {exc}") from None
    if probe.task == "regression" and kind not in NUMERIC:
        raise CompileError(
            step.id, f"a regressor needs a numeric target; {step.target!r} is {target}"
        )
    output = {k: v for k, v in fields.items() if k not in LEARN_FIELDS}
    output[PREDICTION] = ("double" if probe.task == "regression" else kind) + "?"
    if probe.task == "classification":
        output[PROBABILITY] = "double?"
    output.update(dict.fromkeys(probe.metric_names, "double"))
    output[LEARNED] = "long"
    publish = None
    if step.publish_as is not None:
        publish = Publishing(
            url=ctx.nats_url,
            name=step.publish_as,
            every=step.publish_every,
            per_key=bool(up.key),
            origin=f"{spec.instance}/{step.id}",
        )
    factory = functools.partial(
        OnlineLearning,
        learner=learner,
        hidden=tuple(c for c in frame.df.columns if c not in output),
        publish=publish,
    )
    df = transform_keyed(ctx, spec, step.id, frame, factory=factory, output=output, clock="none")
    return Frame(df, key=up.key, mode="append")


@compiles(ScoreStep)
def compile_score(
    ctx: CompileContext, spec: PipelineSpec, step: ScoreStep, inputs: list[Frame]
) -> Frame:
    (up,) = inputs
    fields = spanflow_schema(step.id, up.df.schema)
    pin = Pinning(spec.instance, step.id, step.model, fields)
    try:  # the model exists, has a version at the stage, loads and fits the stream
        check = f"{START}-{uuid.uuid4().hex[:12]}"  # a fresh check at every start
        chosen = models_for_batch(ctx.nats_url, pin, [step.stage], check)[step.stage]
    except (ModelError, ValueError) as exc:
        raise CompileError(step.id, str(exc)) from None
    if chosen is None:
        raise CompileError(step.id, f"model {step.model!r} has no {step.stage} version")
    output = {k: v for k, v in fields.items() if k not in SCORE_FIELDS}
    output.update(
        prediction=step.prediction_type + "?", probability="double?", model_version="long?"
    )
    if step.shadow:
        output.update(shadow_prediction=step.prediction_type + "?", shadow_version="long?")
    out_struct = user_schema(output)
    canary_key = step.canary_key or (up.key[0] if up.key else None)
    udf = score_udf(
        ScoreSettings(
            url=ctx.nats_url,
            pin=pin,
            stage=step.stage,
            shadow=step.shadow,
            canary=step.canary,
            canary_key=canary_key,
            prediction_type=step.prediction_type,
            columns=tuple(output),
            pipeline=spec.instance,
            step=step.id,
        ),
        to_arrow_schema(out_struct, timezone="UTC"),
    )
    return replace(up, df=up.df.mapInArrow(udf, out_struct))
