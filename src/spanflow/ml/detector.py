"""The protocol every anomaly detector follows (see :mod:`spanflow.ml.detectors`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import numpy as np


class Detector:
    """Scores then learns, record by record, over a plain-data state."""

    fields: tuple[str, ...]

    def load(self, state: Any) -> Any:
        """The working form of a key's state (``None``: a new key)."""
        raise NotImplementedError

    def step(
        self, live: Any, record: Mapping[str, Any], at: datetime | None
    ) -> tuple[float, str | None]:
        """Score ``record`` in [0, 1] and name the field that contributed most; then
        learn from it."""
        raise NotImplementedError

    def save(self, live: Any) -> Any:
        """The key's state as plain data."""
        raise NotImplementedError


def finite_vector(record: Mapping[str, Any], fields: tuple[str, ...]) -> np.ndarray | None:
    """The record's ``fields`` as numbers, or None when one is missing, not a number or
    not finite (a detector of fields together then scores nothing and learns nothing)."""
    try:
        x = np.array([float(record[f]) for f in fields], dtype=float)
    except (KeyError, TypeError, ValueError):
        return None
    return x if np.all(np.isfinite(x)) else None
