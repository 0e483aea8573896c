"""The root of every error spanflow raises on purpose.

Each package has its own subclasses; a user can catch ``SpanflowError`` for all of
them. Messages say what was given, where (file:line, step id, field) and what is
allowed, so the user can fix the input without reading spanflow's code.
"""

from __future__ import annotations


class SpanflowError(Exception):
    """Anything spanflow reports as a user-fixable or operational error."""

    code: str = "spanflow_error"


class SpecError(SpanflowError):
    """A pipeline or stream description is invalid."""

    code = "invalid_spec"


class PipelineFileError(SpecError):
    """A pipeline file is invalid; the message names the file, line and field."""

    code = "invalid_pipeline_file"

    def __init__(self, path: str, problems: list[tuple[int | None, str, str]]) -> None:
        self.path = path
        self.problems = problems
        lines = []
        for line, field, message in problems:
            where = f"{path}:{line}" if line else path
            lines.append(f"{where}: {field}: {message}" if field else f"{where}: {message}")
        super().__init__("\n".join(lines))


class MeaningChanged(UserWarning):
    """A pipeline file uses a step whose meaning changed between releases (the message
    names the file, line and step, the new meaning and how to keep the old one)."""


class TopologyFileError(PipelineFileError):
    """A topology file is invalid; the message names the file, line and field."""

    code = "invalid_topology_file"


class CompileError(SpanflowError):
    """A valid spec could not be turned into a Spark plan (e.g. an unknown column)."""

    code = "compile_error"

    def __init__(self, step_id: str, message: str) -> None:
        self.step_id = step_id
        super().__init__(f"step '{step_id}': {message}")


class CheckpointLost(SpanflowError):
    """A fragment's checkpoint is gone although its sink already published from it:
    starting anyway would silently read every source again from the start."""

    code = "checkpoint_lost"


class NatsError(SpanflowError):
    """The NATS server could not be started or reached."""

    code = "nats_error"


class SecurityError(SpanflowError):
    """A door refused us, or a secret is missing, unreadable or expired. The message
    names the door (NATS, MQTT, REST, gossip, the real-time client) and the cause, and
    never the secret itself."""


class ModelError(SpanflowError):
    """A model registry request cannot be met (the message says why)."""

    code = "model_error"


class ModelNotFound(ModelError):
    """No such model, or no such version of it."""

    code = "model_not_found"


class InvalidModel(ModelError):
    """A model file is not what it claims to be, does not fit the stream, or a request
    names a model, tag or accelerator badly."""

    code = "invalid_model"
