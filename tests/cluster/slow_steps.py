"""Python steps that cost time per record, for tests of a fragment that falls behind."""

from __future__ import annotations

import time
from typing import Any

SECONDS_PER_RECORD = 0.004


def slow_keep(record: dict[str, Any]) -> bool:
    """Keep every record, 4 ms each (sleeping: the work is slow, not the CPU busy)."""
    time.sleep(SECONDS_PER_RECORD)
    return True
