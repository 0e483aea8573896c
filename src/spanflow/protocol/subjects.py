"""NATS subject patterns, pure: whether one pattern covers every subject of another.

Used where spanflow checks a request against a permission list before NATS would (the
MQTT gateway answers a SUBSCRIBE it may not serve with a failure code, not a silent
subscription NATS then refuses).
"""

from __future__ import annotations


def covers(pattern: str, wanted: str) -> bool:
    """Whether every subject ``wanted`` matches (it may hold wildcards) also matches
    ``pattern``.

    >>> covers("commands.press-7.>", "commands.press-7.*"), covers("a.*", "a.>")
    (True, False)
    >>> covers("a.*.c", "a.b.c"), covers("a.b", "a.b.c"), covers("a.>", "a")
    (True, False, False)
    """
    have, want = pattern.split("."), wanted.split(".")
    for i, token in enumerate(have):
        if token == ">":
            return len(want) > i  # one or more tokens left, whatever they are
        if i >= len(want) or want[i] == ">":
            return False
        if token != "*" and token != want[i]:
            return False
    return len(have) == len(want)
