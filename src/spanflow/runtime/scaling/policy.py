"""When a node on a Spark cluster asks for more executors or gives some back. Pure.

The pressure is the node's load score without its own machine's CPU and memory (the
work runs on the cluster's executors, not on the agent's host): the worst fragment's
batch duration against its trigger, input rate against processing rate, and source
backlog in seconds of processing against its budget (:func:`spanflow.runtime.load.
load_score`). 1 means at the limit (a query that exactly keeps up has a rate pressure
of 1), so only above it is the node behind.

* **Out**: pressure above ``out_at`` for ``sustain_out`` seconds, below the
  node's ``max_executors``: one more executor (``step``). A burst is not a backlog.
* **In**: pressure at or below ``in_at`` for ``sustain_in`` seconds, above
  ``min_executors``: one fewer. Longer than out: giving back too early costs a
  state reload and a new executor's start-up (10-15 s measured) when load returns.
* Nothing for ``cooldown`` seconds after a change: a new executor needs time to
  register and the next batches to show whether it helped.

``in_at < out_at`` is the hysteresis that keeps the allocation from flapping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spanflow.runtime.load import FragmentLoad, load_score


@dataclass(frozen=True)
class ScalingConfig:
    min_executors: int = 1
    max_executors: int = 1
    """Bounds the node declares (``--executors MIN:MAX``); equal bounds: no scaling."""
    executor_cores: int = 1
    """Cores of one executor (``spark.executor.cores``)."""
    executor_memory_mb: int = 1024
    """Memory of one executor (``spark.executor.memory``)."""
    out_at: float = 1.0
    in_at: float = 0.3
    sustain_out: float = 10.0
    sustain_in: float = 60.0
    cooldown: float = 30.0
    step: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_executors <= self.max_executors:
            raise ValueError(
                f"executors {self.min_executors}:{self.max_executors}: need 1 <= min <= max"
            )
        if self.in_at >= self.out_at:
            raise ValueError(f"in_at {self.in_at} must be below out_at {self.out_at}")

    @property
    def enabled(self) -> bool:
        return self.max_executors > self.min_executors


@dataclass(frozen=True)
class ScaleDecision:
    """Ask the cluster for ``target`` executors (from ``current``), and why."""

    current: int
    target: int
    pressure: float
    reason: str

    @property
    def out(self) -> bool:
        return self.target > self.current


@dataclass
class Scaler:
    config: ScalingConfig = field(default_factory=ScalingConfig)
    _high_since: float | None = None
    _low_since: float | None = None
    _quiet_until: float = float("-inf")

    def observe(
        self, now: float, executors: int, fragments: list[FragmentLoad]
    ) -> ScaleDecision | None:
        """The decision for this moment, if any (then nothing more for ``cooldown``).

        ``executors`` is the total last asked of the cluster (not those registered
        yet: one still starting must not be asked for twice)."""
        c = self.config
        load = load_score(0.0, 0.0, fragments)
        pressure = load.score
        self._high_since = _since(self._high_since, now, pressure > c.out_at)
        self._low_since = _since(self._low_since, now, pressure <= c.in_at)
        if not c.enabled or now < self._quiet_until:
            return None
        worst = f" in {load.worst_fragment}" if load.worst_fragment else ""
        high_for = 0.0 if self._high_since is None else now - self._high_since
        low_for = 0.0 if self._low_since is None else now - self._low_since
        if self._held(self._high_since, now, c.sustain_out) and executors < c.max_executors:
            target = min(c.max_executors, executors + c.step)
            why = (
                f"{load.bottleneck} pressure {pressure:.2f}{worst} above "
                f"{c.out_at:g} for {high_for:.0f} s"
            )
            return self._decided(now, executors, target, pressure, why)
        if self._held(self._low_since, now, c.sustain_in) and executors > c.min_executors:
            target = max(c.min_executors, executors - c.step)
            why = f"pressure {pressure:.2f} at or below {c.in_at:g} for {low_for:.0f} s"
            return self._decided(now, executors, target, pressure, why)
        return None

    def _decided(
        self, now: float, current: int, target: int, pressure: float, why: str
    ) -> ScaleDecision:
        self._quiet_until = now + self.config.cooldown
        self._high_since = self._low_since = None
        return ScaleDecision(current, target, round(pressure, 3), why)

    @staticmethod
    def _held(since: float | None, now: float, sustain: float) -> bool:
        return since is not None and now - since >= sustain


def _since(since: float | None, now: float, holds: bool) -> float | None:
    """When a condition that holds now began holding (None: it does not hold)."""
    if not holds:
        return None
    return now if since is None else since
