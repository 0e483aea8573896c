"""Place a compiled pipeline's fragments on nodes, and say why.

Local fragments go to their own site: a node there that hosts the input stream if it
can take one more fragment and has the pinned tags, else the least-loaded capable
node of the site. Global fragments go where the solver puts them (SpanEdge MinMax over
their input sites, see :mod:`spanflow.plan.solver`), restricted to cloud sites when
pinned there and to the latency budget left after processing.

The same code plans live (the coordinator, against registered nodes and their load)
and offline (``spanflow plan --explain``, against a topology file with every node
assumed up and idle).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from spanflow.plan.fragments import CompiledPipeline
from spanflow.plan.placement import ClusterView, PlacementError, realtime_need, slot_need
from spanflow.plan.solver import (
    Flow,
    GroupDemand,
    NodeOffer,
    Solution,
    overfull_links,
    path_seconds,
    solve_exact,
    solve_greedy,
    transfer_seconds,
)
from spanflow.spec.cluster import Fragment, NodeRecord, NodeState, PipelineRecord
from spanflow.spec.topology import SiteKind, Topology

BATCH_OVERHEAD = 0.2
"""Seconds one fragment's micro-batch is assumed to take on top of its trigger interval
(planning estimate; ``spanflow status`` reports the measured figure)."""

REALTIME_OVERHEAD = 0.005
"""Seconds a record is assumed to spend in one fragment running in Spark's Real-Time
Mode (measured: ≈1-3 ms at the median, docs/realtime.md)."""

EXACT_LIMIT = 100_000
"""Nodes × global fragments up to which placement is solved exactly (HiGHS)."""


@dataclass
class Decision:
    """Where one fragment goes and why."""

    fragment: Fragment
    node: str
    why: str
    worst_latency: float = 0.0
    """Global fragments: one-way latency from their farthest input site (seconds)."""
    alternatives: list[tuple[str, float]] = field(default_factory=list)
    """Global fragments: the next-best nodes and their worst input latency."""
    slots: int = 1
    """Fragment slots it takes on its node (one more per Python stateful step)."""


@dataclass
class Plan:
    decisions: list[Decision]
    hops: int
    trigger: float
    latency_budget: float | None
    solver: str = "-"
    realtime: bool = False
    """Every sink runs in Real-Time Mode: no batch to wait for."""
    exact_cost: float | None = None
    greedy_cost: float | None = None

    @property
    def placement(self) -> dict[str, str]:
        return {d.fragment.id: d.node for d in self.decisions}

    @property
    def processing(self) -> float:
        return processing_estimate(self.hops, self.trigger, self.realtime)

    @property
    def path_latency(self) -> float:
        return max((d.worst_latency for d in self.decisions), default=0.0)

    @property
    def latency_estimate(self) -> float:
        return self.path_latency + self.processing


def processing_estimate(hops: int, trigger: float, realtime: bool = False) -> float:
    """Each fragment on the path waits up to one trigger interval, then runs one batch;
    in Real-Time Mode a record passes straight through."""
    if realtime:
        return hops * REALTIME_OVERHEAD
    return hops * (trigger + BATCH_OVERHEAD)


def hops_of(fragments: list[Fragment]) -> int:
    kinds = {f.kind for f in fragments}
    return 2 if len(fragments) > 1 and kinds == {"local", "global"} else 1


class GeoPlacer:
    """The coordinator's placer (the :class:`~spanflow.plan.placement.Placer` protocol)."""

    def __init__(self, exact_limit: int = EXACT_LIMIT) -> None:
        self.exact_limit = exact_limit

    def place(
        self,
        pipeline: PipelineRecord,
        fragments: list[Fragment],
        view: ClusterView,
        *,
        exclude: Iterable[str] = (),
    ) -> dict[str, str]:
        plan = place(
            fragments,
            view,
            priority=pipeline.priority,
            latency_budget=pipeline.latency_budget,
            trigger=pipeline.spec.trigger,
            realtime=pipeline.spec.all_realtime(),
            hops=hops_of(pipeline.fragments or fragments),
            exclude=exclude,
            exact_limit=self.exact_limit,
        )
        return plan.placement


