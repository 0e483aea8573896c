"""Front ends that produce a pipeline spec: the fluent Python API and YAML files, and
the base class of keyed processors.

Imported lazily: Spark's Python workers import :mod:`spanflow.api.processor` (users'
processors derive from it) and need none of the rest.
"""

from typing import TYPE_CHECKING

from spanflow.plugins import lazy_exports

if TYPE_CHECKING:
    from spanflow.api.patterns import Pattern
    from spanflow.api.pipeline import Flow, Pipeline, Stream, WindowedStream
    from spanflow.api.processor import KeyedProcessor
    from spanflow.api.yaml_loader import load_pipeline, load_pipeline_text

_EXPORTS = {
    "Flow": "spanflow.api.pipeline",
    "Pipeline": "spanflow.api.pipeline",
    "Stream": "spanflow.api.pipeline",
    "WindowedStream": "spanflow.api.pipeline",
    "KeyedProcessor": "spanflow.api.processor",
    "Pattern": "spanflow.api.patterns",
    "load_pipeline": "spanflow.api.yaml_loader",
    "load_pipeline_text": "spanflow.api.yaml_loader",
}


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "Flow",
    "KeyedProcessor",
    "Pattern",
    "Pipeline",
    "Stream",
    "WindowedStream",
    "load_pipeline",
    "load_pipeline_text",
]
