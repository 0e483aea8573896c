"""The node's SparkSession: which master it runs on, and a warm start for a restarted node.

Spark is imported only once the node needs a session (registration and the control
plane come first, and a refused registration should not pay for a JVM).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from spanflow.protocol.rest import Registered
from spanflow.runtime.agent_settings import AgentSettings
from spanflow.spec.topology import Capabilities

log = logging.getLogger(__name__)

KEEP_WARM_EVERY = 45.0
"""Seconds between two warm-ups of the Python workers: under Spark's one minute."""
REHEARSE_AFTER = 5.0
"""Seconds after its session starts that an idle node rehearses a streaming query."""


def spark_master(settings: AgentSettings, caps: Capabilities) -> str:
    """The given master, else local mode with the node's cores as task threads plus the
    slots its Real-Time Mode queries hold for their whole batches."""
    return (
        settings.master
        or os.environ.get("SPANFLOW_SPARK_MASTER")
        or f"local[{caps.cores + caps.realtime_slots},3]"
    )


MIN_DRIVER_HEAP_MB = 512
"""The smallest JVM heap a node's Spark driver gets: below it a stateful query's first
batch ran out of heap in local mode."""


def driver_memory_conf(memory_mb: int, master: str) -> dict[str, str]:
    """Spark settings for a node told to offer ``memory_mb`` (``--memory``): in local
    mode the driver JVM is the whole of Spark, and half the memory goes to its heap —
    the other half is for what lives outside it: a Python worker per task (100-300 MB
    each), RocksDB's native memory and the operating system. On a Spark cluster the
    workers' own ``--memory`` bounds the executors; the driver keeps its default.

    >>> driver_memory_conf(4096, "local[4,3]")
    {'spark.driver.memory': '2048m'}
    >>> driver_memory_conf(600, "local[2]")
    {'spark.driver.memory': '512m'}
    >>> driver_memory_conf(8192, "spark://10.0.0.5:7077")
    {}
    """
    if not master.startswith("local"):
        return {}
    return {"spark.driver.memory": f"{max(MIN_DRIVER_HEAP_MB, memory_mb // 2)}m"}


class SparkWarmUp:
    """A SparkSession built on a background thread while the agent does other work."""

    def __init__(self, master: str, app_name: str, conf: dict[str, str] | None) -> None:
        self.master = master
        self._session: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._build, args=(app_name, conf), name="spark-warm-up", daemon=True
        )
        self._thread.start()

    def _build(self, app_name: str, conf: dict[str, str] | None) -> None:
        from spanflow.spark.session import build_session

        try:
            self._session = build_session(master=self.master, app_name=app_name, conf=conf)
        except BaseException as exc:  # raised again by session()
            self._error = exc

    def session(self) -> Any:
        """The session, once built (its error, if building it failed)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._session

    def discard(self) -> None:
        """Stop the session once built (it is not the one the node needs)."""
        self._thread.join()
        if self._session is not None:
            with contextlib.suppress(Exception):
                self._session.stop()


class SparkHost:
    """Builds the node's session: early from the saved registration when there is one,
    else once the registration says what the node offers."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self._app_name = f"spanflow-{settings.name}"
        self._warm: SparkWarmUp | None = None

    def warm_up(self, saved: Registered | None) -> None:
        """A restarted node (one with a saved registration) starts its session while it
        registers, with the capabilities it registered with last time: during an uplink
        cut registration waits up to ``offline_after`` for the coordinator, and the
        session's few seconds no longer come after that wait. A first registration may
        change what the node offers: no warm start then."""
        if saved is not None:
            master = spark_master(self.settings, saved.node.spec.capabilities)
            self._warm = SparkWarmUp(master, self._app_name, self.settings.spark_conf)

    def discard(self) -> None:
        """Registration failed: stop the warmed session, if any."""
        if self._warm is not None:
            self._warm.discard()
            self._warm = None

    def session(self, caps: Capabilities) -> Any:
        """The session for this node's fragments: the warmed one when the registration
        kept its master, else one built now."""
        from spanflow.spark.session import build_session  # Spark only once registered

        master, warm = spark_master(self.settings, caps), self._warm
        self._warm = None
        if warm is not None:
            if warm.master == master:
                return warm.session()
            log.info("capabilities changed since the last registration: Spark starts again")
            warm.discard()
        return build_session(master=master, app_name=self._app_name, conf=self.settings.spark_conf)


def keep_python_workers_warm(
    spark: Any,
    workers: int,
    stop: threading.Event,
    every: float = KEEP_WARM_EVERY,
    modules: tuple[str, ...] | None = None,
) -> threading.Thread:
    """Warm the session's Python workers now and every ``every`` seconds, on a thread of
    their own (the main thread goes on starting the node's queries meanwhile).

    Spark stops a Python worker idle for a minute; a query's first batch then pays for
    starting them again (5 s against 0.3 s on a busy 2-core machine). A node that
    restarted, or that has been idle until a failed peer's fragment moves to it, runs
    that first batch right away."""
    from spanflow.spark.session import WARM_MODULES, warm_python_workers

    def run() -> None:
        while not stop.is_set():
            try:
                warm_python_workers(spark, workers, modules or WARM_MODULES)
            except Exception as exc:  # the session stopping, a busy cluster: next time
                log.debug("Python workers not warmed: %s", exc)
            stop.wait(every)

    thread = threading.Thread(target=run, name="python-workers-warm", daemon=True)
    thread.start()
    return thread


def rehearse_when_idle(
    spark: Any,
    idle: Callable[[], bool],
    stop: threading.Event,
    after: float = REHEARSE_AFTER,
) -> threading.Thread:
    """Once, ``after`` seconds into the session, if the node runs nothing (``idle``):
    a small stateful streaming query run to its end
    (:func:`spanflow.spark.session.rehearse_streaming`), so that a fragment moved here
    from a failed node does not pay for the session's first streaming batch (2 s of
    its first output on this 2-core machine). A node with fragments of its own has
    warmed all that already, and the rehearsal's CPU would go against them."""
    from spanflow.spark.session import rehearse_streaming

    def run() -> None:
        if stop.wait(after) or not idle():
            return
        try:
            rehearse_streaming(spark)
            log.info("streaming rehearsed: a fragment moved here starts warm")
        except Exception as exc:  # the session stopping: nothing to warm
            log.debug("streaming not rehearsed: %s", exc)

    thread = threading.Thread(target=run, name="streaming-rehearsal", daemon=True)
    thread.start()
    return thread