def place(
    fragments: list[Fragment],
    view: ClusterView,
    *,
    priority: int = 0,
    latency_budget: float | None = None,
    trigger: float = 0.5,
    realtime: bool = False,
    hops: int | None = None,
    exclude: Iterable[str] = (),
    exact_limit: int = EXACT_LIMIT,
) -> Plan:
    """Decisions for ``fragments`` (locals first); ``view.used_slots`` takes their slots.

    Raises :class:`PlacementError` naming the fragment and the constraint that failed."""
    hops = hops_of(fragments) if hops is None else hops
    plan = Plan([], hops, trigger, latency_budget, realtime=realtime)
    processing = plan.processing
    if latency_budget is not None and processing > latency_budget:
        per_hop = (
            f"{_ms(REALTIME_OVERHEAD)} in Real-Time Mode"
            if realtime
            else f"trigger {_ms(trigger)} + {_ms(BATCH_OVERHEAD)} per batch"
        )
        raise PlacementError(
            f"latency budget {_ms(latency_budget)} is {_ms(processing - latency_budget)} short "
            f"before any network: processing is estimated at {_ms(processing)} "
            f"({hops} fragment(s) × ({per_hop}))"
        )
    skip = set(exclude)
    for fragment in sorted(fragments, key=lambda f: f.replica):
        if fragment.kind == "local" and fragment.site is not None:
            plan.decisions.append(_place_local(fragment, view, skip | view.partners(fragment)))
    globals_ = [f for f in fragments if not (f.kind == "local" and f.site is not None)]
    budget = None if latency_budget is None else latency_budget - processing
    alone = [f for f in globals_ if not f.replica and not view.partners(f)]
    if alone:
        _place_global(plan, alone, view, skip, priority, budget, exact_limit)
    for replica in (f for f in globals_ if f not in alone):
        # hot standby: one at a time, away from the nodes its other replicas hold
        skip_partners = skip | view.partners(replica)
        _place_global(plan, [replica], view, skip_partners, priority, budget, exact_limit)
    order = {f.id: i for i, f in enumerate(fragments)}
    plan.decisions.sort(key=lambda d: order[d.fragment.id])
    return plan


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _place_local(fragment: Fragment, view: ClusterView, skip: set[str]) -> Decision:
    """On a node of the fragment's own site; if none can take it, on the nearest site's
    least-loaded capable node (results keep flowing, at WAN cost, until re-planning
    brings it home)."""
    site = fragment.site
    assert site is not None
    at_site = [n for n in view.nodes.values() if n.spec.site == site and n.name not in skip]

    def hosts_input(n: NodeRecord) -> bool:
        return any(n.spec.hosts(s) for s in fragment.input_streams)

    waiting = [n.name for n in at_site if n.state == NodeState.DECLARED and hosts_input(n)]
    if waiting:
        raise PlacementError(
            f"fragment {fragment.id}: waiting for {', '.join(sorted(waiting))} "
            "(hosts its input) to register"
        )
    live = [n for n in at_site if n.state == NodeState.ALIVE]
    capable = [n for n in live if _fits(fragment, n)]
    free = [n for n in capable if view.fits(fragment, n.name)]
    streams = ", ".join(fragment.input_streams) or "its input"
    if free:
        hosts = [n for n in free if hosts_input(n)]
        best = min(hosts or free, key=lambda n: _load_key(view, n))
        if hosts:
            why = f"at {site}, where {streams} is born; {best.name} hosts it"
        else:
            why = f"at {site}, where {streams} is born; least-loaded capable node there"
    else:
        if not live:
            problem = f"no live node at site {site}"
        elif not capable:
            have = ", ".join(f"{n.name} {_has(n)}" for n in live)
            problem = f"no node at site {site} has {_needs(fragment)} (nodes there: {have})"
        else:
            usage = ", ".join(_usage(view, fragment, n) for n in capable)
            problem = f"every capable node at site {site} is full ({usage})"
        own = view.topology.site(site)
        if own is not None and own.nats_url:
            raise PlacementError(
                f"fragment {fragment.id}: {problem} (its data stays on the site's own "
                "NATS server, so it runs there or waits)"
            )
        best, latency = _nearest_elsewhere(fragment, view, skip, problem)
        why = f"fallback: {problem}; nearest capable node is {_ms(latency)} from {site}"
        why += _link_notes(view.topology, fragment, best.spec.site)
    view.take(fragment, best.name)
    if _pinned(fragment):
        why += f" ({_needs(fragment)})"
    return Decision(fragment, best.name, why, slots=view.need(fragment, best.name))


