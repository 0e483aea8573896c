"""Whether a new version of a pipeline can start from the old version's checkpoint,
step by step (pure: two specs in, verdicts out).

Each sink of a pipeline runs as its own Spark query, checkpointed apart. Spark restores
a query's state operator by operator, in the order the operators have in its plan, and
keeps one offset per source of the query. So, per sink:

* a sink that is new starts its query empty (its stateful steps are ``added``);
* a sink that is gone takes its query's state with it (``dropped``);
* a sink kept keeps its query's state (each stateful step ``kept``, or ``changed`` when
  only fields that decide what it does with its state changed, such as a detector's
  threshold) — as long as the query reads the same sources and has the same stateful
  steps, with the same state shape (window size, aggregates, key, ...), fed by the same
  stateful steps. Anything else is ``refused``, with the reason per step: Spark would
  either fail at restart or restore one step's state into another.
* a query whose checkpoint keeps its offsets by source name (``named``: see
  :mod:`spanflow.spark.checkpoints.source_names`) may also read sources more or fewer: a source
  added reads from its own start (``added``), a source removed is forgotten
  (``dropped``) — what a global fragment needs when a site joins or leaves. A query
  keeps offsets by name only when it reads each source by one path
  (:func:`can_name_sources`): Spark refuses one name twice in a plan.

The verdicts are matched by step id: a step renamed is a step removed and another added.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from spanflow.errors import SpanflowError
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps.base import Placement, StepBase
from spanflow.spec.steps.io import SourceStep

SOURCE_SHAPE = ("connector", "options", "stream")
"""What a query's stored offsets belong to: a source reading elsewhere cannot resume."""


class Verdict(StrEnum):
    KEPT = "kept"
    """Restored as it was."""
    CHANGED = "changed"
    """Restored; only fields that do not shape its state changed."""
    ADDED = "added"
    """New: starts empty."""
    DROPPED = "dropped"
    """Gone: its state goes with it."""
    REFUSED = "refused"
    """Its state cannot be carried over: the upgrade does not start."""


@dataclass(frozen=True, slots=True)
class StepUpgrade:
    """What an upgrade does to one step of one sink's query."""

    sink: str
    step: str
    verdict: Verdict
    detail: str = ""

    def __str__(self) -> str:
        text = f"sink {self.sink!r}, step {self.step!r}: {self.verdict.value}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass(frozen=True, slots=True)
class UpgradeReport:
    """Every stateful step's verdict, sink by sink."""

    steps: tuple[StepUpgrade, ...]

    @property
    def refused(self) -> list[StepUpgrade]:
        return [s for s in self.steps if s.verdict == Verdict.REFUSED]

    @property
    def ok(self) -> bool:
        return not self.refused

    def to_json(self) -> list[dict[str, str]]:
        return [
            {"sink": s.sink, "step": s.step, "verdict": s.verdict.value, "detail": s.detail}
            for s in self.steps
        ]

    def raise_if_refused(self, name: str) -> None:
        if self.refused:
            raise UpgradeRefused(name, self.refused)


class UpgradeRefused(SpanflowError):
    """A new version of a pipeline cannot start from the old one's state; the message
    gives the reason per step (nothing was stopped or started)."""

    code = "upgrade_refused"

    def __init__(self, name: str, refused: Iterable[StepUpgrade]) -> None:
        self.refused = list(refused)
        reasons = "\n".join(f"  {s}" for s in self.refused)
        super().__init__(
            f"pipeline {name!r}: the new version cannot keep the old one's state:\n{reasons}\n"
            "Change those steps in a new sink (it starts empty), or start the pipeline as a "
            "new run (a new name, or without its checkpoints)."
        )


