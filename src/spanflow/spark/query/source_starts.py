"""One query at a time through Spark's source initialisation, in each process.

A micro-batch query that reads a Python data source (every ``jetstream`` source, the
Python Kafka reader) starts a fresh Python process for its reader when it initialises
its sources (``PythonStreamingSourceRunner``), and that process must connect back to
the JVM within 10 s — hard-coded in ``PythonWorkerFactory``, no setting changes it.
Its imports (pyspark, pyarrow, numpy) cost ≈0.5 s of CPU; on this project's 2-core
machines under load (load average 19: a test suite and the demo's three nodes) one
took 4.8 s of wall time, and a fragment's four queries starting together failed with
"Python worker failed to connect back" at every restart for minutes.

So a runner lets one query initialise its sources at a time in its process: starting
a fragment waits until the query before has passed that phase, and restarts of failed
queries wait for the next supervision tick while another query is in it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pyspark.sql.streaming import StreamingQuery

INITIALIZING = "Initializing sources"
"""Spark's status message while a query creates its sources' readers."""

INIT_WAIT_S = 30.0
"""Longest a start waits for the query before it (then it starts anyway: a source
that takes long to initialise must not stop the others)."""

_lock = threading.Lock()
_initializing: list[StreamingQuery] = []


def is_initializing(query: StreamingQuery) -> bool:
    """Whether ``query`` is still creating its sources' readers."""
    try:
        return bool(query.isActive) and query.status.get("message") == INITIALIZING
    except Exception:  # a query stopping under us, or its JVM gone: not in the way
        return False


def started(query: StreamingQuery) -> None:
    """Note a query just started: later starts in this process wait for its sources."""
    with _lock:
        _initializing.append(query)


def busy() -> bool:
    """Whether a query of this process is initialising its sources now."""
    with _lock:
        _initializing[:] = [q for q in _initializing if is_initializing(q)]
        return bool(_initializing)


def wait_until_quiet(
    timeout: float = INIT_WAIT_S,
    *,
    is_busy: Callable[[], bool] = busy,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Wait until no query of this process initialises its sources, at most
    ``timeout`` seconds; whether it got quiet."""
    deadline = clock() + timeout
    while is_busy():
        if clock() >= deadline:
            return False
        sleep(0.1)
    return True
