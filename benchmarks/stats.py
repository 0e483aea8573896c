"""Percentiles shared by the latency benchmarks (nearest rank, NaN when empty)."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]
