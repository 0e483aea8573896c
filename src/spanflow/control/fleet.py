"""Fleet room: how a placed pipeline's plan compares with today's topology (pure).

A pipeline's fragments are planned when it is first placed: one local fragment per site
that hosts its input, a global fragment reading what they send. A site declared (or a
stream hosted) afterwards is not in that plan, nor does a removed site leave it, until
the pipeline is planned again. This room says which sites a pipeline's plan is behind
on, so that the status answer and the dashboard show it rather than let a new
factory's readings go unread in silence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from spanflow.control.state import ClusterState
from spanflow.plan.fragments import PlanError, compile_fragments
from spanflow.protocol.rest import SitesBehind
from spanflow.spec.cluster import Fragment, PipelineRecord


def sites_of(fragments: Iterable[Fragment]) -> set[str]:
    """The sites a plan reads at: its local fragments' and its fragments' input sites."""
    out: set[str] = set()
    for f in fragments:
        out.update(f.input_sites)
        if f.site is not None:
            out.add(f.site)
    return out


def _planned_today(state: ClusterState, record: PipelineRecord) -> list[Fragment] | None:
    """The fragments ``record`` would be planned into on today's topology; None when it
    was never placed or cannot be planned today."""
    if not record.fragments:
        return None
    try:
        return compile_fragments(record.spec, state.full_topology(), record.parallelism).fragments
    except PlanError:
        return None


@dataclass(frozen=True)
class PlanChange:
    """How today's plan of a placed pipeline differs from the plan it runs, fragment by
    fragment: what taking a site in (or letting one go) would start, restart and stop."""

    kept: list[str] = field(default_factory=list)
    """Fragments planned the same (another site's local part): left running as they are."""
    added: list[Fragment] = field(default_factory=list)
    """New fragments (a new site's local part): started empty."""
    changed: list[Fragment] = field(default_factory=list)
    """Same id, other steps or inputs (the global part reading one more site)."""
    removed: list[str] = field(default_factory=list)
    """Fragments no longer planned (a removed site's local part): drained and stopped."""

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed)


def plan_change(state: ClusterState, record: PipelineRecord) -> PlanChange | None:
    """Today's plan of ``record`` against the one it runs; None when it cannot be
    planned today (or was never placed)."""
    today = _planned_today(state, record)
    if today is None:
        return None
    running = {f.id: f for f in record.fragments}
    change = PlanChange()
    for f in today:
        old = running.get(f.id)
        if old is None:
            change.added.append(f)
        elif old == f:
            change.kept.append(f.id)
        else:
            change.changed.append(f)
    wanted = {f.id for f in today}
    change.removed.extend(fid for fid in running if fid not in wanted)
    return change


def sites_behind(state: ClusterState, record: PipelineRecord) -> SitesBehind | None:
    """The sites today's topology would add to or take from ``record``'s placed plan;
    None when the plan is current (or not placed yet, or not plannable today)."""
    today = None if record.state.terminal else _planned_today(state, record)
    if today is None:
        return None
    planned, wanted = sites_of(record.fragments), sites_of(today)
    if planned == wanted:
        return None
    left = sorted(planned - wanted)
    draining = [s for s in left if s in record.draining]
    return SitesBehind(joined=sorted(wanted - planned), left=left, draining=draining)
