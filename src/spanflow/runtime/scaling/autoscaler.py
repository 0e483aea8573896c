"""The agent's side of scaling with load: it feeds the policy the fragments' loads, asks
the Spark cluster for what the policy decides, and tells the coordinator (the control
log records every change). Driven from the agent's main thread, which alone drives
Spark; the report to the coordinator goes out on a thread of its own."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

import httpx

from spanflow.clock import Clock
from spanflow.protocol.client import CoordinatorUnreachable
from spanflow.protocol.messages import ScaleReport
from spanflow.runtime.load import FragmentLoad
from spanflow.runtime.scaling.policy import ScaleDecision, Scaler, ScalingConfig

log = logging.getLogger(__name__)


class Executors(Protocol):
    """What the autoscaler asks of a Spark cluster (:class:`spanflow.spark.jvm.executors.
    ExecutorControl`)."""

    def executor_ids(self) -> list[str]: ...

    def scale_to(self, total: int) -> bool: ...


class Autoscaler:
    def __init__(
        self,
        config: ScalingConfig,
        executors: Executors,
        clock: Clock,
        report: Callable[[ScaleReport], httpx.Response],
    ) -> None:
        self.config = config
        self.scaler = Scaler(config)
        self.executors = executors
        self.clock = clock
        self._report = report
        self.requested = config.min_executors
        """The total last asked of the cluster."""

    def start(self) -> None:
        """Bring the application to its minimum: a standalone master gives a new one every
        core it may take (``spark.cores.max``)."""
        held = len(self.executors.executor_ids())
        if self.executors.scale_to(self.config.min_executors):
            self.requested = self.config.min_executors
            self._send(ScaleDecision(held, self.requested, 0.0, "started at its minimum"))

    def tick(self, loads: list[FragmentLoad]) -> ScaleDecision | None:
        """One look at the fragments' loads; a change asked for and reported, if any."""
        decision = self.scaler.observe(self.clock.monotonic(), self.requested, loads)
        if decision is None:
            return None
        if not self.executors.scale_to(decision.target):
            log.warning(
                "the Spark cluster did not take a request for %d executors", decision.target
            )
            return None
        log.warning(
            "scaling %s: %d -> %d executors (%s)",
            "out" if decision.out else "in",
            decision.current,
            decision.target,
            decision.reason,
        )
        self.requested = decision.target
        self._send(decision)
        return decision

    def _send(self, decision: ScaleDecision) -> None:
        c = self.config
        report = ScaleReport(
            executors_before=decision.current,
            executors=decision.target,
            min_executors=c.min_executors,
            max_executors=c.max_executors,
            cores=decision.target * c.executor_cores,
            memory_mb=decision.target * c.executor_memory_mb,
            pressure=decision.pressure,
            reason=decision.reason,
        )
        threading.Thread(target=self._post, args=(report,), name="scaled", daemon=True).start()

    def _post(self, report: ScaleReport) -> None:
        try:
            answer = self._report(report)
        except CoordinatorUnreachable as exc:
            log.warning("executor allocation %d not reported: %s", report.executors, exc)
            return
        if answer.status_code >= 300:
            log.warning("executor allocation %d refused: %s", report.executors, answer.text[:300])


def start_autoscaler(
    config: ScalingConfig | None,
    spark: object,
    clock: Clock,
    report: Callable[[ScaleReport], httpx.Response],
) -> Autoscaler | None:
    """The executors of a node on a Spark cluster, scaled with its load
    (``--executors``), brought to their minimum now; None when the node does not scale."""
    if config is None or not config.enabled:
        return None
    from spanflow.spark.jvm.executors import ExecutorControl  # Spark only once it runs

    scaler = Autoscaler(config, ExecutorControl(spark), clock, report)  # type: ignore[arg-type]
    scaler.start()
    return scaler