def can_name_sources(spec: PipelineSpec, sink: str) -> bool:
    """Whether the query of ``sink`` can keep its offsets by source name: it runs in
    micro-batches (Real-Time Mode keeps them by position), and no step on its paths
    feeds two steps of it — a source read by two paths (a forward to two branches that
    meet again) is two relations of one name in Spark's plan, which Spark refuses
    (``DUPLICATE_SOURCE_NAMES``).

    >>> s = PipelineSpec.model_validate({"name": "p", "steps": [
    ...   {"id": "in", "type": "source", "stream": "S", "schema": {"x": "long"}},
    ...   {"id": "a", "type": "filter", "inputs": ["in"], "where": "x > 0"},
    ...   {"id": "b", "type": "filter", "inputs": ["in"], "where": "x < 0"},
    ...   {"id": "u", "type": "union", "inputs": ["a", "b"]},
    ...   {"id": "out", "type": "sink", "connector": "console", "inputs": ["u"]}]})
    >>> can_name_sources(s, "out")
    False
    """
    core = spec.expanded()
    query = next((s for s in core.sinks() if s.id == sink), None)
    if query is None or core.mode_of(query) != "microbatch":
        return False
    consumers: dict[str, int] = {}
    for step in core.path_to(sink):
        for up in step.inputs:
            consumers[up] = consumers.get(up, 0) + 1
    return all(n == 1 for n in consumers.values())


def check_upgrade(
    old: PipelineSpec,
    new: PipelineSpec,
    running: Collection[str] | None = None,
    named: Collection[str] = (),
) -> UpgradeReport:
    """The verdict on every stateful step of ``new`` and ``old``, sink by sink.
    ``running``: only these sinks of ``old`` have state (default: all of them).
    ``named``: the sinks whose checkpoints keep offsets by source name."""
    old_core, new_core = old.expanded(), new.expanded()
    old_sinks = {s.id for s in old_core.sinks()}
    if running is not None:
        old_sinks &= set(running)
    out: list[StepUpgrade] = []
    for sink in new_core.sinks():
        new_query = _Query.of(new_core, sink.id)
        if sink.id not in old_sinks:
            out += [
                StepUpgrade(sink.id, s, Verdict.ADDED, "a new query") for s in new_query.stateful
            ]
            continue
        out += _compare(sink.id, _Query.of(old_core, sink.id), new_query, sink.id in named)
    for gone in sorted(old_sinks - {s.id for s in new_core.sinks()}):
        for step in _Query.of(old_core, gone).stateful:
            out.append(StepUpgrade(gone, step, Verdict.DROPPED, "its sink is gone"))
    return UpgradeReport(tuple(out))


def stateful_steps(spec: PipelineSpec, sink: str) -> list[str]:
    """The ids of the stateful steps in ``sink``'s query (in plan order): what its
    checkpoint holds state for."""
    return list(_Query.of(spec.expanded(), sink).stateful)


@dataclass(frozen=True, slots=True)
class _Query:
    """The parts of one sink's query that its checkpoint depends on."""

    sources: dict[str, dict[str, Any]]
    """Source id → what its offsets belong to."""
    stateful: dict[str, dict[str, Any]]
    """Stateful step id → its state shape (with its type and key)."""
    feeds: dict[str, frozenset[str]]
    """Stateful step id → the stateful steps upstream of it."""
    free: dict[str, dict[str, Any]]
    """Stateful step id → its fields that may change (its ``upgrade_free``)."""
    mode: str
    """``microbatch`` or ``realtime``: how the query runs."""
    nameable: bool
    """Whether it can keep its offsets by source name (:func:`can_name_sources`)."""

    @staticmethod
    def of(core: PipelineSpec, sink: str) -> _Query:
        path = core.path_to(sink)
        by_id = {s.id: s for s in path}
        facts = core.facts()
        sources = {
            s.id: s.model_dump(mode="json", include=set(SOURCE_SHAPE))
            for s in path
            if isinstance(s, SourceStep)
        }
        stateful = {s.id: _shape(s, facts) for s in path if s.placement == Placement.KEYED}
        feeds = {sid: frozenset(_stateful_above(by_id, sid)) for sid in stateful}
        free = {
            sid: by_id[sid].model_dump(mode="json", include=set(by_id[sid].upgrade_free))
            for sid in stateful
        }
        mode = core.mode_of(next(s for s in core.sinks() if s.id == sink))
        return _Query(sources, stateful, feeds, free, mode, can_name_sources(core, sink))


