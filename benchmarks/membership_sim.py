"""Membership: how fast a dead member is known, how rarely a live one is wrongly declared
dead, and how fast the group agrees — the real protocol over a simulated network.

Every member is the real :class:`spanflow.runtime.membership.protocol.Membership`
(LAN profile); the network (``memory_network.py``) loses datagrams with the given
probability, delays them 0.2-2 ms, and can be partitioned; time is simulated, so the
figures do not depend on this machine's speed. For each group size (10, 100, 1,000)
and loss rate (0 %, 5 %, 10 %), with Lifeguard and without (classic SWIM: a fixed
suspicion timeout, no local health, no nacks — the baseline, same run, same seeds):

* **bootstrap** — every member joins through three seeds within one second; the time
  until every member sees every other alive.
* **false positives** — ``--steady`` seconds with nobody failing: live members
  declared dead (the goal: none at 5 % loss), and suspicions raised (later refuted).
* **kills** — members SIGKILLed one after another: *suspected* (the first member to
  suspect it), *declared dead* (the first to declare it), *everyone knows* (every
  live member has it dead). Goals (issue 17): declared dead ≤ 2 s, everyone ≤ 5 s
  at 1,000 members.
* **slow member** (10 and 100 members) — one member's packets are held for 1 s (a
  CPU-starved agent) for ``--steady`` seconds: healthy members it wrongly has
  declared dead. This is the failure Lifeguard exists for.
* **partition** (10 and 100 members) — the group split in half for 5 s, then healed:
  the time until every member sees every other alive again.

Run: ``.venv/bin/python benchmarks/membership_sim.py [--sizes 10,100,1000]
[--loss 0,0.05,0.1] [--steady 30] [--seed 1]``. Figures go to
``benchmarks/results/membership_sim.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spanflow.runtime.membership.config import MembershipConfig
from spanflow.runtime.membership.memory_network import MemoryNetwork
from spanflow.runtime.membership.messages import State
from spanflow.runtime.membership.protocol import Change
from spanflow.security.keyring import OVERHEAD, Keyring, new_key

RESULTS = Path(__file__).resolve().parent / "results"
SEEDS = 3
KILLS = {10: 3, 100: 5, 1000: 3}
SCENARIO_LIMIT = 60.0
"""Simulated seconds a phase may take before it is reported as not converged."""


@dataclass
class Views:
    """Every member's view, maintained from the changes they report."""

    alive_known: dict[str, int] = field(default_factory=dict)
    states: dict[tuple[str, str], State] = field(default_factory=dict)
    first: dict[tuple[str, State], float] = field(default_factory=dict)
    dead_verdicts: list[tuple[float, str, str]] = field(default_factory=list)
    suspicions: list[tuple[float, str, str]] = field(default_factory=list)

    def observe(self, source: str, changes: list[Change]) -> None:
        for change in changes:
            key = (source, change.node)
            before = self.states.get(key)
            self.states[key] = change.state
            if before != State.ALIVE and change.state == State.ALIVE:
                self.alive_known[source] = self.alive_known.get(source, 0) + 1
            elif before == State.ALIVE and change.state != State.ALIVE:
                self.alive_known[source] -= 1
            self.first.setdefault((change.node, change.state), change.at)
            if change.state == State.DEAD:
                self.dead_verdicts.append((change.at, source, change.node))
            elif change.state == State.SUSPECT:
                self.suspicions.append((change.at, source, change.node))


def summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "max": round(ordered[-1], 3),
        "mean": round(statistics.fmean(ordered), 3),
    }


class Scenario:
    """One group on one simulated network."""

    def __init__(
        self, size: int, loss: float, lifeguard: bool, seed: int, sealed: bool = False
    ) -> None:
        self.size = size
        self.config = MembershipConfig.lan().replace(lifeguard=lifeguard)
        keyring = None
        if sealed:  # as GossipService seals: AES-GCM, a smaller budget per datagram
            keyring = Keyring((new_key(),))
            self.config = self.config.replace(packet_budget=self.config.packet_budget - OVERHEAD)
        self.net = MemoryNetwork(seed=seed, loss=loss, wire=size <= 100, keyring=keyring)
        self.views = Views()
        self.net.observers.append(self.views.observe)
        self.names = [f"m{i:04d}" for i in range(size)]
        self.killed: set[str] = set()

    def everyone_sees_everyone(self) -> bool:
        live = [n for n in self.names if n not in self.killed]
        target = len(live) - 1
        return all(self.views.alive_known.get(n, 0) >= target for n in live)

    def bootstrap(self) -> float | None:
        seeds = self.names[:SEEDS]
        self.net.add(seeds[0], self.config)
        starts = sorted((self.net.rng.uniform(0, 1.0), name) for name in self.names[1:])
        for at, name in starts:
            self.net.run_until(at)
            self.net.add(name, self.config, seeds=seeds)
        last_join = self.net.now
        done = self.net.run_while(
            lambda: not self.everyone_sees_everyone(), step=0.05, limit=SCENARIO_LIMIT
        )
        return round(self.net.now - last_join, 3) if done else None

    def steady(self, seconds: float) -> dict[str, int]:
        start = self.net.now
        self.net.run_until(start + seconds)
        return self.false_verdicts(start)

    def false_verdicts(self, since: float) -> dict[str, int]:
        dead = [v for v in self.views.dead_verdicts if v[0] >= since and v[2] not in self.killed]
        suspected = [v for v in self.views.suspicions if v[0] >= since and v[2] not in self.killed]
        return {
            "false_dead": len(dead),
            "members_falsely_dead": len({v[2] for v in dead}),
            "false_suspicions": len(suspected),
        }

    def kill(self, victim: str) -> dict[str, float | None]:
        start = self.net.now
        self.net.kill(victim)
        self.killed.add(victim)
        live = [n for n in self.names if n not in self.killed]

        def somebody_unaware() -> bool:
            return any(
                self.views.states.get((n, victim)) not in (State.DEAD, State.LEFT) for n in live
            )

        done = self.net.run_while(somebody_unaware, step=0.05, limit=SCENARIO_LIMIT)

        def since(state: State) -> float | None:
            at = self.views.first.get((victim, state))
            return None if at is None or at < start else round(at - start, 3)

        return {
            "suspected": since(State.SUSPECT),
            "declared_dead": since(State.DEAD),
            "everyone_knows": round(self.net.now - start, 3) if done else None,
        }

    def slow_member(self, seconds: float) -> dict[str, int]:
        slow = self.names[-1]
        self.net.set_slow(slow, 1.0)
        start = self.net.now
        self.net.run_until(start + seconds)
        self.net.set_slow(slow, 0.0)
        healthy_dead = [
            v
            for v in self.views.dead_verdicts
            if v[0] >= start and v[2] != slow and v[2] not in self.killed
        ]
        return {
            "healthy_declared_dead": len(healthy_dead),
            "by_the_slow_member": sum(1 for v in healthy_dead if v[1] == slow),
            "slow_member_declared_dead": sum(
                1 for v in self.views.dead_verdicts if v[0] >= start and v[2] == slow
            ),
        }

    def partition(self, seconds: float) -> float | None:
        live = [n for n in self.names if n not in self.killed]
        half = len(live) // 2
        self.net.partition(set(live[:half]), set(live[half:]))
        self.net.run_until(self.net.now + seconds)
        self.net.heal()
        start = self.net.now
        done = self.net.run_while(
            lambda: not self.everyone_sees_everyone(), step=0.05, limit=SCENARIO_LIMIT
        )
        return round(self.net.now - start, 3) if done else None


