"""Planner scale: time to place global groups on 100, 1,000 and 10,000 nodes, exact
(HiGHS MILP) against the greedy heuristic, and the heuristic's optimality gap.

Random but seeded instances: nodes spread over sites (1 site per 20 nodes), site
latencies 5-150 ms, node load and free slots random, groups reading 2-4 sites with
priorities 0-9 and, for a fifth of them, a capability tag. The exact solver runs where
nodes x groups is at most ``EXACT_LIMIT`` (HiGHS needs minutes beyond that).

    .venv/bin/python benchmarks/planner_scale.py
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from spanflow.plan.solver import GroupDemand, NodeOffer, solve_exact, solve_greedy

EXACT_LIMIT = 100_000
CASES = [(100, 100), (1_000, 100), (1_000, 1_000), (10_000, 100), (10_000, 1_000)]


def instance(
    nodes: int, groups: int, seed: int = 1
) -> tuple[list[GroupDemand], list[NodeOffer], object]:
    rng = random.Random(seed)
    sites = [f"s{i}" for i in range(max(2, nodes // 20))]
    table: dict[tuple[str, str], float] = {}
    for i, x in enumerate(sites):
        for y in sites[i + 1 :]:
            table[(x, y)] = table[(y, x)] = rng.uniform(0.005, 0.150)

    def latency(x: str, y: str) -> float | None:
        return 0.0 if x == y else table[(x, y)]

    offers = [
        NodeOffer(
            f"n{i}",
            rng.choice(sites),
            free_slots=rng.randint(1, 4),
            cores=rng.choice((2, 4, 8, 16)),
            memory_mb=rng.choice((2048, 8192, 32768)),
            tags=frozenset({"gpu"}) if rng.random() < 0.1 else frozenset(),
            load=rng.random(),
        )
        for i in range(nodes)
    ]
    demands = [
        GroupDemand(
            f"g{i}",
            tuple(rng.sample(sites, rng.randint(2, min(4, len(sites))))),
            priority=rng.randint(0, 9),
            cores=rng.choice((0, 2, 4)),
            tags=frozenset({"gpu"}) if rng.random() < 0.2 else frozenset(),
        )
        for i in range(groups)
    ]
    return demands, offers, latency


def main() -> None:
    rows = []
    print(f"{'nodes':>7} {'groups':>7} {'greedy s':>9} {'exact s':>9} {'greedy/exact cost':>18}")
    for n_nodes, n_groups in CASES:
        groups, nodes, latency = instance(n_nodes, n_groups)
        greedy = solve_greedy(groups, nodes, latency)  # type: ignore[arg-type]
        row: dict[str, object] = {
            "nodes": n_nodes,
            "groups": n_groups,
            "greedy_s": round(greedy.seconds, 3),
            "greedy_cost": round(greedy.cost, 6),
        }
        if n_nodes * n_groups <= EXACT_LIMIT:
            exact = solve_exact(groups, nodes, latency)  # type: ignore[arg-type]
            row.update(
                exact_s=round(exact.seconds, 3),
                exact_cost=round(exact.cost, 6),
                gap=round(greedy.cost / exact.cost - 1, 5),
            )
        rows.append(row)
        exact_s = f"{row['exact_s']:9.3f}" if "exact_s" in row else f"{'-':>9}"
        gap = f"{1 + float(row['gap']):18.4f}" if "gap" in row else f"{'-':>18}"  # type: ignore[arg-type]
        print(f"{n_nodes:>7,} {n_groups:>7,} {greedy.seconds:9.3f} {exact_s} {gap}")
    out = Path(__file__).parent / "results" / "planner_scale.json"
    out.write_text(
        json.dumps({"measured_at": time.strftime("%Y-%m-%d %H:%M"), "cases": rows}, indent=2) + "\n"
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
