"""spanflow: real-time stream processing for the edge-cloud continuum.

Pipelines are defined in Python (``spanflow.Pipeline``) or YAML
(``spanflow.load_pipeline``), compiled to Spark Structured Streaming and wired over
NATS JetStream.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanflow.api import (
        Flow,
        KeyedProcessor,
        Pattern,
        Pipeline,
        Stream,
        load_pipeline,
        load_pipeline_text,
    )
    from spanflow.errors import SpanflowError
    from spanflow.spec import PipelineSpec

_EXPORTS = {
    "Flow": "spanflow.api",
    "KeyedProcessor": "spanflow.api",
    "Pattern": "spanflow.api",
    "Pipeline": "spanflow.api",
    "Stream": "spanflow.api",
    "load_pipeline": "spanflow.api",
    "load_pipeline_text": "spanflow.api",
    "SpanflowError": "spanflow.errors",
    "PipelineSpec": "spanflow.spec",
}


def __getattr__(name: str) -> Any:
    """Imported on first use: Spark's Python workers import ``spanflow.spark.*`` many
    times over and need none of the front ends."""
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'spanflow' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = [
    "Flow",
    "KeyedProcessor",
    "Pattern",
    "Pipeline",
    "PipelineSpec",
    "SpanflowError",
    "Stream",
    "load_pipeline",
    "load_pipeline_text",
]
