"""Time as an input: decision code takes a :class:`Clock` so tests can drive it.

``time()`` is wall-clock seconds (what records and histories show); ``monotonic()`` is
for measuring silences and ages, immune to clock steps. :class:`FakeClock` moves only
when a test says so.
"""

from __future__ import annotations

import time as _time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The machine's clocks."""

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()


class FakeClock:
    """A clock that stands still until :meth:`advance` (for tests and simulations)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall = start
        self._mono = 1000.0

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._wall += seconds
        self._mono += seconds
