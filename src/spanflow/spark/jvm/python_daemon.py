"""Spark's Python worker daemon, run at a lower CPU priority (``spark.python.daemon.module``).

Every Python worker that runs a query's tasks (a detector's scores, a pattern's
matches, a keyed processor, a Python source's reads) is forked from this daemon and
inherits its niceness. What is not forked from it keeps the node's priority: the
driver that plans batches, answers heartbeats and restarts queries, and the process a
query starts for its Python source's reader when it begins — which must connect back
to the JVM within 10 s (hard-coded in Spark's ``PythonWorkerFactory``). On a 2-core
node whose batches keep both cores busy, that reader process got too little CPU to
import pyspark within 10 s (0.46 s of CPU took 4.8 s of wall time at load average 19)
and a query failed at every restart ("Python worker failed to connect back"). Niced
task work yields to it; on an idle machine niceness changes nothing.
"""

from __future__ import annotations

import os

NICENESS = 10
"""How much lower than the node's other processes the task workers run (0–19;
``SPANFLOW_WORKER_NICENESS`` overrides, 0 keeps them equal)."""


def niceness() -> int:
    """The niceness to add, from the environment or :data:`NICENESS`."""
    raw = os.environ.get("SPANFLOW_WORKER_NICENESS", "")
    try:
        return max(0, min(19, int(raw))) if raw.strip() else NICENESS
    except ValueError:
        return NICENESS


def main() -> None:
    from pyspark import daemon

    step = niceness()
    if step:
        os.nice(step)
    daemon.manager()


if __name__ == "__main__":
    main()