def _shape(step: StepBase, facts: dict[str, Any]) -> dict[str, Any]:
    key = step.state_key([facts[i] for i in step.inputs]) if step.inputs else ()
    return {"type": step.type_name, "key": list(key), **step.state_shape()}


def _stateful_above(by_id: dict[str, StepBase], step_id: str) -> set[str]:
    found: set[str] = set()
    pending = list(by_id[step_id].inputs)
    seen: set[str] = set()
    while pending:
        sid = pending.pop()
        if sid in seen:
            continue
        seen.add(sid)
        step = by_id[sid]
        if step.placement == Placement.KEYED:
            found.add(sid)
        pending.extend(step.inputs)
    return found


def _compare(sink: str, old: _Query, new: _Query, named: bool) -> list[StepUpgrade]:
    problem = _query_problem(old, new, named)
    if problem is not None:
        steps = sorted(set(old.stateful) | set(new.stateful)) or [sink]
        return [StepUpgrade(sink, s, Verdict.REFUSED, problem) for s in steps]
    out = [
        StepUpgrade(sink, s, Verdict.ADDED, "a new source: reads from its own start")
        for s in sorted(set(new.sources) - set(old.sources))
    ]
    out += [
        StepUpgrade(sink, s, Verdict.DROPPED, "a source no longer read: its offsets go")
        for s in sorted(set(old.sources) - set(new.sources))
    ]
    for sid, shape in new.stateful.items():
        before = old.stateful[sid]
        changed = _differences(before, shape)
        if changed:
            out.append(StepUpgrade(sink, sid, Verdict.REFUSED, f"{changed}: it shapes its state"))
        elif new.feeds[sid] != old.feeds[sid]:
            out.append(
                StepUpgrade(
                    sink,
                    sid,
                    Verdict.REFUSED,
                    f"it was fed by the stateful steps {sorted(old.feeds[sid])}, now by "
                    f"{sorted(new.feeds[sid])}",
                )
            )
        else:
            tuned = _differences(old.free[sid], new.free[sid])
            verdict = Verdict.CHANGED if tuned else Verdict.KEPT
            out.append(
                StepUpgrade(sink, sid, verdict, f"{tuned}; its state is kept" if tuned else "")
            )
    return out


def _query_problem(old: _Query, new: _Query, named: bool) -> str | None:
    """Why the query's checkpoint cannot resume at all (sources or stateful steps)."""
    if old.mode != new.mode and (old.stateful or new.stateful):
        return (
            f"the query ran in {old.mode} mode and would run in {new.mode} mode: its state "
            "is kept in another form"
        )
    if named and not new.nameable:
        return (
            "the query keeps its offsets by source name and would read a source by two "
            "paths (or in Real-Time Mode), which Spark cannot name: keep one path from "
            "each source to the sink, or start the pipeline anew"
        )
    if set(old.sources) != set(new.sources) and not named:
        return (
            f"the query read the sources {sorted(old.sources)} and would read "
            f"{sorted(new.sources)}: Spark keeps one offset per source of a query, and "
            "this checkpoint keeps them by position (written before spanflow named "
            "sources, or in Real-Time Mode); start the pipeline anew once to keep them "
            "by name"
        )
    for sid, shape in new.sources.items():
        if sid not in old.sources:
            continue
        changed = _differences(old.sources[sid], shape)
        if changed:
            return f"source {sid!r}: {changed}: its stored offsets belong to the old one"
    added = sorted(set(new.stateful) - set(old.stateful))
    removed = sorted(set(old.stateful) - set(new.stateful))
    if added or removed:
        parts = [f"adds {added}" if added else "", f"removes {removed}" if removed else ""]
        return (
            f"the query {' and '.join(p for p in parts if p)} stateful steps: Spark restores "
            "a query's state operator by operator in plan order, so the others' state would "
            "be misplaced (put a new stateful step on a sink of its own)"
        )
    return None


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """``field old → new`` for each field that differs, or ''."""
    fields = sorted(set(old) | set(new))
    return "; ".join(
        f"{f} {_show(old.get(f))} → {_show(new.get(f))}" for f in fields if old.get(f) != new.get(f)
    )


def _show(value: Any) -> str:
    return "(none)" if value is None else repr(value)
