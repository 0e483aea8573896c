"""SKAB's scoring rules over flags held in memory (``../shared/skab/score.py`` scores
files): per-row F1 and false alarm rate after each run's training rows, faults found
and false alarm episodes — what leave-one-experiment-out judges candidate settings by."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def runs_of(flags: Sequence[int | bool]) -> list[tuple[int, int]]:
    """(start, end) of every run of true values."""
    out, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((start, i))
            start = None
    return out


def false_episodes(truth: Sequence[int], flags: Sequence[bool], train: int) -> int:
    """Runs of flags after the training rows that touch no labelled anomaly."""
    y, p = truth[train:], flags[train:]
    return sum(1 for a, b in runs_of(p) if not any(y[a:b]))


def judge_runs(
    truths: Sequence[Sequence[int]], flags: Sequence[Sequence[bool]], train: int
) -> dict[str, Any]:
    """F1, FAR %, faults found of segments and the worst run's false alarm episodes."""
    tp = fp = fn = tn = found = segments = 0
    worst = 0
    for truth, flagged in zip(truths, flags, strict=True):
        y, p = truth[train:], flagged[train:]
        for yi, pi in zip(y, p, strict=True):
            tp += bool(yi and pi)
            fp += bool(pi and not yi)
            fn += bool(yi and not pi)
            tn += bool(not yi and not pi)
        for a, b in runs_of(y):
            segments += 1
            found += any(p[a:b])
        worst = max(worst, false_episodes(truth, flagged, train))
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    far = 100 * fp / max(fp + tn, 1)
    return {"f1": f1, "far_pct": far, "found": found, "segments": segments, "worst_run": worst}
