"""Ask a Spark cluster for executors, or give some back: a node's session on a standalone
(or any coarse-grained) cluster manager, with dynamic allocation off.

Spark's own calls (``SparkContext.requestTotalExecutors``, ``killExecutors``, both
``@DeveloperApi``) through the session's JVM gateway. Two facts they rest on, checked
on a standalone master from the pyspark wheel:

* ``requestTotalExecutors(n)`` is absolute: the cluster manager launches executors up
  to ``n`` on workers with free cores, and never kills one to reach it;
* ``killExecutors(ids)`` lowers the target by the number killed, so the total is set
  again afterwards (a later absolute request is then the only truth).

A killed executor's tasks are retried elsewhere and its state store partitions are
loaded again from the checkpoint on the executor that runs them next, which is why a
fragment's state must live where every executor reaches it (``jetstream://``, HDFS).
Without dynamic allocation, a standalone application gets every core it may take
(``spark.cores.max``) when it starts: :meth:`ExecutorControl.scale_to` then brings it
down to what the node asks for.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


class ExecutorControl:
    """The executors of one SparkSession's application."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._jvm: Any = spark.sparkContext._jvm
        self._sc: Any = spark.sparkContext._jsc.sc()

    def executor_ids(self) -> list[str]:
        """The ids of the executors registered now (the driver is not one)."""
        joined = str(self._sc.getExecutorIds().mkString(","))
        return sorted((i for i in joined.split(",") if i), key=_numeric)

    def scale_to(self, total: int) -> bool:
        """Ask for ``total`` executors: more are launched where workers have free cores;
        fewer: the newest are released (their tasks retried elsewhere). True when the
        cluster manager acknowledged the request."""
        ids = self.executor_ids()
        if len(ids) > total:
            surplus = ids[total:]  # the newest: the oldest hold the warmest caches
            self._sc.killExecutors(self._utils.toSeq(_java_list(self._jvm, surplus)))
        empty = self._utils.toScalaMap(self._jvm.java.util.HashMap())
        return bool(self._sc.requestTotalExecutors(total, 0, empty))

    @property
    def _utils(self) -> Any:
        return self._jvm.org.apache.spark.api.python.PythonUtils


def _numeric(executor_id: str) -> tuple[int, str]:
    return (int(executor_id), "") if executor_id.isdigit() else (1 << 31, executor_id)


def _java_list(jvm: Any, items: list[str]) -> Any:
    out = jvm.java.util.ArrayList()
    for item in items:
        out.add(item)
    return out
