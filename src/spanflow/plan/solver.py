"""Place global groups on nodes: exact (SciPy MILP / HiGHS) or fast (greedy), one interface.

A *global group* needs data from several sites (the merge of partial aggregates, a
global model). SpanEdge's rule: put it where its worst-case latency to the sites of
its inputs is least (MinMax), subject to capabilities, free slots and the latency
budget. With ``cost[g, n]`` = that worst-case latency from node ``n``, placing groups
(plus the time one batch of its input takes to cross each link, where the
topology's stream rates and link bandwidths tell) is a generalised assignment
problem:

    minimise    Σ_g Σ_n  w_g · (cost[g, n] + ε · load[n]) · x[g, n]
    subject to  Σ_n x[g, n] = 1               every group placed once
                Σ_g slots_g · x[g, n] ≤ free_n  capacity
                x[g, n] = 0 where n lacks g's capabilities (tags, accelerators,
                            cores, memory), breaks its budget, or sits behind
                            a link that cannot carry g's input

``w_g`` grows with priority, so when capacity is short the higher-priority group gets
the better node. :func:`solve_exact` hands this to HiGHS; :func:`solve_greedy`
places groups by priority, each on its cheapest feasible node. Both return a
:class:`Solution` with the same cost definition, so their costs compare directly.
When a group has no feasible node, :class:`PlacementError`'s message says which
constraint failed and by how much.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from spanflow.plan.placement import PlacementError

LOAD_WEIGHT = 1e-3
"""ε: seconds of latency one unit of node load is worth (breaks ties toward idle nodes)."""


@dataclass(frozen=True)
class Flow:
    """What a group pulls from one input site (megabits per second), estimated from the
    declared stream rates; ``at_most`` when a filter on the way may drop records."""

    site: str
    mbps: float
    at_most: bool = False


@dataclass(frozen=True)
class GroupDemand:
    id: str
    input_sites: tuple[str, ...]
    priority: int = 0
    slots: int = 1
    cores: int = 0
    memory_mb: int = 0
    tags: frozenset[str] = frozenset()
    accelerators: frozenset[str] = frozenset()
    latency_budget: float | None = None
    """Seconds the worst input path may take (None: no limit)."""
    sites: frozenset[str] | None = None
    """Sites it may run in (None: any), e.g. the cloud sites for a cloud pin."""
    flows: tuple[Flow, ...] = ()
    """What it pulls from its input sites, where the topology's stream rates tell."""
    batch_seconds: float = 0.0
    """How much data one of its batches ships (its trigger): a batch's transfer time
    over a link is ``batch_seconds × flow / bandwidth``."""


@dataclass(frozen=True)
class NodeOffer:
    name: str
    site: str
    free_slots: int
    slots: int | None = None
    """All its slots (None: no limit); a group never needs more than these, so an idle
    node can take a group that asks for more (see ``Capabilities.slots_for``)."""
    cores: int = 1
    memory_mb: int = 1024
    tags: frozenset[str] = frozenset()
    accelerators: frozenset[str] = frozenset()
    load: float = 0.0
    """Share of the node already in use, 0..1."""


Latency = Callable[[str, str], float | None]
"""One-way latency between two sites in seconds; None when they are not connected."""

Bandwidth = Callable[[str, str], float | None]
"""Megabits per second between two sites; None within a site or for no limit."""


def no_limit(a: str, b: str) -> float | None:
    return None


def transfer_seconds(demand: GroupDemand, source: str, site: str, bandwidth: Bandwidth) -> float:
    """Seconds one batch of what ``demand`` pulls from ``source`` takes to cross to
    ``site`` (0 within a site, over an unlimited link or when nothing is estimated)."""
    mbps = bandwidth(source, site)
    flow = sum(f.mbps for f in demand.flows if f.site == source)
    if source == site or mbps is None or not flow:
        return 0.0
    return demand.batch_seconds * flow / mbps


def overfull_links(
    demand: GroupDemand, site: str, bandwidth: Bandwidth
) -> list[tuple[Flow, float]]:
    """The flows that would ship more than their link to ``site`` carries, with that
    link's megabits per second."""
    out = []
    for flow in demand.flows:
        mbps = bandwidth(flow.site, site)
        if flow.site != site and mbps is not None and flow.mbps > mbps:
            out.append((flow, mbps))
    return out


def path_seconds(
    demand: GroupDemand, site: str, latency: Latency, bandwidth: Bandwidth
) -> float | None:
    """Worst seconds from ``demand``'s input sites to ``site``: one-way latency plus a
    batch's transfer time (None when an input site is not linked)."""
    worst = 0.0
    for source in demand.input_sites:
        one_way = latency(site, source)
        if one_way is None:
            return None
        worst = max(worst, one_way + transfer_seconds(demand, source, site, bandwidth))
    return worst


@dataclass
class Solution:
    placement: dict[str, str]
    cost: float
    worst_latency: dict[str, float]
    method: str
    seconds: float
    notes: dict[str, str] = field(default_factory=dict)


def _capacity(node: NodeOffer) -> int:
    return np.iinfo(np.int64).max if node.slots is None else node.slots


