"""Helpers for testing pipelines and processors without a cluster.

* :class:`KeyedProcessorTest` runs a :class:`spanflow.KeyedProcessor` over in-memory
  state (PySpark's ``TwsTester``) with the same state and dead-letter handling as in
  a query: no broker, no streaming query, milliseconds per test.
"""

from typing import TYPE_CHECKING

from spanflow.plugins import lazy_exports

if TYPE_CHECKING:
    from spanflow.spark.keyed.harness import KeyedProcessorTest

_EXPORTS = {"KeyedProcessorTest": "spanflow.spark.keyed.harness"}


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["KeyedProcessorTest"]
