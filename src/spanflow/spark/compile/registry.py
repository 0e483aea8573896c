"""Which function compiles which step type: one registry, filled by the family modules.

A family module (``stateless``, ``windows``, ...) decorates its compile functions with
``@compiles(StepClass)``. Every module of this package is imported on first lookup,
so a new step type needs no line anywhere else. A compile function takes the context,
the pipeline, the step and its input frames (in ``inputs`` order; none for a source)
and returns the step's output frame.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from spanflow.errors import CompileError
from spanflow.plugins import import_all
from spanflow.spark.compile.frame import CompileContext, Frame
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps import StepBase

StepCompiler = Callable[[CompileContext, PipelineSpec, Any, list[Frame]], Frame]
F = TypeVar("F", bound=StepCompiler)

_COMPILERS: dict[type[StepBase], StepCompiler] = {}
_loaded = False


def compiles(*step_types: type[StepBase]) -> Callable[[F], F]:
    """Register the decorated function as the compiler of ``step_types``."""

    def register(fn: F) -> F:
        for cls in step_types:
            known = _COMPILERS.get(cls)
            # The same function imported twice (e.g. by doctest collection) is no clash.
            if known is not None and known.__qualname__ != fn.__qualname__:
                raise TypeError(f"{cls.__name__} has two compilers: {known} and {fn}")
            _COMPILERS[cls] = fn
        return fn

    return register


def compiler_for(step: StepBase) -> StepCompiler:
    """The compile function of ``step``'s type (or of its nearest registered base)."""
    _load_families()
    for cls in type(step).__mro__:
        fn = _COMPILERS.get(cls)
        if fn is not None:
            return fn
    raise CompileError(
        step.id, f"step type {step.type_name!r} is not supported by the Spark runner"
    )


def _load_families() -> None:
    global _loaded
    if _loaded:
        return
    package = importlib.import_module(__package__ or "spanflow.spark.compile")
    import_all(package.__name__, package.__path__)
    _loaded = True