def _allowed_sites(fragment: Fragment, cloud_sites: frozenset[str]) -> frozenset[str] | None:
    """Where a global fragment may run: the cloud when pinned there, and only sites
    that reach the external systems it uses (PlacementError when nothing is left)."""
    allowed = cloud_sites if fragment.cloud else None
    if fragment.reach_sites is not None:
        reach = frozenset(fragment.reach_sites)
        allowed = reach if allowed is None else allowed & reach
        if not allowed:
            raise PlacementError(
                f"fragment {fragment.id}: pinned to the cloud, but its external systems are "
                f"reachable only from {', '.join(fragment.reach_sites)}"
            )
    return allowed


def _usage(view: ClusterView, fragment: Fragment, n: NodeRecord) -> str:
    """``edge-a 2/2``, with the real-time task slots when the fragment needs some."""
    text = f"{n.name} {view.used_slots.get(n.name, 0)}/{view.slots(n.name)}"
    slots = view.need(fragment, n.name)
    if slots > 1:
        text += f", {slots} needed"
    need = realtime_need(fragment)
    if need:
        text += f", real-time task slots {view.free_realtime(n.name)} free of {need} needed"
    return text


def _fits(fragment: Fragment, n: NodeRecord) -> bool:
    """Has the node every tag and accelerator, and the cores and memory, the fragment's
    steps are pinned to, and is it at a site that reaches the external systems the
    fragment uses?"""
    caps = n.spec.capabilities
    if fragment.reach_sites is not None and n.spec.site not in fragment.reach_sites:
        return False
    return (
        set(fragment.node_tags) <= set(caps.tags)
        and set(fragment.node_accelerators) <= set(caps.accelerators)
        and caps.cores >= fragment.node_cores
        and caps.memory_mb >= fragment.node_memory_mb
    )


def _pinned(fragment: Fragment) -> bool:
    return bool(
        fragment.node_tags
        or fragment.node_accelerators
        or fragment.node_cores
        or fragment.node_memory_mb
    )


def _needs(fragment: Fragment) -> str:
    parts = []
    if fragment.node_tags:
        parts.append(f"tags {sorted(fragment.node_tags)}")
    if fragment.node_accelerators:
        parts.append(f"accelerators {sorted(fragment.node_accelerators)}")
    if fragment.node_cores:
        parts.append(f"{fragment.node_cores} cores")
    if fragment.node_memory_mb:
        parts.append(f"{_memory(fragment.node_memory_mb)} of memory")
    return " and ".join(parts)


def _memory(mb: int) -> str:
    return f"{mb / 1024:g} GiB" if mb >= 1024 and mb % 128 == 0 else f"{mb} MiB"


def _has(n: NodeRecord) -> str:
    caps = n.spec.capabilities
    have = f"{caps.cores} cores, {_memory(caps.memory_mb)}, tags {list(caps.tags)}"
    if caps.accelerators:
        have += f", accelerators {list(caps.accelerators)}"
    return have


def _load_key(view: ClusterView, n: NodeRecord) -> tuple[float, int, str]:
    return (view.load(n.name), view.used_slots.get(n.name, 0), n.name)


def _nearest_elsewhere(
    fragment: Fragment, view: ClusterView, skip: set[str], problem: str
) -> tuple[NodeRecord, float]:
    site = fragment.site
    assert site is not None
    options: list[tuple[float, tuple[float, int, str], NodeRecord]] = []
    demand = _demand(fragment, view)
    too_thin: set[str] = set()
    for n in view.schedulable(skip):
        if n.spec.site == site or not _fits(fragment, n):
            continue
        latency = path_seconds(demand, n.spec.site, view.topology.latency, _bandwidth(view))
        if latency is None or not view.fits(fragment, n.name):
            continue
        if _cannot_carry(demand, n.spec.site, view):
            too_thin.add(n.spec.site)
            continue
        options.append((latency, _load_key(view, n), n))
    if not options:
        thin = ""
        if too_thin:
            notes = [_link_notes(view.topology, fragment, t) for t in sorted(too_thin)]
            thin = " (" + "; ".join(n.removeprefix("; ") for n in notes) + ")"
        raise PlacementError(
            f"fragment {fragment.id}: {problem}, and no other linked site can take it{thin}"
        )
    latency, _, best = min(options, key=lambda o: (o[0], o[1]))
    return best, latency


