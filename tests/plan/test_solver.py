"""Global-group placement: MinMax latency, capabilities, capacity, priority and budgets,
solved exactly (HiGHS) and greedily, with the same costs."""

from __future__ import annotations

import contextlib
import random

import pytest

from spanflow.plan.placement import PlacementError
from spanflow.plan.solver import Flow, GroupDemand, NodeOffer, solve_exact, solve_greedy

LINKS = {
    frozenset({"a", "cloud"}): 0.030,
    frozenset({"b", "cloud"}): 0.050,
    frozenset({"a", "b"}): 0.060,
}


def latency(x: str, y: str) -> float | None:
    return 0.0 if x == y else LINKS.get(frozenset({x, y}))


NODES = [
    NodeOffer("edge-a", "a", free_slots=2),
    NodeOffer("edge-b", "b", free_slots=2),
    NodeOffer("cloud-1", "cloud", free_slots=2, cores=8, tags=frozenset({"gpu"})),
]
SOLVERS = [solve_exact, solve_greedy]


@pytest.mark.parametrize("solve", SOLVERS)
def test_global_group_goes_where_its_worst_input_is_nearest(solve) -> None:
    # From a: max(0, 60) = 60 ms; from b: 60 ms; from the cloud: max(30, 50) = 50 ms.
    s = solve([GroupDemand("merge", ("a", "b"))], NODES, latency)
    assert s.placement == {"merge": "cloud-1"}
    assert s.worst_latency == {"merge": pytest.approx(0.050)}


@pytest.mark.parametrize("solve", SOLVERS)
def test_a_group_with_one_input_site_stays_there(solve) -> None:
    s = solve([GroupDemand("local", ("b",))], NODES, latency)
    assert s.placement == {"local": "edge-b"} and s.worst_latency["local"] == 0.0


@pytest.mark.parametrize("solve", SOLVERS)
def test_capabilities_and_load_steer_placement(solve) -> None:
    s = solve([GroupDemand("model", ("a",), tags=frozenset({"gpu"}))], NODES, latency)
    assert s.placement == {"model": "cloud-1"}
    twins = [NodeOffer("a1", "a", 1, load=0.9), NodeOffer("a2", "a", 1, load=0.1)]
    assert solve([GroupDemand("g", ("a",))], twins, latency).placement == {"g": "a2"}


@pytest.mark.parametrize("solve", SOLVERS)
def test_higher_priority_gets_the_better_node_when_room_is_short(solve) -> None:
    nodes = [NodeOffer("cloud-1", "cloud", 1), NodeOffer("edge-a", "a", 1)]
    groups = [GroupDemand("low", ("a", "b")), GroupDemand("high", ("a", "b"), priority=50)]
    s = solve(groups, nodes, latency)
    assert s.placement == {"high": "cloud-1", "low": "edge-a"}


@pytest.mark.parametrize("solve", SOLVERS)
def test_violations_say_which_constraint_and_by_how_much(solve) -> None:
    with pytest.raises(PlacementError, match=r"latency budget 40 ms is 10 ms short.*50 ms"):
        solve([GroupDemand("merge", ("a", "b"), latency_budget=0.040)], NODES, latency)
    with pytest.raises(PlacementError, match=r"no node has tags \['tpu'\]"):
        solve([GroupDemand("m", ("a",), tags=frozenset({"tpu"}))], NODES, latency)
    unlinked = r"no capable node is linked to all of \[.a., .mars.\]"
    with pytest.raises(PlacementError, match=unlinked):
        solve([GroupDemand("m", ("a", "mars"))], NODES, latency)
    with pytest.raises(PlacementError):
        solve([GroupDemand(f"g{i}", ("a",)) for i in range(7)], NODES, latency)  # 6 slots


def test_exact_beats_greedy_where_greedy_is_short_sighted() -> None:
    # g1 is cheap anywhere-ish, g2 is only cheap on n1; greedy gives n1 to g1 first.
    costs = {("s1", "x"): 0.001, ("s2", "x"): 0.002, ("s1", "y"): 0.001, ("s2", "y"): 0.010}

    def lat(site: str, src: str) -> float | None:
        return costs.get((site, src))

    nodes = [NodeOffer("n1", "s1", 1), NodeOffer("n2", "s2", 1)]
    groups = [GroupDemand("g1", ("x",)), GroupDemand("g2", ("y",))]
    exact, greedy = solve_exact(groups, nodes, lat), solve_greedy(groups, nodes, lat)
    assert exact.placement == {"g1": "n2", "g2": "n1"}
    assert exact.cost < greedy.cost


