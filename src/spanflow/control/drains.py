"""Drains room: when a site that left a running pipeline has been read to its end (pure).

A site leaves a pipeline when no node there hosts the pipeline's stream any more (its
node removed, or its stream no longer declared). Re-planning at once would drop the
global fragment's source for the site, and with it whatever the site had sent that the
global fragment had not read yet. So the site is let go in two steps:

1. its local fragment has nothing left to read — its last report says it is not behind
   its input — or it cannot run any more (no node, or its node is not alive): the site
   is *marked* with the global fragments' batch counts then (a ``site-draining`` record);
2. every global fragment reading the site has since run two more batches with nothing
   behind, while the site's fragment read nothing more. The first batch after the mark
   may have been planned before it; the second was planned after, so it saw everything
   the site had written by then. The site is *drained*: the pipeline may be re-planned.

A site's fragment that reads more after the mark is marked again. A global fragment
that never catches up (its input always ahead of it) keeps the site waiting, and the
status says so. Times come from the caller; runtimes are the latest reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from spanflow.control.state import ClusterState
from spanflow.protocol.metrics import FragmentRuntime
from spanflow.spec.cluster import Fragment, NodeState, PipelineRecord, SiteDrain

BATCHES_AFTER_MARK = 2
"""Batches a global fragment runs after the mark before the site counts as read."""

RuntimeOf = Callable[[str], FragmentRuntime | None]
"""Fragment id → its current assignment's latest report (None: none yet)."""


@dataclass
class DrainView:
    """Where the sites that left a pipeline stand."""

    marks: list[SiteDrain] = field(default_factory=list)
    """Sites to mark now (their fragments have nothing left to read)."""
    waiting: dict[str, str] = field(default_factory=dict)
    """Site → what it still waits for."""

    @property
    def drained(self) -> bool:
        """Every site that left has been read to its end."""
        return not self.marks and not self.waiting


def drains(
    state: ClusterState,
    record: PipelineRecord,
    left: Iterable[str],
    runtime_of: RuntimeOf,
    at: float,
) -> DrainView:
    """Each site of ``left`` against ``record``'s running plan (see the module)."""
    view = DrainView()
    for site in left:
        _drain_site(state, record, site, runtime_of, at, view)
    return view


def _drain_site(
    state: ClusterState,
    record: PipelineRecord,
    site: str,
    runtime_of: RuntimeOf,
    at: float,
    view: DrainView,
) -> None:
    planned = [f for f in record.fragments if not f.replica]
    local = [f for f in planned if f.site == site]
    behind, rows = _local_rows(state, local, runtime_of)
    if behind is not None:
        view.waiting[site] = behind
        return
    readers = [f for f in planned if site in f.input_sites and f.site != site]
    heard = {f.id: rt for f in readers if (rt := runtime_of(f.id)) is not None}
    silent = sorted(f.id for f in readers if f.id not in heard)
    if silent:
        view.waiting[site] = f"no report yet from {', '.join(silent)}"
        return
    batches = {fid: rt.batches for fid, rt in heard.items()}
    mark = record.draining.get(site)
    if mark is None or mark.site_rows_in != rows or set(mark.global_batches) != set(batches):
        view.marks.append(SiteDrain(site=site, global_batches=batches, site_rows_in=rows, since=at))
        return
    for fid, rt in sorted(heard.items()):
        if rt.batches < mark.global_batches[fid] + BATCHES_AFTER_MARK or rt.lag > 0:
            view.waiting[site] = f"{fid} has not read all that {site} sent yet"
            return


def _local_rows(
    state: ClusterState, local: list[Fragment], runtime_of: RuntimeOf
) -> tuple[str | None, int]:
    """(why the site's fragments may still send something, or None; the records they
    have read so far). A fragment without a live node sends nothing more."""
    rows = 0
    for f in local:
        a = state.assignments.get(f.id)
        node = state.nodes.get(a.node) if a is not None else None
        if node is None or node.state != NodeState.ALIVE:
            continue
        rt = runtime_of(f.id)
        if rt is None:
            return f"no report yet from {f.id}", 0
        if rt.lag > 0:
            return f"{f.id} has {rt.lag} messages left to read", 0
        rows += rt.rows_in
    return None, rows