def _place_global(
    plan: Plan,
    fragments: list[Fragment],
    view: ClusterView,
    skip: set[str],
    priority: int,
    budget: float | None,
    exact_limit: int,
) -> None:
    topo = view.topology
    cloud_sites = frozenset(s.name for s in topo.sites if s.kind == SiteKind.CLOUD)
    # Nodes without the real-time task slots the neediest fragment takes are left out
    # (the solver counts fragments per node, not task slots).
    need = max(realtime_need(f) for f in fragments)
    offers = _offers(view, skip, need)
    demands = [
        _demand(
            f,
            view,
            priority=priority,
            latency_budget=budget,
            sites=_allowed_sites(f, cloud_sites),
            batch_seconds=plan.trigger,
        )
        for f in fragments
    ]
    if not offers:
        lacking = f" with {need} free real-time task slots" if need else ""
        raise PlacementError(f"fragment {fragments[0].id}: no live node{lacking}")
    if not any(o.free_slots > 0 for o in offers):
        usage = ", ".join(
            f"{o.name} {view.used_slots.get(o.name, 0)}/{view.slots(o.name)}" for o in offers
        )
        raise PlacementError(
            f"fragment {fragments[0].id}: every live node is full (slots used: {usage})"
        )
    solution = _solve(plan, demands, offers, view, budget, exact_limit)
    for fragment, demand in zip(fragments, demands, strict=True):
        node = solution.placement[fragment.id]
        view.take(fragment, node)
        worst = solution.worst_latency[fragment.id]
        alternatives = _alternatives(view, offers, demand, node)
        plan.decisions.append(
            Decision(
                fragment,
                node,
                _global_why(topo, fragment, node, worst, view),
                worst,
                alternatives,
                slots=view.need(fragment, node),
            )
        )


def _demand(
    fragment: Fragment,
    view: ClusterView,
    *,
    priority: int = 0,
    latency_budget: float | None = None,
    sites: frozenset[str] | None = None,
    batch_seconds: float | None = None,
) -> GroupDemand:
    """What ``fragment`` asks of a node, in the solver's terms."""
    return GroupDemand(
        id=fragment.id,
        input_sites=fragment.input_sites,
        priority=priority,
        slots=slot_need(fragment),
        cores=fragment.node_cores,
        memory_mb=fragment.node_memory_mb,
        tags=frozenset(fragment.node_tags),
        accelerators=frozenset(fragment.node_accelerators),
        latency_budget=latency_budget,
        sites=sites,
        flows=tuple(Flow(site, t.mbps, t.at_most) for site, t in sorted(fragment.traffic.items())),
        batch_seconds=fragment.spec.trigger if batch_seconds is None else batch_seconds,
    )


def _bandwidth(view: ClusterView) -> Callable[[str, str], float | None]:
    return view.topology.bandwidth_mbps


def _cannot_carry(demand: GroupDemand, site: str, view: ClusterView) -> bool:
    """Would a link into ``site`` carry less than what ``demand`` surely pulls over it?"""
    return any(not f.at_most for f, _ in overfull_links(demand, site, _bandwidth(view)))


def _link_notes(topo: Topology, fragment: Fragment, site: str) -> str:
    """What the fragment would ship into ``site`` over each link, and whether the link
    carries it ('' when nothing crosses or no rate is declared)."""
    notes = []
    for source, traffic in sorted(fragment.traffic.items()):
        mbps = topo.bandwidth_mbps(source, site)
        if source == site or mbps is None:
            continue
        bound = "up to " if traffic.at_most else ""
        note = f"ships {bound}{traffic.mbps:.1f} Mbit/s from {source} over a {mbps:g} Mbit/s link"
        if traffic.mbps > mbps:
            note += (
                " — more than it carries (a filter on the way decides how much)"
                if traffic.at_most
                else " — more than it carries"
            )
        notes.append(note)
    return "".join(f"; {n}" for n in notes)


def _offers(view: ClusterView, skip: set[str], realtime: int) -> list[NodeOffer]:
    """What each schedulable node with ``realtime`` free real-time slots offers."""
    return [
        NodeOffer(
            name=n.name,
            site=n.spec.site,
            free_slots=max(0, view.free_slots(n.name)),
            slots=view.slots(n.name),
            cores=n.spec.capabilities.cores,
            memory_mb=n.spec.capabilities.memory_mb,
            tags=frozenset(n.spec.capabilities.tags),
            accelerators=frozenset(n.spec.capabilities.accelerators),
            load=view.load(n.name),
        )
        for n in view.schedulable(skip)
        if realtime <= view.free_realtime(n.name)
    ]


