"""Compile pipeline specs to Spark: the graph walk (:mod:`.pipeline`), the registry of
step compilers (:mod:`.registry`) and one module per step family.

Imported lazily: Spark's Python workers import :mod:`.udf` (users' functions run
there) and must not pay for the rest.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanflow.spark.compile.frame import CompileContext, Frame, OutputMode
    from spanflow.spark.compile.pipeline import (
        CompiledSink,
        compile_pipeline,
        spanflow_schema,
        step_schema,
    )

_EXPORTS = {
    "CompileContext": "spanflow.spark.compile.frame",
    "Frame": "spanflow.spark.compile.frame",
    "OutputMode": "spanflow.spark.compile.frame",
    "CompiledSink": "spanflow.spark.compile.pipeline",
    "compile_pipeline": "spanflow.spark.compile.pipeline",
    "spanflow_schema": "spanflow.spark.compile.pipeline",
    "step_schema": "spanflow.spark.compile.pipeline",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CompileContext",
    "CompiledSink",
    "Frame",
    "OutputMode",
    "compile_pipeline",
    "spanflow_schema",
    "step_schema",
]