def test_exact_is_never_worse_than_greedy_on_random_instances() -> None:
    rng = random.Random(7)
    for _ in range(20):
        sites = [f"s{i}" for i in range(rng.randint(2, 6))]
        table = {frozenset({x, y}): rng.uniform(0.005, 0.2) for x in sites for y in sites if x < y}

        def lat(x: str, y: str, table: dict[frozenset[str], float] = table) -> float | None:
            return 0.0 if x == y else table[frozenset({x, y})]

        nodes = [
            NodeOffer(f"n{i}", rng.choice(sites), rng.randint(1, 3), load=rng.random())
            for i in range(rng.randint(3, 12))
        ]
        total = sum(n.free_slots for n in nodes)
        groups = [
            GroupDemand(
                f"g{i}",
                tuple(rng.sample(sites, rng.randint(1, len(sites)))),
                priority=rng.randint(0, 3),
            )
            for i in range(rng.randint(1, total))
        ]
        exact, greedy = solve_exact(groups, nodes, lat), solve_greedy(groups, nodes, lat)
        assert exact.cost <= greedy.cost + 1e-9
        for s in (exact, greedy):
            used: dict[str, int] = {}
            for node in s.placement.values():
                used[node] = used.get(node, 0) + 1
            assert all(used[n.name] <= n.free_slots for n in nodes if n.name in used)
            assert set(s.placement) == {g.id for g in groups}


def test_many_distinct_tags_are_matched_exactly() -> None:
    tags = [f"t{i}" for i in range(70)]  # more names than one 62-bit mask holds
    nodes = [
        NodeOffer("low", "a", 5, tags=frozenset(tags[:60])),
        NodeOffer("high", "a", 5, tags=frozenset(tags[60:])),
    ]
    groups = [
        GroupDemand("g1", ("a",), tags=frozenset({"t65"})),
        GroupDemand("g2", ("a",), tags=frozenset({"t3", "t59"})),
    ]
    for solve in SOLVERS:
        assert solve(groups, nodes, latency).placement == {"g1": "high", "g2": "low"}
    with pytest.raises(PlacementError, match="no node has tags"):
        solve_greedy([GroupDemand("g3", ("a",), tags=frozenset({"t3", "t65"}))], nodes, latency)


def test_no_solver_places_a_group_where_memory_cores_or_a_link_fall_short() -> None:
    """Random instances: every placement has the cores and memory the group asks for,
    and no link it crosses carries less than what surely flows over it; the exact
    solver is never worse than the greedy one with bandwidth in the cost."""
    rng = random.Random(11)
    placed = 0
    for _ in range(40):
        sites = [f"s{i}" for i in range(rng.randint(2, 5))]
        lat_table = {frozenset({x, y}): rng.uniform(0.005, 0.1) for x in sites for y in sites}
        bw_table = {frozenset({x, y}): rng.choice([1.0, 10.0, 100.0]) for x in sites for y in sites}

        def lat(x: str, y: str, t: dict[frozenset[str], float] = lat_table) -> float | None:
            return 0.0 if x == y else t[frozenset({x, y})]

        def bw(x: str, y: str, t: dict[frozenset[str], float] = bw_table) -> float | None:
            return None if x == y else t[frozenset({x, y})]

        nodes = [
            NodeOffer(
                f"n{i}",
                rng.choice(sites),
                free_slots=rng.randint(1, 3),
                cores=rng.choice([2, 4, 16]),
                memory_mb=rng.choice([2048, 8192, 65536]),
            )
            for i in range(rng.randint(3, 10))
        ]
        groups = []
        for i in range(rng.randint(1, 4)):
            inputs = tuple(rng.sample(sites, rng.randint(1, len(sites))))
            flows = tuple(
                Flow(s, rng.choice([0.5, 5.0, 50.0]), at_most=rng.random() < 0.3) for s in inputs
            )
            groups.append(
                GroupDemand(
                    f"g{i}",
                    inputs,
                    cores=rng.choice([0, 4, 8]),
                    memory_mb=rng.choice([0, 4096, 16384]),
                    flows=flows,
                    batch_seconds=1.0,
                )
            )
        try:
            exact = solve_exact(groups, nodes, lat, bw)
        except PlacementError:
            continue
        greedy = None
        with contextlib.suppress(PlacementError):  # greedy may paint itself into a corner
            greedy = solve_greedy(groups, nodes, lat, bw)
        by_name = {n.name: n for n in nodes}
        for solution in (s for s in (exact, greedy) if s is not None):
            for group in groups:
                node = by_name[solution.placement[group.id]]
                assert node.cores >= group.cores and node.memory_mb >= group.memory_mb
                for flow in group.flows:
                    link = bw(flow.site, node.site)
                    assert flow.at_most or link is None or flow.mbps <= link
            placed += 1
        if greedy is not None:
            assert exact.cost <= greedy.cost + 1e-9
    assert placed > 10  # the instances are not all infeasible
