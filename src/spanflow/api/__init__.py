"""Front ends that produce a pipeline spec: the fluent Python API and YAML files."""

from spanflow.api.pipeline import Flow, Pipeline, Stream, WindowedStream
from spanflow.api.yaml_loader import load_pipeline, load_pipeline_text

__all__ = ["Flow", "Pipeline", "Stream", "WindowedStream", "load_pipeline", "load_pipeline_text"]
