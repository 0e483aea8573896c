"""The model registry's decisions, pure: what a push, a promotion or a rollback does
to a model's manifest. :mod:`spanflow.ml.model_store` keeps manifests in a JetStream
key-value bucket and artifacts in an object store, and applies these functions.

A model has numbered versions; each has a sha256, a format (``onnx``, ``river``, or
``normal``: a detector's normal per key, :class:`spanflow.ml.normal.Normals`),
an input schema (the fields it reads, in order) and a stage: ``staging`` when pushed,
``production`` (at most one version), or ``archived``. Promoting a version to
production archives the one before and remembers it, so ``rollback`` can bring it
back.

A model can declare what the node that runs it needs (``accelerators`` and ``tags``,
as the topology names them): they hold for every version, and a pipeline that scores
with the model is pinned to such nodes when it is submitted
(:func:`pin_to_model_needs`).

>>> m = add_version(None, "pump", sha256="ab" * 32, format="onnx",
...                 inputs={"t": "double"}, size=10, now=0.0)
>>> m = add_version(m, "pump", sha256="cd" * 32, format="onnx",
...                 inputs={"t": "double"}, size=10, now=1.0)
>>> m = promote(promote(m, 1), 2)
>>> m.production, m.version(1).stage
(2, 'archived')
>>> rollback(m).production
1
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from spanflow.errors import InvalidModel, ModelError, ModelNotFound
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.models import ScoreStep

Format = Literal["onnx", "river", "normal"]
Stage = Literal["staging", "production", "archived"]
MODEL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
_NAME = re.compile(MODEL_NAME)


class ModelVersion(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    format: Format
    inputs: dict[str, str] = Field(description="Field name → type, in the model's order.")
    stage: Stage = "staging"
    size: int = Field(ge=0)
    created: float
    note: str = ""


class ModelManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=MODEL_NAME)
    versions: tuple[ModelVersion, ...] = ()
    history: tuple[int, ...] = Field(
        default=(), description="Versions that were in production, oldest first."
    )
    accelerators: tuple[str, ...] = Field(
        default=(), description="Accelerators a node needs to run this model (e.g. gpu)."
    )
    tags: tuple[str, ...] = Field(default=(), description="Tags a node needs to run it.")

    @property
    def production(self) -> int | None:
        return next((v.version for v in self.versions if v.stage == "production"), None)

    def version(self, number: int) -> ModelVersion:
        for v in self.versions:
            if v.version == number:
                return v
        known = ", ".join(str(v.version) for v in self.versions) or "none"
        raise ModelNotFound(f"model {self.name!r} has no version {number} (versions: {known})")

    def at_stage(self, stage: Stage) -> ModelVersion | None:
        """The newest version at ``stage``."""
        matching = [v for v in self.versions if v.stage == stage]
        return matching[-1] if matching else None


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidModel(f"model name {name!r}: use 1 to 64 letters, digits, '-' or '_'")
    return name


def add_version(
    manifest: ModelManifest | None,
    name: str,
    *,
    sha256: str,
    format: Format,
    inputs: dict[str, str],
    size: int,
    now: float,
    note: str = "",
    accelerators: Sequence[str] | None = None,
    tags: Sequence[str] | None = None,
) -> ModelManifest:
    """A new version, numbered one past the newest, in staging. ``accelerators`` and
    ``tags``, when given, replace what the model's nodes need (None keeps them)."""
    check_name(name)
    current = manifest or ModelManifest(name=name)
    if accelerators is not None:
        current = current.model_copy(update={"accelerators": _names(accelerators)})
    if tags is not None:
        current = current.model_copy(update={"tags": _names(tags)})
    number = max((v.version for v in current.versions), default=0) + 1
    added = ModelVersion(
        version=number,
        sha256=sha256,
        format=format,
        inputs=inputs,
        size=size,
        created=now,
        note=note,
    )
    return current.model_copy(update={"versions": (*current.versions, added)})


def _with_stages(manifest: ModelManifest, stages: dict[int, Stage]) -> ModelManifest:
    versions = tuple(
        v.model_copy(update={"stage": stages[v.version]}) if v.version in stages else v
        for v in manifest.versions
    )
    return manifest.model_copy(update={"versions": versions})


def promote(manifest: ModelManifest, number: int, stage: Stage = "production") -> ModelManifest:
    """Move a version to ``stage``; promoting to production archives the previous
    production version (and remembers it for :func:`rollback`)."""
    target = manifest.version(number)
    if stage != "production":
        return _with_stages(manifest, {number: stage})
    current = manifest.production
    if current == target.version:
        return manifest
    stages: dict[int, Stage] = {number: "production"}
    history = manifest.history
    if current is not None:
        stages[current] = "archived"
        history = (*history, current)
    out = _with_stages(manifest, stages)
    return out.model_copy(update={"history": history})


def rollback(manifest: ModelManifest) -> ModelManifest:
    """Put the version that was in production before the current one back."""
    current = manifest.production
    if current is None:
        raise ModelError(f"model {manifest.name!r} has no production version to roll back")
    if not manifest.history:
        raise ModelError(
            f"model {manifest.name!r}: version {current} is the first in production; "
            "nothing to roll back to"
        )
    previous = manifest.history[-1]
    out = _with_stages(manifest, {current: "archived", previous: "production"})
    return out.model_copy(update={"history": manifest.history[:-1]})


def _names(values: Sequence[str]) -> tuple[str, ...]:
    out = tuple(dict.fromkeys(v.strip() for v in values if v.strip()))
    for v in out:
        if not _NAME.match(v):
            raise InvalidModel(
                f"{v!r}: a tag or accelerator is 1 to 64 letters, digits, '-' or '_'"
            )
    return out


def scored_models(spec: PipelineSpec) -> list[str]:
    """The registry models a pipeline's score steps load."""
    return sorted({s.model for s in spec.steps if isinstance(s, ScoreStep)})


def pin_to_model_needs(spec: PipelineSpec, manifests: Mapping[str, ModelManifest]) -> PipelineSpec:
    """``spec`` with each score step pinned to nodes that have what its model needs
    (the model's accelerators and tags added to the step's own pins).

    >>> from spanflow.spec import PipelineSpec
    >>> spec = PipelineSpec.model_validate({"name": "p", "steps": [
    ...   {"id": "in", "type": "source", "stream": "S", "schema": {"x": "double"}},
    ...   {"id": "s", "type": "score", "model": "m", "inputs": ["in"]},
    ...   {"id": "out", "type": "sink", "connector": "console", "inputs": ["s"]}]})
    >>> m = ModelManifest(name="m", accelerators=("gpu",))
    >>> pin_to_model_needs(spec, {"m": m}).step("s").node_accelerators
    ('gpu',)
    """
    steps = []
    for step in spec.steps:
        manifest = manifests.get(step.model) if isinstance(step, ScoreStep) else None
        if manifest is not None and (manifest.accelerators or manifest.tags):
            step = step.model_copy(
                update={
                    "node_accelerators": tuple(
                        dict.fromkeys((*step.node_accelerators, *manifest.accelerators))
                    ),
                    "node_tags": tuple(dict.fromkeys((*step.node_tags, *manifest.tags))),
                }
            )
        steps.append(step)
    return spec.model_copy(update={"steps": tuple(steps)})