def _solve(
    plan: Plan,
    demands: list[GroupDemand],
    offers: list[NodeOffer],
    view: ClusterView,
    budget: float | None,
    exact_limit: int,
) -> Solution:
    """Exactly (HiGHS) when the problem is small enough, else greedily; the plan notes
    which, and both costs when it solved exactly. A refusal says what the budget left."""
    latency, bandwidth = view.topology.latency, _bandwidth(view)
    try:
        if len(offers) * len(demands) <= exact_limit:
            solution = solve_exact(demands, offers, latency, bandwidth)
            plan.exact_cost = solution.cost
            plan.greedy_cost = solve_greedy(demands, offers, latency, bandwidth).cost
            plan.solver = "exact (HiGHS)"
        else:
            solution = solve_greedy(demands, offers, latency, bandwidth)
            plan.greedy_cost = solution.cost
            plan.solver = "greedy"
    except PlacementError as exc:
        message = str(exc).replace("group ", "fragment ")
        if budget is not None and "latency budget" in message:
            assert plan.latency_budget is not None
            message += (
                f" (the pipeline's budget {_ms(plan.latency_budget)} minus "
                f"{_ms(plan.processing)} of estimated processing leaves {_ms(budget)} "
                "for the network)"
            )
        raise PlacementError(message) from None
    return solution


def _alternatives(
    view: ClusterView, offers: list[NodeOffer], demand: GroupDemand, chosen: str, limit: int = 2
) -> list[tuple[str, float]]:
    out: list[tuple[float, str]] = []
    for o in offers:
        if o.name == chosen or (demand.sites is not None and o.site not in demand.sites):
            continue
        if not (demand.tags <= o.tags and demand.accelerators <= o.accelerators):
            continue
        if o.cores < demand.cores or o.memory_mb < demand.memory_mb:
            continue
        if _cannot_carry(demand, o.site, view):
            continue
        worst = path_seconds(demand, o.site, view.topology.latency, _bandwidth(view))
        if worst is not None:
            out.append((worst, o.name))
    return [(name, worst) for worst, name in sorted(out)[:limit]]


def _global_why(
    topo: Topology, fragment: Fragment, node: str, worst: float, view: ClusterView
) -> str:
    site = view.nodes[node].spec.site
    reach = ""
    if fragment.reach_sites is not None:
        reach = f"; its external systems are reachable from {', '.join(fragment.reach_sites)}"
    if not fragment.input_sites:
        return f"least-loaded live node ({site}); its input is not tied to a site{reach}"
    demand = _demand(fragment, view)
    bandwidth = _bandwidth(view)

    def path(s: str) -> float:
        return (topo.latency(site, s) or 0.0) + transfer_seconds(demand, s, site, bandwidth)

    far = max(fragment.input_sites, key=path)
    shipping = transfer_seconds(demand, far, site, bandwidth)
    why = (
        f"MinMax: {_ms(worst)} from its farthest input site ({far}) of "
        f"{', '.join(fragment.input_sites)}"
    )
    if shipping:
        why += f" ({_ms(worst - shipping)} away, {_ms(shipping)} to ship a batch)"
    if fragment.cloud:
        why += "; pinned to the cloud"
    if _pinned(fragment):
        why += f"; {_needs(fragment)}"
    return why + reach + _link_notes(topo, fragment, site)


def offline_view(topology: Topology) -> ClusterView:
    """Every node of a topology file up and idle: what ``spanflow plan`` plans against."""
    nodes = {n.name: NodeRecord(spec=n, state=NodeState.ALIVE) for n in topology.nodes}
    return ClusterView(topology=topology, nodes=nodes)


def plan_pipeline(
    compiled: CompiledPipeline,
    view: ClusterView,
    *,
    priority: int = 0,
    latency_budget: float | None = None,
) -> Plan:
    return place(
        compiled.fragments,
        view,
        priority=priority,
        latency_budget=latency_budget,
        trigger=compiled.spec.trigger,
        realtime=compiled.spec.all_realtime(),
    )
