"""``spanflow detector fit``: fit a ``multivariate`` detector's normal per key from the
history its pipeline has stored, as a Spark job.

1. **Read the history** the way the pipeline reads it: the steps from its sources to
   the detector are compiled as the pipeline compiles them (decoding, filters, maps,
   keys — whatever connector the source is: JetStream, Kafka, files), with readers that
   only look (no consumer moved, no dead letter sent again), and run once over what is
   stored (``Trigger.AvailableNow``), kept to the records whose event time is in
   ``[start, end)``, into Parquet files in a work folder.
2. **Fit per key**: the rows grouped by the step's key (``applyInPandas``), each key's
   in event-time order, fitted by :func:`spanflow.ml.normal.fit_normal` with the step's
   own settings — the fit a key's warm-up makes online, on its history instead.
3. The result is one :class:`~spanflow.ml.normal.Normals` (keys with fewer than
   ``MIN_ROWS`` readings are left out and counted): the caller pushes it to the model
   registry. Nothing is pushed before the job has finished, so a job killed half way
   leaves the registry as it was.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spanflow.errors import CompileError
from spanflow.ml.detectors import make_detector
from spanflow.ml.multivariate import MultivariateDetector
from spanflow.ml.normal import Normal, Normals, fit_normal
from spanflow.ml.rebaseline import key_text
from spanflow.spark.compile.frame import CompileContext, Frame
from spanflow.spark.compile.pipeline import compile_frames
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.models import DetectAnomaliesStep

MIN_ROWS = 16
"""Readings a key needs to be fitted (the same floor as a warm-up's)."""
FITTED_SCHEMA = "key string, rows long, normal string"


@dataclass
class FitResult:
    """What a fit found: the normals, and how many readings it read per key."""

    normals: Normals
    rows: int
    skipped: dict[str, int] = field(default_factory=dict)
    """Keys with too few readings to fit, and how many they had."""


def fit_detector(
    spark: SparkSession,
    spec: PipelineSpec,
    step: DetectAnomaliesStep,
    *,
    nats_url: str,
    work: Path,
    start: datetime | None = None,
    end: datetime | None = None,
) -> FitResult:
    """Fit ``step``'s normal per key on the history the pipeline has stored between
    ``start`` and ``end`` (see the module)."""
    frame = _history(spark, spec, step, nats_url)
    keys = list(frame.key)
    rows = _kept(frame, step, start, end)
    stored = work / "rows"
    query = (
        rows.writeStream.format("parquet")
        .option("path", str(stored))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise CompileError(step.id, f"reading the history failed: {query.exception()}")
    history = spark.read.schema(rows.schema).parquet(str(stored))
    fitter = _Fitter(step, keys, frame.event_time)

    def fit_group(group: Any) -> Any:  # a plain function: Spark reads its arity
        return fitter(group)

    grouped = history.groupBy(*keys) if keys else history.groupBy(F.lit(""))
    fitted = grouped.applyInPandas(fit_group, FITTED_SCHEMA).collect()
    return _result(step, fitted)


def _history(
    spark: SparkSession, spec: PipelineSpec, step: DetectAnomaliesStep, nats_url: str
) -> Frame:
    """The detector's input as the pipeline computes it, from passive readers."""
    core = spec.expanded()
    upstream = step.inputs[0]
    ctx = CompileContext(spark, nats_url, {}, passive=True)
    return compile_frames(ctx, core, core.path_to(upstream))[upstream]


def _kept(
    frame: Frame, step: DetectAnomaliesStep, start: datetime | None, end: datetime | None
) -> DataFrame:
    """The key, event time and fields of the records in ``[start, end)``."""
    df = frame.df
    if start is not None or end is not None:
        if frame.event_time is None:
            raise CompileError(
                step.id, "--from/--to need event time on the source (event_time: ...)"
            )
        column = F.col(frame.event_time)
        if start is not None:
            df = df.filter(column >= F.lit(start))
        if end is not None:
            df = df.filter(column < F.lit(end))
    columns = [*frame.key, *([frame.event_time] if frame.event_time else []), *step.fields]
    return df.select(*dict.fromkeys(columns))


@dataclass(frozen=True)
class _Fitter:
    """Fits one key's readings (a pandas group), in a Python worker."""

    step: DetectAnomaliesStep
    keys: list[str]
    event_time: str | None

    def __call__(self, group: Any) -> Any:
        import pandas as pd

        if self.event_time:
            group = group.sort_values(self.event_time, kind="stable")
        key = key_text(tuple(group[k].iloc[0] for k in self.keys)) if self.keys else ""
        values = group[list(self.step.fields)].astype(float).to_numpy()
        finite = values[[all(math.isfinite(v) for v in row) for row in values]]
        plain = ""
        if len(finite) >= MIN_ROWS:
            detector = make_detector(
                "multivariate", self.step.fields, self.step.detector_params(), None
            )
            assert isinstance(detector, MultivariateDetector)
            normal, _ = fit_normal(
                finite, self.step.fields, smoothing=detector.smoothing, gain=detector.gain,
                clip=detector.clip,
            )  # fmt: skip
            plain = json.dumps(normal.plain())
        return pd.DataFrame({"key": [key], "rows": [len(finite)], "normal": [plain]})


def _result(step: DetectAnomaliesStep, fitted: list[Any]) -> FitResult:
    keys: dict[str, Normal] = {}
    skipped: dict[str, int] = {}
    for row in fitted:
        if row["normal"]:
            keys[row["key"]] = Normal.from_plain(json.loads(row["normal"]))
        else:
            skipped[row["key"]] = int(row["rows"])
    total = sum(int(row["rows"]) for row in fitted)
    return FitResult(Normals(step.fields, keys), total, skipped)


def fit_in_session(
    spec: PipelineSpec,
    step: DetectAnomaliesStep,
    *,
    nats_url: str,
    start: datetime | None = None,
    end: datetime | None = None,
    master: str | None = None,
) -> FitResult:
    """:func:`fit_detector` on a Spark session of its own, in a work folder of its own
    (both gone afterwards)."""
    import tempfile

    from spanflow.spark.session import build_session

    spark = build_session(master=master, app_name=f"spanflow-fit-{spec.name}")
    try:
        with tempfile.TemporaryDirectory(prefix="spanflow-fit-") as work:
            return fit_detector(
                spark, spec, step, nats_url=nats_url, work=Path(work), start=start, end=end
            )
    finally:
        spark.stop()