def run_one(
    size: int, loss: float, lifeguard: bool, seed: int, steady: float, sealed: bool = False
) -> dict[str, Any]:
    began = time.perf_counter()
    scenario = Scenario(size, loss, lifeguard, seed, sealed)
    result: dict[str, Any] = {
        "members": size,
        "loss": loss,
        "lifeguard": lifeguard,
        "sealed": sealed,
    }
    result["bootstrap_s"] = scenario.bootstrap()
    result["steady"] = scenario.steady(steady)
    kills = [scenario.kill(name) for name in scenario.names[SEEDS : SEEDS + KILLS.get(size, 3)]]
    for key in ("suspected", "declared_dead", "everyone_knows"):
        values = [k[key] for k in kills if k[key] is not None]
        result[f"{key}_s"] = summary(values)
    result["kills"] = len(kills)
    result["kills_not_converged"] = sum(1 for k in kills if k["everyone_knows"] is None)
    if size <= 100:
        result["slow_member"] = scenario.slow_member(steady)
        scenario.net.run_until(scenario.net.now + 5.0)
        result["partition_heal_s"] = scenario.partition(5.0)
    result["packets"] = scenario.net.stats.sent
    result["simulated_s"] = round(scenario.net.now, 1)
    result["wall_s"] = round(time.perf_counter() - began, 1)
    return result


def show(result: dict[str, Any]) -> None:
    def p(summary_: dict[str, float] | None, key: str = "p50") -> str:
        return "  -  " if summary_ is None else f"{summary_[key]:5.2f}"

    slow = result.get("slow_member", {})
    lifeguard = "on " if result["lifeguard"] else "off"
    if result.get("sealed"):
        lifeguard = "on+sealed"
    boot = result["bootstrap_s"] if result["bootstrap_s"] is not None else "-"
    dead, everyone = result["declared_dead_s"], result["everyone_knows_s"]
    steady = result["steady"]
    print(
        f"{result['members']:>5} {result['loss'] * 100:>4.0f}% {lifeguard}"
        f" | boot {boot:>5}"
        f" | suspect {p(result['suspected_s'])} dead {p(dead)}/{p(dead, 'max')}"
        f" all {p(everyone)}/{p(everyone, 'max')}"
        f" | false dead {steady['false_dead']:>3} susp {steady['false_suspicions']:>4}"
        f" | slow: healthy dead {slow.get('healthy_declared_dead', '-')!s:>3}"
        f" | heal {result.get('partition_heal_s', '-')!s:>5}"
        f" | {result['wall_s']:>5}s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--loss", default="0,0.05,0.1")
    parser.add_argument(
        "--steady", type=float, default=30.0, help="simulated seconds without failures"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--sealed",
        action="store_true",
        help="also run every Lifeguard case with sealed gossip (AES-GCM), same seeds",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    losses = [float(v) for v in args.loss.split(",")]
    config = MembershipConfig.lan()
    print(
        "members loss lifeguard | bootstrap s | kill: first suspect, first dead p50/max,"
        " everyone p50/max (s) | steady false verdicts | slow member | partition heal s | wall"
    )
    results = []
    for size in sizes:
        for loss in losses:
            cases = [(True, False), (False, False)] + ([(True, True)] if args.sealed else [])
            for lifeguard, sealed in cases:
                result = run_one(size, loss, lifeguard, args.seed, args.steady, sealed)
                show(result)
                results.append(result)
    report = {
        "benchmark": "membership_sim",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "profile": "lan",
        "config": {k: v for k, v in config.__dict__.items()},
        "steady_s": args.steady,
        "seed": args.seed,
        "baseline": "lifeguard=false: classic SWIM on the same network, seeds and kills",
        "results": results,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("membership_sim_sealed.json" if args.sealed else "membership_sim.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
