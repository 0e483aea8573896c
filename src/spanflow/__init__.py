"""spanflow: real-time stream processing for the edge-cloud continuum.

Pipelines are defined in Python (``spanflow.Pipeline``) or YAML
(``spanflow.load_pipeline``), compiled to Spark Structured Streaming and wired over
NATS JetStream.
"""

from spanflow.api import Flow, Pipeline, Stream, load_pipeline, load_pipeline_text
from spanflow.errors import SpanflowError
from spanflow.spec import PipelineSpec

__version__ = "0.1.0"
__all__ = [
    "Flow",
    "Pipeline",
    "PipelineSpec",
    "SpanflowError",
    "Stream",
    "load_pipeline",
    "load_pipeline_text",
]
