"""The plain, validated model of pipelines and streams (no I/O, no Spark)."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        MergeStep,
        SelectStep,
        SinkStep,
        SourceStep,
        Step,
        SumStep,
        UnionStep,
        WindowStep,
        parse_aggregate,
        partial_columns,
    )
    from spanflow.spec.pipeline import PipelineSpec, format_validation_error
    from spanflow.spec.schema import StreamFormat

_MODULES = (
    "spanflow.spec.durations",
    "spanflow.spec.operators",
    "spanflow.spec.pipeline",
    "spanflow.spec.schema",
)


def __getattr__(name: str) -> Any:
    """Lazy: ``spanflow.spec.schema`` alone is imported by Spark workers; the pipeline
    models (pydantic) are built only where specs are handled."""
    for module in _MODULES:
        mod = import_module(module)
        if name in vars(mod):
            return vars(mod)[name]
    raise AttributeError(f"module 'spanflow.spec' has no attribute {name!r}")


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
    "MergeStep",
    "PipelineSpec",
    "SelectStep",
    "SinkStep",
    "SourceStep",
    "Step",
    "StreamFormat",
    "SumStep",
    "UnionStep",
    "WindowStep",
    "format_duration",
    "format_validation_error",
    "parse_aggregate",
    "parse_duration",
    "partial_columns",
]
