"""The step types a pipeline is made of, one module per family.

Every module here is imported on first use and every :class:`StepBase` subclass with
a ``type`` is registered: adding a step type is adding a class to a family module
(or a new module), with nothing to list elsewhere. ``Step`` is the discriminated
union of all of them, which the pipeline model validates against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field

from spanflow.plugins import import_all
from spanflow.spec.steps.base import (
    Placement,
    Rate,
    Split,
    StepBase,
    StreamFacts,
    derived_id,
    step_types,
)

import_all(__name__, __path__, skip=("base",))

STEP_CLASSES: tuple[type[StepBase], ...] = tuple(step_types().values())
STEP_TYPES: tuple[str, ...] = tuple(sorted(step_types()))
"""Every step ``type`` name, alphabetically (for error messages)."""

if TYPE_CHECKING:
    Step = StepBase
else:
    Step = Annotated[Union[STEP_CLASSES], Field(discriminator="type")]  # noqa: UP007


def step_class(name: str) -> type[StepBase] | None:
    """The step type registered under ``name``: ``step_class("filter")``."""
    return step_types().get(name)


def __getattr__(name: str) -> Any:
    """``from spanflow.spec.steps import WindowStep``: any registered step class."""
    for cls in STEP_CLASSES:
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "STEP_CLASSES",
    "STEP_TYPES",
    "Placement",
    "Rate",
    "Split",
    "Step",
    "StepBase",
    "StreamFacts",
    "derived_id",
    "step_class",
]
