"""The plain, validated model of pipelines and streams (no I/O, no Spark)."""

from spanflow.spec.durations import Duration, format_duration, parse_duration
from spanflow.spec.operators import (
    AverageStep,
    CountStep,
    DeduplicateStep,
    EventTimeStep,
    FilterStep,
    FlatMapStep,
    ForwardStep,
    KeyByStep,
    MapStep,
    SelectStep,
    SinkStep,
    SourceStep,
    Step,
    SumStep,
    WindowStep,
    parse_aggregate,
)
from spanflow.spec.pipeline import PipelineSpec, format_validation_error
from spanflow.spec.schema import StreamFormat

__all__ = [
    "AverageStep",
    "CountStep",
    "DeduplicateStep",
    "Duration",
    "EventTimeStep",
    "FilterStep",
    "FlatMapStep",
    "ForwardStep",
    "KeyByStep",
    "MapStep",
    "PipelineSpec",
    "SelectStep",
    "SinkStep",
    "SourceStep",
    "Step",
    "StreamFormat",
    "SumStep",
    "WindowStep",
    "format_duration",
    "format_validation_error",
    "parse_aggregate",
    "parse_duration",
]