def _weight(priority: int) -> float:
    return 1.0 + priority / 10.0


class _Costs:
    """Feasibility and cost of every (group, node) pair, computed per site."""

    def __init__(
        self,
        groups: Sequence[GroupDemand],
        nodes: Sequence[NodeOffer],
        latency: Latency,
        bandwidth: Bandwidth = no_limit,
    ) -> None:
        self.groups, self.nodes = list(groups), list(nodes)
        self.bandwidth = bandwidth
        sites = sorted({n.site for n in nodes})
        site_index = {s: i for i, s in enumerate(sites)}
        node_site = np.array([site_index[n.site] for n in nodes], dtype=np.int64)
        # worst[g, s]: worst latency (+ a batch's transfer) from site s to g's input
        # sites (inf if unreachable); carried[g, s]: every link to s carries g's flows
        worst = np.zeros((len(groups), len(sites)))
        carried = np.ones((len(groups), len(sites)), dtype=bool)
        for gi, g in enumerate(groups):
            for si, s in enumerate(sites):
                path = path_seconds(g, s, latency, bandwidth)
                worst[gi, si] = np.inf if path is None else path
                if g.flows:
                    over = overfull_links(g, s, bandwidth)
                    carried[gi, si] = not any(not flow.at_most for flow, _ in over)
        empty = np.zeros((len(groups), 0))
        self.worst = worst[:, node_site] if len(nodes) else empty
        self.carried = carried[:, node_site] if len(nodes) else empty.astype(bool)
        capable = self._capable(groups, nodes)
        budget = np.array(
            [np.inf if g.latency_budget is None else g.latency_budget for g in groups]
        )
        self.capable = capable
        self.capacity = np.array([_capacity(n) for n in nodes], dtype=np.int64)
        self.feasible = (
            capable & self.carried & np.isfinite(self.worst) & (self.worst <= budget[:, None])
        )
        load = np.array([n.load for n in nodes])
        weights = np.array([_weight(g.priority) for g in groups])
        self.cost = weights[:, None] * (self.worst + LOAD_WEIGHT * load[None, :])

    @staticmethod
    def _capable(groups: Sequence[GroupDemand], nodes: Sequence[NodeOffer]) -> np.ndarray:
        """capable[g, n], vectorised: 1,000 groups x 10,000 nodes in well under a second."""

        def column(values: list[int]) -> np.ndarray:
            return np.array(values, dtype=np.int64)

        ok = column([n.cores for n in nodes])[None, :] >= column([g.cores for g in groups])[:, None]
        ok &= (
            column([n.memory_mb for n in nodes])[None, :]
            >= column([g.memory_mb for g in groups])[:, None]
        )
        free = column([n.free_slots for n in nodes])[None, :]
        # free >= min(need, all slots), without a groups-by-nodes matrix of integers
        ok &= (free >= column([g.slots for g in groups])[:, None]) | (
            (free >= column([_capacity(n) for n in nodes])[None, :]) & (free > 0)
        )
        wanted = sorted(
            {f"t:{t}" for g in groups for t in g.tags}
            | {f"a:{a}" for g in groups for a in g.accelerators}
        )
        for start in range(0, len(wanted), 62):  # bit masks of at most 62 names at a time
            bit = {name: 1 << i for i, name in enumerate(wanted[start : start + 62])}

            def mask(tags: frozenset[str], accs: frozenset[str], bit: dict[str, int] = bit) -> int:
                return sum(bit.get(f"t:{t}", 0) for t in tags) + sum(
                    bit.get(f"a:{a}", 0) for a in accs
                )

            have = column([mask(n.tags, n.accelerators) for n in nodes])
            need = column([mask(g.tags, g.accelerators) for g in groups])
            ok &= (have[None, :] & need[:, None]) == need[:, None]
        node_sites = np.array([n.site for n in nodes], dtype=object)
        for gi, g in enumerate(groups):
            if g.sites is not None:
                ok[gi] &= np.isin(node_sites, list(g.sites))
        return ok

    def explain_infeasible(self, gi: int) -> str:
        g = self.groups[gi]
        if not self.nodes:
            return f"group {g.id}: no live node"
        if not self.capable[gi].any():
            fitting = [
                n
                for n in self.nodes
                if g.tags <= n.tags
                and g.accelerators <= n.accelerators
                and n.cores >= g.cores
                and n.memory_mb >= g.memory_mb
                and (g.sites is None or n.site in g.sites)
            ]
            if fitting:
                names = ", ".join(n.name for n in fitting[:5])
                return f"group {g.id}: every node it could run on is full ({names})"
            wants = []
            if g.tags:
                wants.append(f"tags {sorted(g.tags)}")
            if g.accelerators:
                wants.append(f"accelerators {sorted(g.accelerators)}")
            if g.cores:
                wants.append(f"{g.cores} cores")
            if g.memory_mb:
                wants.append(f"{g.memory_mb} MiB")
            where = f" in {sorted(g.sites)}" if g.sites is not None else ""
            if not wants:
                return f"group {g.id}: no live node at the sites it may run in{where}"
            return f"group {g.id}: no node{where} has {', '.join(wants)}"
        reachable = self.worst[gi][self.capable[gi]]
        best = float(reachable.min())
        if not np.isfinite(best):
            return f"group {g.id}: no capable node is linked to all of {list(g.input_sites)}"
        if not self.carried[gi][self.capable[gi]].any():
            return f"group {g.id}: {self._overfull(gi)}"
        reachable = self.worst[gi][self.capable[gi] & self.carried[gi]]
        best = float(reachable.min())
        assert g.latency_budget is not None
        return (
            f"group {g.id}: latency budget {g.latency_budget * 1000:.0f} ms is "
            f"{(best - g.latency_budget) * 1000:.0f} ms short: the best capable node is "
            f"{best * 1000:.0f} ms from its farthest input"
        )

    def _overfull(self, gi: int) -> str:
        """Why no link can carry group ``gi``'s input, for the nearest capable node."""
        g = self.groups[gi]
        capable = np.flatnonzero(self.capable[gi])
        node = self.nodes[int(capable[np.argmin(self.worst[gi][capable])])]
        return "; ".join(
            f"the link {flow.site}–{node.site} carries {mbps:g} Mbit/s, but what it pulls "
            f"from {flow.site} is {flow.mbps:.1f} Mbit/s at the declared stream rates"
            for flow, mbps in overfull_links(g, node.site, self.bandwidth)
            if not flow.at_most
        )

    def check(self) -> None:
        problems = [
            self.explain_infeasible(gi)
            for gi in range(len(self.groups))
            if not self.feasible[gi].any()
        ]
        if problems:
            raise PlacementError("; ".join(problems))

    def need(self, gi: int) -> np.ndarray:
        """Slots group ``gi`` takes on each node."""
        return np.maximum(1, np.minimum(self.groups[gi].slots, self.capacity))

    def solution(self, choice: dict[int, int], method: str, started: float) -> Solution:
        placement = {self.groups[g].id: self.nodes[n].name for g, n in choice.items()}
        worst = {self.groups[g].id: float(self.worst[g, n]) for g, n in choice.items()}
        cost = float(sum(self.cost[g, n] for g, n in choice.items()))
        return Solution(placement, cost, worst, method, time.perf_counter() - started)


