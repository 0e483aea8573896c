"""A node's load as one number: 0 idle, 1 at capacity, above 1 falling behind.

What makes a stream-processing node overloaded is its worst bottleneck, so the score
is the largest of these pressures, each scaled so that 1 means "at the limit":

* **cpu** — the machine's CPU use (0-1).
* **memory** — 0 until 70 % used, 1 at 100 %: memory only matters when it runs out.
* **batch** — the slowest fragment's last batch duration against its trigger interval
  (a batch longer than its trigger means the next one starts late).
* **rate** — the worst fragment's input rate against its processing rate (above 1: the
  backlog grows).
* **backlog** — the worst fragment's source backlog (JetStream messages pending) in
  seconds of processing, against ``backlog_budget`` seconds. Real-time queries (whose
  batches last minutes) count here alone, with the rate their readers drain at: a
  real-time query that falls behind shows as a growing backlog.

The score is capped at 4 (four times over capacity or forty, the node must shed).
Pure: :func:`load_score` takes the measurements; the agent measures them (psutil and
the fragments' progress) and gossips the score with its age.
"""

from __future__ import annotations

from dataclasses import dataclass

from spanflow.protocol.metrics import FragmentRuntime

MEMORY_FLOOR = 0.7
BACKLOG_BUDGET = 10.0
"""Seconds of pending input a node may hold before its backlog alone makes it full."""
DEFAULT_TRIGGER_MS = 1000
MAX_SCORE = 4.0
"""Scores are capped here: four times over capacity or forty, the node must shed."""


@dataclass(frozen=True)
class FragmentLoad:
    """What one running fragment says about its pressure."""

    fragment: str
    batch_ms: int
    trigger_ms: int
    input_per_s: float
    processed_per_s: float
    backlog: int
    realtime_per_s: float = 0.0
    """Rows/s its real-time queries read: they drain the backlog too, but their rate
    says nothing of headroom (a query that keeps up reads exactly what arrives), so it
    counts in the backlog pressure only."""

    @classmethod
    def of(cls, rt: FragmentRuntime, trigger_ms: int = DEFAULT_TRIGGER_MS) -> FragmentLoad:
        return cls(
            rt.fragment_id,
            rt.last_batch_ms,
            trigger_ms,
            rt.input_rows_per_s,
            rt.processed_rows_per_s,
            rt.lag,
            rt.realtime_rows_per_s,
        )


@dataclass(frozen=True)
class LoadReport:
    """The score and what made it (shown in node status)."""

    score: float
    cpu: float
    memory: float
    batch: float
    rate: float
    backlog: float
    worst_fragment: str | None = None

    @property
    def bottleneck(self) -> str:
        named = {
            "cpu": self.cpu,
            "memory": self.memory,
            "batch": self.batch,
            "rate": self.rate,
            "backlog": self.backlog,
        }
        return max(named, key=lambda k: named[k])


def load_score(
    cpu_percent: float,
    memory_percent: float,
    fragments: list[FragmentLoad],
    *,
    backlog_budget: float = BACKLOG_BUDGET,
) -> LoadReport:
    cpu = _clamp(cpu_percent / 100.0)
    memory = _clamp((memory_percent / 100.0 - MEMORY_FLOOR) / (1.0 - MEMORY_FLOOR))
    batch = rate = backlog = 0.0
    worst: tuple[float, str | None] = (0.0, None)
    for f in fragments:
        f_batch = f.batch_ms / max(1, f.trigger_ms)
        f_rate = f.input_per_s / f.processed_per_s if f.processed_per_s > 0 else 0.0
        drain = f.processed_per_s + f.realtime_per_s
        f_backlog = (f.backlog / max(drain, 1.0)) / backlog_budget
        batch, rate, backlog = max(batch, f_batch), max(rate, f_rate), max(backlog, f_backlog)
        worst = max(worst, (max(f_batch, f_rate, f_backlog), f.fragment), key=lambda w: w[0])
    score = min(MAX_SCORE, max(cpu, memory, batch, rate, backlog))
    return LoadReport(round(score, 3), cpu, memory, batch, rate, backlog, worst[1])


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))
