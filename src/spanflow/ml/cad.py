"""The ``cad`` method: the Contextual Anomaly Detector, open source edition (CAD OSE).

Mikhail Smirnov's detector (2016; https://github.com/smirmik/CAD), third on the
Numenta Anomaly Benchmark's published scoreboard (69.9 standard, the best of those
without a learned network). Written here from the algorithm as Numenta's NAB runs
it (``nab/detectors/context_ose``), not copied; a test checks that both give the
same scores on real series.

The idea: a reading becomes a handful of *facts* — the bits of its value quantized
into ``2 ** bits`` steps of the field's range — and the detector remembers
*contexts*: which facts (and which contexts, as "neurons") were active at one
reading, followed by which facts at the next. Each reading asks two questions:

* of the remembered contexts whose left half matched the previous reading fully,
  what share also matched this reading (a familiar continuation: less anomalous)?
* of the contexts this reading could add (new combinations of partly matched
  halves), what share is really new (an unseen continuation: more anomalous)?

The score is ``(1 - familiar share + new share) / 2``. After a score of
``rest_after`` (0.75) or more the next ``rest`` (30) readings score 0, as in the
reference, so an episode is reported once.

The field's range matters: it sets the quantization. NAB gives every detector the
series' minimum and maximum; a plant knows its sensors' ranges. ``range: [lo, hi]``
declares them. Without one, the range is the one seen so far (a new extreme is
quantized against the old range, so it reads as new facts, then widens it).
Values beyond the range get the bits of how many steps beyond it they are (and a
fact of their own below it), so they too are new facts.

The state is plain data: the contexts, the two halves' facts, and what matched at
the previous reading. It grows with the variety of the series (a few thousand
contexts for NAB's series), not with its length alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain
from typing import Any

from spanflow.ml.detector import Detector

BITS = 3
"""Bits of a quantized value: ``2 ** BITS - 1`` steps across the range."""
THRESHOLD = 0.75
"""A score this high starts a rest period."""
REST = 30
"""Readings scored 0 after a score of ``THRESHOLD`` (the reference's default)."""
MAX_LEFT = 7
"""Facts a left half may keep when a new context is made from a partial match."""
MAX_ACTIVE = 15
"""Contexts that become the next reading's "neuron" facts."""
NEURON = 2**31
"""Neuron facts are context numbers offset by this, apart from value facts."""
BELOW = -1
"""The fact of a value below the range."""


def value_facts(value: float, low: float, step: float, bits: int = BITS) -> tuple[int, ...]:
    """The facts of one reading: fact ``2 i + b`` for bit ``b`` at position ``i`` of
    its quantized value (at least ``bits`` positions; more beyond the range).

    >>> value_facts(5.0, 0.0, 1.0)   # 5 = 0b101
    (1, 2, 5)
    >>> value_facts(-3.5, 0.0, 1.0)  # 3 steps below: 0b11, and the fact below
    (-1, 1, 3, 4)
    """
    steps = (value - low) / step
    code = int(steps)  # truncation, as the reference: just below the range is step 0
    facts = {2 * i + ((abs(code) >> i) & 1) for i in range(max(bits, abs(code).bit_length()))}
    if code < 0:
        facts.add(BELOW)
    return tuple(sorted(facts))


@dataclass
class _Half:
    """One half of remembered contexts (left: what came before; right: what came
    next): its facts and, for a left half, its contexts by right half."""

    facts: tuple[int, ...]
    links: dict[int, int] = field(default_factory=dict)
    """Left halves only: right half number -> context number, in creation order."""
    key: int = 0

    def __post_init__(self) -> None:
        self.key = hash(self.facts)  # the reference's tie-break among equal counts


@dataclass
class Memory:
    """The contexts of one field (the working form of its state)."""

    lefts: list[_Half] = field(default_factory=list)
    rights: list[_Half] = field(default_factory=list)
    contexts: list[list[int]] = field(default_factory=list)
    """[count, zero level (0/1), left number, right number] per context."""
    left_of: dict[tuple[int, ...], int] = field(default_factory=dict)
    right_of: dict[tuple[int, ...], int] = field(default_factory=dict)
    left_by_fact: dict[int, list[int]] = field(default_factory=dict)
    right_by_fact: dict[int, list[int]] = field(default_factory=dict)
    left_by_top: dict[int, list[int]] = field(default_factory=dict)
    """Left halves by their largest fact: a half matches fully only if it is there."""
    group: tuple[int, ...] = ()
    """The previous reading's facts and active neurons: the next context's left half."""
    history: list[float] = field(default_factory=lambda: [1.0])
    low: float | None = None
    high: float | None = None


Pair = tuple[tuple[int, ...], tuple[int, ...]]


class ContextMemory:
    """The context operations of CAD OSE over a :class:`Memory`.

    The reference marks, after each reading, which facts of every left half the new
    left half matched, and keeps those marks; here they are counted when needed from
    the previous group (kept anyway) — the same matches, in the same order, without
    touching every half twice per reading."""

    def __init__(self, max_left: int = MAX_LEFT, max_active: int = MAX_ACTIVE) -> None:
        self.max_left = max_left
        self.max_active = max_active

    def step(self, m: Memory, facts: tuple[int, ...]) -> tuple[float, float]:
        """(share of fully matched left halves whose context continued, share of
        possible new contexts that were new) for one reading's facts."""
        crossed = len(m.lefts)  # the left halves the previous group was matched against
        candidates: set[Pair] = set()
        zero_new, skip = False, 0
        if m.group and facts:
            candidates.add((m.group, facts))
            number, zero_new = self._context(m, m.group, facts, 1)
            if zero_new:
                skip = number
            else:
                m.contexts[number][1] = 1
        active, selected, possible = self._continue(m, facts, crossed, zero_new, skip)
        candidates.update(possible)
        familiar = len(active) / selected if selected else 0.0
        active.sort(key=lambda a: (a[1], a[2], a[3]))
        neurons = {NEURON + a[0] for a in active[-self.max_active :]}
        m.group = tuple(sorted(set(facts) | neurons))
        added = sum(1 for left, right in possible if self._context(m, left, right, 0)[1])
        added += 1 if zero_new else 0
        new_share = added / len(candidates) if zero_new and candidates else 0.0
        return familiar, new_share

    # -- memory ------------------------------------------------------------------------
    @staticmethod
    def _half(
        halves: list[_Half],
        index: dict[tuple[int, ...], int],
        by_fact: dict[int, list[int]],
        facts: tuple[int, ...],
    ) -> int:
        number = index.get(facts)
        if number is None:
            number = index[facts] = len(halves)
            halves.append(_Half(facts))
            for fact in facts:
                by_fact.setdefault(fact, []).append(number)
        return number

    def _context(
        self, m: Memory, left: tuple[int, ...], right: tuple[int, ...], zero: int
    ) -> tuple[int, bool]:
        """The context (left, right): (its number, whether it is new)."""
        known = len(m.lefts)
        lnum = self._half(m.lefts, m.left_of, m.left_by_fact, left)
        if lnum == known:
            m.left_by_top.setdefault(left[-1], []).append(lnum)
        rnum = self._half(m.rights, m.right_of, m.right_by_fact, right)
        links = m.lefts[lnum].links
        number = links.get(rnum)
        if number is not None:
            return number, False
        number = links[rnum] = len(m.contexts)
        m.contexts.append([0, zero, lnum, rnum])
        return number, True

    def _continue(
        self, m: Memory, facts: tuple[int, ...], crossed: int, zero_new: bool, skip: int
    ) -> tuple[list[tuple[int, int, int, int]], int, list[Pair]]:
        """The contexts the reading continues (active), how many contexts of fully
        matched left halves there were (selected), and the new contexts partial
        matches suggest (only when the reading's own context was new)."""
        group, now = set(m.group), set(facts)
        lefts: Mapping[int, int] = (
            _matches(m.left_by_fact, m.group) if zero_new else _full(m, group)
        )
        rights = _matches(m.right_by_fact, facts)
        active: list[tuple[int, int, int, int]] = []
        selected = 0
        possible: list[Pair] = []
        # The reference compares context numbers with a "no new context" value of
        # False, which equals context 0: context 0 is skipped unless a new context was
        # made at this reading. Kept, so that scores are the reference's.
        for lnum in sorted(k for k in lefts if k < crossed):
            left = m.lefts[lnum]
            matched = lefts[lnum]
            full = matched == len(left.facts)
            if not full and not (zero_new and matched <= self.max_left):
                continue  # a partial match only suggests new contexts, and only short
            for rnum, number in left.links.items():
                if number == skip:
                    continue
                selected += full
                hits = rights.get(rnum, 0)
                if not hits:
                    continue
                right = m.rights[rnum]
                context = m.contexts[number]
                if full and hits == len(right.facts):
                    context[0] += 1
                    active.append((number, context[0], left.key, right.key))
                elif context[1] and zero_new and matched <= self.max_left:
                    possible.append(
                        (
                            tuple(f for f in left.facts if f in group),
                            tuple(f for f in right.facts if f in now),
                        )
                    )
        return active, selected, possible


def _full(m: Memory, group: set[int]) -> dict[int, int]:
    """The left halves the previous group matched fully, with their sizes (all a
    reading needs unless its own context is new: most readings)."""
    out = {}
    for fact in m.group:
        for number in m.left_by_top.get(fact, ()):
            facts = m.lefts[number].facts
            if group.issuperset(facts):
                out[number] = len(facts)
    return out


def _matches(by_fact: dict[int, list[int]], facts: tuple[int, ...]) -> Counter[int]:
    """How many of ``facts`` each half holds (halves holding none are absent)."""
    return Counter(chain.from_iterable(by_fact.get(fact, ()) for fact in facts))


class CadDetector(Detector):
    """CAD OSE per field; a record's score is its fields' largest (see the module)."""

    def __init__(
        self,
        fields: tuple[str, ...],
        *,
        ranges: Mapping[str, tuple[float, float]] | None = None,
        bits: int = BITS,
        rest: int = REST,
        rest_after: float = THRESHOLD,
        max_left: int = MAX_LEFT,
        max_active: int = MAX_ACTIVE,
    ) -> None:
        if bits < 1 or rest < 0 or not 0 < rest_after <= 1 or max_left < 1 or max_active < 1:
            raise ValueError(
                "cad needs bits >= 1, rest >= 0, 0 < rest_after <= 1, max_left >= 1 and "
                "max_active >= 1"
            )
        self.fields = fields
        self.ranges = dict(ranges or {})
        for name, (lo, hi) in self.ranges.items():
            if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
                raise ValueError(f"range of {name!r}: [low, high] with low <= high, not {[lo, hi]}")
        self.bits = bits
        self.rest = rest
        self.rest_after = rest_after
        self.memory = ContextMemory(max_left, max_active)

    # -- scoring -----------------------------------------------------------------------
    def step(
        self, live: Any, record: Mapping[str, Any], at: datetime | None
    ) -> tuple[float, str | None]:
        best, top = 0.0, None
        for name in self.fields:
            value = _number(record.get(name))
            if value is None:
                continue
            score = self.score(live[name], name, value)
            if top is None or score > best:
                best, top = score, name
        return best, top

    def score(self, m: Memory, name: str, value: float) -> float:
        """One reading of one field: its score (0 during a rest period)."""
        low, step = self._scale(m, name, value)
        familiar, new_share = self.memory.step(m, value_facts(value, low, step, self.bits))
        raw = (1.0 - familiar + new_share) / 2.0
        resting = self.rest > 0 and max(m.history[-self.rest :]) >= self.rest_after
        m.history.append(raw)
        del m.history[: -max(self.rest, 1)]
        return 0.0 if resting else raw

    def _scale(self, m: Memory, name: str, value: float) -> tuple[float, float]:
        """(low, step) of the quantization: the declared range's, else the range seen
        before this reading (which it then widens)."""
        if name in self.ranges:
            low, high = self.ranges[name]
        else:
            low = value if m.low is None else m.low
            high = value if m.high is None else m.high
            m.low, m.high = min(low, value), max(high, value)
        top = 2**self.bits - 1.0
        span = high - low
        return low, (span if span > 0 else top) / top

    # -- state -------------------------------------------------------------------------
    def load(self, state: Any) -> dict[str, Memory]:
        saved = state or {}
        return {name: _memory(saved.get(name)) for name in self.fields}

    def save(self, live: dict[str, Memory]) -> Any:
        return {name: _plain(m) for name, m in live.items()}


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _plain(m: Memory) -> dict[str, Any]:
    """A field's memory as plain data (lists of numbers)."""
    return {
        "l": [[list(h.facts), [v for pair in h.links.items() for v in pair]] for h in m.lefts],
        "r": [list(h.facts) for h in m.rights],
        "c": m.contexts,
        "g": list(m.group),
        "h": m.history,
        "lo": m.low,
        "hi": m.high,
    }


def _memory(saved: dict[str, Any] | None) -> Memory:
    m = Memory()
    if not saved:
        return m
    for facts, links in saved["l"]:
        number = len(m.lefts)
        half = _Half(tuple(facts), dict(zip(links[::2], links[1::2], strict=True)))
        m.lefts.append(half)
        m.left_of[half.facts] = number
        for fact in half.facts:
            m.left_by_fact.setdefault(fact, []).append(number)
        if half.facts:
            m.left_by_top.setdefault(half.facts[-1], []).append(number)
    for facts in saved["r"]:
        number = len(m.rights)
        m.rights.append(_Half(tuple(facts)))
        m.right_of[m.rights[-1].facts] = number
        for fact in facts:
            m.right_by_fact.setdefault(fact, []).append(number)
    m.contexts = [list(c) for c in saved["c"]]
    m.group = tuple(saved["g"])
    m.history = list(saved["h"])
    m.low, m.high = saved.get("lo"), saved.get("hi")
    return m