def solve_greedy(
    groups: Sequence[GroupDemand],
    nodes: Sequence[NodeOffer],
    latency: Latency,
    bandwidth: Bandwidth = no_limit,
) -> Solution:
    """Highest priority first (then the most constrained); each on its cheapest feasible
    node that still has room."""
    started = time.perf_counter()
    c = _Costs(groups, nodes, latency, bandwidth)
    c.check()
    free = np.array([n.free_slots for n in nodes], dtype=np.int64)
    order = sorted(
        range(len(groups)), key=lambda gi: (-groups[gi].priority, int(c.feasible[gi].sum()), gi)
    )
    choice: dict[int, int] = {}
    for gi in order:
        need = c.need(gi)
        ok = c.feasible[gi] & (free >= need)
        if not ok.any():
            raise PlacementError(
                f"group {groups[gi].id}: every feasible node is full "
                "(higher-priority groups took the room)"
            )
        costs = np.where(ok, c.cost[gi], np.inf)
        ni = int(np.argmin(costs))
        choice[gi] = ni
        free[ni] -= need[ni]
    return c.solution(choice, "greedy", started)


def solve_exact(
    groups: Sequence[GroupDemand],
    nodes: Sequence[NodeOffer],
    latency: Latency,
    bandwidth: Bandwidth = no_limit,
    *,
    time_limit: float = 30.0,
) -> Solution:
    """The optimum of the assignment problem above, by HiGHS through ``scipy.optimize.milp``."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    started = time.perf_counter()
    c = _Costs(groups, nodes, latency, bandwidth)
    c.check()
    pairs = np.argwhere(c.feasible)  # one variable per feasible (group, node)
    nvar = len(pairs)
    objective = c.cost[pairs[:, 0], pairs[:, 1]]
    var = np.arange(nvar)
    once = coo_matrix((np.ones(nvar), (pairs[:, 0], var)), shape=(len(groups), nvar))
    wanted = np.array([groups[g].slots for g in pairs[:, 0]], dtype=np.int64)
    slots = np.maximum(1, np.minimum(wanted, c.capacity[pairs[:, 1]])).astype(float)
    room = coo_matrix((slots, (pairs[:, 1], var)), shape=(len(nodes), nvar))
    free = np.array([n.free_slots for n in nodes], dtype=float)
    result = milp(
        objective,
        integrality=np.ones(nvar),
        bounds=Bounds(0, 1),
        constraints=[
            LinearConstraint(once.tocsr(), 1, 1),
            LinearConstraint(room.tocsr(), -np.inf, free),
        ],
        options={"time_limit": time_limit},
    )
    if result.x is None:
        raise PlacementError(f"no placement fits every group's capacity at once ({result.message})")
    chosen = pairs[result.x > 0.5]
    choice = {int(g): int(n) for g, n in chosen}
    solution = c.solution(choice, "exact", started)
    if result.status != 0:
        solution.notes["solver"] = str(result.message)
    return solution
