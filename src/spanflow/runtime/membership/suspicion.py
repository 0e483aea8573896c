"""A suspicion: when a suspected member is declared dead (Lifeguard's dynamic timeout).

Pure: it holds a start time and the confirmations, and answers its deadline. A
suspicion starts at ``maximum`` and each independent confirmation (another member
that suspects the same member at the same incarnation) pulls the deadline towards
``minimum`` on a log scale — memberlist's ``remainingSuspicionTime``: after ``k``
confirmations it is ``minimum``.
"""

from __future__ import annotations

import math


def suspicion_timeout(confirmations: int, expected: int, minimum: float, maximum: float) -> float:
    """The total timeout after ``confirmations`` of ``expected``."""
    if expected < 1:
        return minimum
    fraction = math.log(confirmations + 1.0) / math.log(expected + 1.0)
    return max(minimum, maximum - fraction * (maximum - minimum))


class Suspicion:
    """The suspicion of one member at one incarnation."""

    def __init__(
        self, accuser: str, expected: int, minimum: float, maximum: float, start: float
    ) -> None:
        self.expected = expected
        self.minimum = minimum
        self.maximum = maximum if expected >= 1 else minimum
        self.start = start
        self._accusers = {accuser}
        self.deadline = start + self.maximum

    @property
    def confirmations(self) -> int:
        return len(self._accusers) - 1

    def confirm(self, accuser: str) -> bool:
        """Count ``accuser`` once; True if it was new (then the rumour is re-gossiped)."""
        if self.confirmations >= self.expected or accuser in self._accusers:
            return False
        self._accusers.add(accuser)
        total = suspicion_timeout(self.confirmations, self.expected, self.minimum, self.maximum)
        self.deadline = self.start + total
        return True
