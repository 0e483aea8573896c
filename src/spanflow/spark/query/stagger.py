"""Spread a node's micro-batches over the trigger interval instead of starting them together.

Spark starts every processing-time batch on a wall-clock multiple of its interval
(``ProcessingTimeExecutor``), so all the queries of a node — and of every node that
shares the machine — claim the cores at the same instant and leave them idle for the
rest of the interval. On a 2-core edge node the alert query then waits for the window
query's planning and state commits, batch after batch. Each query here gets a slot,
a fraction of the interval, and its source holds the batch's start until the slot
comes (``JetStreamReader.latestOffset``). Data wait no longer on average (readings
arrive at any time; the slot only moves the instant they are picked up), and the
batches no longer queue behind each other.

Slots follow the van der Corput sequence (0, ½, ¼, ¾, ⅛, …): however many queries a
node runs, they end up about evenly spread, and the first two are as far apart as can
be. Nodes sharing one machine (``spanflow up``, benchmarks) take an ``offset`` each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_SPREAD = 2.0
"""Seconds over which slots are spread at most: a batch takes hundreds of milliseconds,
so a longer interval gains nothing from a wider spread, and the source's wait holds up
``query.stop()`` (it cannot be interrupted) for at most this long."""


def van_der_corput(k: int) -> float:
    """The k-th term (k ≥ 0) of the base-2 van der Corput sequence, in [0, 1)."""
    out, denom = 0.0, 1.0
    while k:
        denom *= 2
        k, bit = divmod(k, 2)
        out += bit / denom
    return out


class BatchSlots:
    """Hands each query started on a node the next slot (a fraction of its interval)."""

    def __init__(self, offset: float = 0.0) -> None:
        if not 0.0 <= offset < 1.0:
            raise ValueError(f"batch offset must be in [0, 1), got {offset}")
        self.offset = offset
        self._taken = 0
        self._lock = threading.Lock()

    def take(self) -> float:
        with self._lock:
            k, self._taken = self._taken, self._taken + 1
        return (van_der_corput(k) + self.offset) % 1.0


def phase_ms(slot: float, interval: float) -> int:
    """Milliseconds after each interval boundary a query with ``slot`` starts its batch
    (0 for ``trigger: 0``, whose batches follow one another at once)."""
    if interval <= 0:
        return 0
    return int(slot * min(interval, MAX_SPREAD) * 1000)


def wait_for_slot(
    phase: int,
    interval: int,
    *,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Sleep until ``phase`` ms past the current ``interval``-ms boundary; seconds slept.

    Called at the start of a batch. A batch that starts past its slot goes at once; a
    source catching up a backlog skips the wait altogether (the slot only spreads load,
    it must not slow down work that is late already)."""
    if phase <= 0 or interval <= 0:
        return 0.0
    into = (now() * 1000) % interval
    if into >= phase:
        return 0.0
    wait = (phase - into) / 1000
    sleep(wait)
    return wait


class SlotPacer:
    """Paces a source whose query runs with a zero Spark trigger (a hot standby's agreed
    batches): a new batch at most once per interval, at the query's slot.

    Such a query must not wait on Spark's trigger — a replica behind its peer runs the
    batches the peer already planned back to back — so the source keeps the pace of
    new batches itself. :meth:`due` waits for the next slot up to :data:`MAX_SPREAD`
    seconds (a longer wait would hold up ``stop``; Spark then asks again); waiting
    rather than answering "nothing new" keeps ``processAllAvailable`` honest."""

    def __init__(
        self,
        phase_ms: int,
        interval_ms: int,
        *,
        now: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.phase = phase_ms / 1000
        self.interval = interval_ms / 1000
        self._now, self._sleep = now, sleep
        self._last = 0.0
        """The slot instant of the last batch let through."""

    def due(self) -> bool:
        """Whether a new batch may be planned now (after waiting for its slot)."""
        if self.interval <= 0:
            return True
        now = self._now()
        latest = (now - self.phase) // self.interval * self.interval + self.phase
        if latest <= self._last:
            wait = latest + self.interval - now
            if wait > MAX_SPREAD:
                self._sleep(MAX_SPREAD)
                return False
            self._sleep(wait)
            latest += self.interval
        self._last = latest
        return True
