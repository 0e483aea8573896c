"""The plain, validated model of pipelines and streams (no I/O, no Spark)."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanflow.spec.aggregates import parse_aggregate, partial_columns
    from spanflow.spec.durations import Duration, format_duration, parse_duration
    from spanflow.spec.pipeline import PipelineSpec, format_validation_error
    from spanflow.spec.schema import StreamFormat
    from spanflow.spec.steps import STEP_TYPES, Step, StepBase, StreamFacts
    from spanflow.spec.steps.classic import AverageStep, CountStep, ForwardStep, SumStep
    from spanflow.spec.steps.io import SinkStep, SourceStep
    from spanflow.spec.steps.joins import EnrichStep, JoinStep
    from spanflow.spec.steps.keyed import AggregateStep, DeduplicateStep, ProcessStep
    from spanflow.spec.steps.stateless import (
        EventTimeStep,
        FilterStep,
        FlatMapStep,
        KeyByStep,
        MapStep,
        SelectStep,
        UnionStep,
    )
    from spanflow.spec.steps.windows import CountWindowStep, MergeStep, WindowStep

_MODULES = (
    "spanflow.spec.durations",
    "spanflow.spec.aggregates",
    "spanflow.spec.pipeline",
    "spanflow.spec.schema",
)


def __getattr__(name: str) -> Any:
    """Lazy: ``spanflow.spec.schema`` alone is imported by Spark workers; the pipeline
    models (pydantic) are built only where specs are handled. Step classes are found
    in :mod:`spanflow.spec.steps`, wherever their family module is."""
    for module in _MODULES:
        mod = import_module(module)
        if name in vars(mod):
            return vars(mod)[name]
    steps = import_module("spanflow.spec.steps")
    try:
        return getattr(steps, name)
    except AttributeError:
        raise AttributeError(f"module 'spanflow.spec' has no attribute {name!r}") from None


__all__ = [
    "STEP_TYPES",
    "AggregateStep",
    "AverageStep",
    "CountStep",
    "CountWindowStep",
    "DeduplicateStep",
    "Duration",
    "EnrichStep",
    "EventTimeStep",
    "FilterStep",
    "FlatMapStep",
    "ForwardStep",
    "JoinStep",
    "KeyByStep",
    "MapStep",
    "MergeStep",
    "PipelineSpec",
    "ProcessStep",
    "SelectStep",
    "SinkStep",
    "SourceStep",
    "Step",
    "StepBase",
    "StreamFacts",
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
