"""Helpers for testing pipelines and processors without a cluster.

* :class:`KeyedProcessorTest` runs a :class:`spanflow.KeyedProcessor` over in-memory
  state (PySpark's ``TwsTester``) with the same state and dead-letter handling as in
  a query: no broker, no streaming query, milliseconds per test.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spanflow.spark.processor_harness import KeyedProcessorTest

_EXPORTS = {"KeyedProcessorTest": "spanflow.spark.processor_harness"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["KeyedProcessorTest"]
