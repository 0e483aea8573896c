"""Which records a source may call late: the windows its event time feeds.

Spark drops a record from a window aggregation when every window it belongs to has
already been written: its window's end is at or before the watermark of the batch
before (Spark's "watermark for late events"). It drops it without a word. A source
that knows the windows its records reach, and that watermark, can see the same
records before Spark does and send them to the dead letters instead (reason ``late``).

A source qualifies only when every path from it ends in a window over its own event
time through steps that pass records on unchanged in time (filter, select, map that
leaves the field alone, key_by, union): there, a record no window takes is a record
nothing else would have seen either. A source whose records also reach a sink, a
join, a keyed processor or another event-time declaration gets no rules: its late
records stay Spark's to drop (counted by Spark, not dead-lettered).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.io import SourceStep
from spanflow.spec.steps.stateless import FilterStep, KeyByStep, MapStep, SelectStep, UnionStep
from spanflow.spec.steps.windows import WindowStep

MICROS = 1_000_000


@dataclass(frozen=True, slots=True)
class LateRule:
    """One window a source's records reach: when the last window holding a record ends."""

    window: str
    """The window step's id (named in the dead letter's reason)."""
    kind: str
    size: float = 0.0
    slide: float = 0.0
    gap: float = 0.0

    def last_end_us(self, event_us: int) -> int:
        """The end of the last window that holds an event at ``event_us`` (µs): a
        session's, at the earliest, the event's time plus the gap; a tumbling or
        sliding window's, the one that starts at the last slide boundary at or before
        it (Spark's windows start at multiples of the slide from the epoch)."""
        if self.kind == "session":
            return event_us + round(self.gap * MICROS)
        slide = round((self.slide or self.size) * MICROS)
        return event_us - event_us % slide + round(self.size * MICROS)

    def to_json(self) -> dict[str, object]:
        return {
            "window": self.window,
            "kind": self.kind,
            "size": self.size,
            "slide": self.slide,
            "gap": self.gap,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> LateRule:
        return cls(
            window=str(data["window"]),
            kind=str(data["kind"]),
            size=float(data.get("size") or 0.0),  # type: ignore[arg-type]
            slide=float(data.get("slide") or 0.0),  # type: ignore[arg-type]
            gap=float(data.get("gap") or 0.0),  # type: ignore[arg-type]
        )


def is_late(rules: tuple[LateRule, ...], event_us: int, watermark_us: int) -> bool:
    """Late for every window it reaches: each has written the windows it belongs to."""
    return bool(rules) and all(r.last_end_us(event_us) <= watermark_us for r in rules)


def late_rules(
    spec: PipelineSpec, within: Collection[str] | None = None
) -> dict[str, tuple[LateRule, ...]]:
    """Source id → the windows that decide its records' lateness (see the module).
    ``within``: only these steps run (one query of the pipeline: the paths to its sink)."""
    core = spec.expanded()
    consumers: dict[str, list[str]] = {}
    for step in core.steps:
        if within is not None and step.id not in within:
            continue
        for up in step.inputs:
            consumers.setdefault(up, []).append(step.id)
    out: dict[str, tuple[LateRule, ...]] = {}
    for source in core.sources():
        if not source.event_time:
            continue
        rules = _windows_reached(core, consumers, source)
        if rules:
            out[source.id] = rules
    return out


def _windows_reached(
    core: PipelineSpec, consumers: dict[str, list[str]], source: SourceStep
) -> tuple[LateRule, ...] | None:
    """The windows every path from ``source`` ends in; None if a path ends elsewhere."""
    field = source.event_time
    rules: list[LateRule] = []
    todo, seen = list(consumers.get(source.id, [])), set()
    if not todo:
        return None
    while todo:
        step = core.step(todo.pop())
        if step.id in seen:
            continue
        seen.add(step.id)
        if isinstance(step, WindowStep):
            rules.append(_rule(step))
            continue
        if not _passes_time_on(step, field):
            return None
        nexts = consumers.get(step.id, [])
        if not nexts:
            return None
        todo.extend(nexts)
    return tuple(rules)


def _passes_time_on(step: object, field: str | None) -> bool:
    if isinstance(step, FilterStep | KeyByStep | UnionStep):
        return True
    if isinstance(step, SelectStep):
        kept = {c.strip() for c in step.columns}
        return "*" in kept or field in kept
    if isinstance(step, MapStep):  # SQL columns that leave the field alone, no Python
        return step.columns is not None and field not in step.columns
    return False


def _rule(step: WindowStep) -> LateRule:
    return LateRule(
        window=step.id,
        kind=step.kind,
        size=float(step.size or 0.0),
        slide=float(step.slide or step.size or 0.0),
        gap=float(step.gap or 0.0),
    )
