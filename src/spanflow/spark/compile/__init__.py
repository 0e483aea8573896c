"""Compile pipeline specs to Spark: the graph walk (:mod:`.pipeline`), the registry of
step compilers (:mod:`.registry`) and one module per step family.

Imported lazily: Spark's Python workers import :mod:`.udf` (users' functions run
there) and must not pay for the rest.
"""

from typing import TYPE_CHECKING

from spanflow.plugins import lazy_exports

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


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "CompileContext",
    "CompiledSink",
    "Frame",
    "OutputMode",
    "compile_pipeline",
    "spanflow_schema",
    "step_schema",
]
