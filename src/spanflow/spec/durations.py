"""Durations as users write them ("500ms", "10s", "5m", "1h") and as Spark wants them."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|sec|min|s|m|h|d)?\s*$")


def parse_duration(value: object) -> float:
    """Seconds from ``"10s"``-style text or a plain number of seconds.

    >>> parse_duration("500ms"), parse_duration("2m"), parse_duration(3)
    (0.5, 120.0, 3.0)
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '10s', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if not match:
            raise ValueError(
                f"expected a duration like '500ms', '10s', '5m' or '1h', got {value!r}"
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"expected a duration like '10s', got {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def parse_signed_duration(value: object) -> float:
    """Seconds from ``"-5s"``/``"+5s"``-style text or a signed number of seconds.

    >>> parse_signed_duration("-5s"), parse_signed_duration("+2m"), parse_signed_duration(-1.5)
    (-5.0, 120.0, -1.5)
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in "+-":
            sign = -1.0 if text[0] == "-" else 1.0
            return sign * parse_duration(text[1:])
    return parse_duration(value)


def format_signed_duration(seconds: float) -> str:
    """``-5.0`` → ``'-5s'``, ``5.0`` → ``'+5s'``."""
    return ("-" if seconds < 0 else "+") + format_duration(abs(seconds))


def format_duration(seconds: float) -> str:
    """Shortest exact text for a duration: ``format_duration(0.5) == '500ms'``."""
    ms = round(seconds * 1000)
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0 and ms > 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def spark_interval(seconds: float) -> str:
    """The interval text Spark's window/watermark functions accept."""
    return f"{round(seconds * 1000)} milliseconds"


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
]
"""A duration field: accepts '10s'-style text or seconds, serialises back to text."""

SignedDuration = Annotated[
    float,
    BeforeValidator(parse_signed_duration),
    PlainSerializer(format_signed_duration, return_type=str),
]
"""A duration that may be negative ('-5s'), e.g. the lower bound of a join interval."""
