"""The pipeline version each sink's checkpoint was written by, and the check a new
version passes before it starts on those checkpoints.

Each sink's query keeps, beside Spark's files in its checkpoint, the spec that last
ran it (``spanflow-version.json``, secrets masked). A runner started on checkpoints
that hold state compares its spec with that one (:func:`spanflow.spec.upgrade.check_upgrade`)
and refuses, before any query starts, a version Spark would either fail to restore or
restore into the wrong steps; once its queries run it records its own spec. A
checkpoint written before spanflow kept versions is started as before, unchecked.
"""

from __future__ import annotations

import logging

import orjson
from pyspark.sql import SparkSession

from spanflow.spark.checkpoints import checkpoint_store, source_names
from spanflow.spec import locations
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.upgrade import StepUpgrade, UpgradeReport, check_upgrade

VERSION_FILE = "spanflow-version.json"

log = logging.getLogger(__name__)


def checked_upgrade(spark: SparkSession, checkpoint_dir: str, spec: PipelineSpec) -> UpgradeReport:
    """The verdicts on ``spec``'s stateful steps against the versions that wrote its
    sinks' checkpoints; raises :class:`~spanflow.spec.upgrade.UpgradeRefused` with
    every refused step."""
    steps: list[StepUpgrade] = []
    new = _masked(spec)
    for sink in spec.sinks():
        where = locations.join(checkpoint_dir, sink.id)
        if not checkpoint_store.exists(spark, locations.join(where, "offsets")):
            continue  # never ran: nothing to keep
        old = _stored(spark, where)
        if old is None:
            continue
        version = source_names.offset_log_version(spark, where)
        if version is None:
            continue  # never planned a batch: no offsets, no state
        named = {sink.id} if version == source_names.NAMED_LOG else set()
        report = check_upgrade(old, new, running={sink.id}, named=named)
        steps += [s for s in report.steps if s.sink == sink.id]
    report = UpgradeReport(tuple(steps))
    report.raise_if_refused(spec.instance)
    for step in report.steps:
        if step.verdict != "kept":
            log.info("%s: %s", spec.instance, step)
    return report


def record_version(spark: SparkSession, checkpoint_dir: str, spec: PipelineSpec) -> None:
    """Store ``spec`` as the version of each of its sinks' checkpoints (a restart of the
    same version leaves the file as it is: one read, no write to a remote store)."""
    text = orjson.dumps(spec.secret_free(), option=orjson.OPT_INDENT_2).decode()
    for sink in spec.sinks():
        location = locations.join(checkpoint_dir, sink.id, VERSION_FILE)
        if checkpoint_store.read_text(spark, location) != text:
            checkpoint_store.write_text(spark, location, text)


def _masked(spec: PipelineSpec) -> PipelineSpec:
    """``spec`` as it is stored (secrets masked), so both sides compare alike."""
    try:
        return PipelineSpec.model_validate(spec.secret_free())
    except ValueError:
        return spec


def _stored(spark: SparkSession, where: str) -> PipelineSpec | None:
    text = checkpoint_store.read_text(spark, locations.join(where, VERSION_FILE))
    if text is None:
        return None
    try:
        return PipelineSpec.model_validate(orjson.loads(text))
    except ValueError as exc:  # written by another spanflow release, say
        log.warning("%s: cannot read the version that wrote it (%s): not checked", where, exc)
        return None
