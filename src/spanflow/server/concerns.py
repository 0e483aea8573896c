"""The dashboard's health strip: what an operator should look at now, worst first.

Pure: it reads the statuses every view shows (one source of truth for health) and the
recent samples of each fragment, and says what is red (a node silent or dead, a
pipeline degraded or failing, queries restarting) and what is amber (queries behind
their trigger, dead letters rising, a stream filling up, a latency budget exceeded,
a node running on what it last knew, sites a
pipeline's plan does not follow).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from spanflow.protocol.metrics import FragmentRuntime
from spanflow.protocol.rest import (
    Concern,
    FragmentSample,
    NodeStatus,
    PipelineStatus,
)

Level = Literal["red", "amber"]
RECENT = 60.0
"""Seconds over which rising counters (dead letters, restarts) are judged."""
BEHIND = 1.0
"""A query whose last batch took this many trigger intervals or more falls behind."""
COLD_SECONDS = 5.0
"""A hot standby replica further behind its peer than this many seconds of input is
not hot: were the peer to die, the output would stall while it caught up."""

NODE_LEVEL = {"dead": "red", "suspect": "red", "fenced": "red", "last-known": "amber",
              "draining": "amber"}  # fmt: skip


def concerns(
    nodes: Sequence[NodeStatus],
    pipelines: Sequence[PipelineStatus],
    samples: Mapping[str, Sequence[FragmentSample]],
    now: float,
) -> list[Concern]:
    """Everything not well, red before amber."""
    found = [*_nodes(nodes), *_pipelines(pipelines), *_rising(pipelines, samples, now)]
    return sorted(found, key=lambda c: c.level != "red")


def _nodes(nodes: Sequence[NodeStatus]) -> list[Concern]:
    out = []
    for n in nodes:
        level = NODE_LEVEL.get(n.health)
        if level is not None:
            heard = f", last heard {n.last_heartbeat_s:.0f} s ago" if n.last_heartbeat_s else ""
            out.append(Concern(level=level, what=f"node {n.name}", reason=f"{n.health}{heard}"))  # type: ignore[arg-type]
        out += [Concern(level="amber", what=f"node {n.name}", reason=w) for w in n.warnings]
    return out


def _pipelines(pipelines: Sequence[PipelineStatus]) -> list[Concern]:
    out = []
    for p in pipelines:
        what = f"pipeline {p.name}"
        if p.health == "degraded":
            down = [f"{f.id} {f.status}" for f in p.fragments if f.status != "running"]
            out.append(Concern(level="red", what=what, reason="degraded: " + ", ".join(down)))
        elif p.state.value == "failed":
            out.append(Concern(level="red", what=what, reason=f"failed: {p.reason}"))
        if p.over_latency_budget:
            out.append(
                Concern(
                    level="amber",
                    what=what,
                    reason=f"latency estimate {p.latency_estimate_s} s over its budget "
                    f"{p.latency_budget} s",
                )
            )
        out += _behind(p)
        out += _cold_standbys(p)
        out += _sites_behind(p)
    return out


def _sites_behind(p: PipelineStatus) -> list[Concern]:
    """A site declared after the pipeline was placed is not read; a removed one is
    still planned (docs/cluster.md#sites-that-join-or-leave-after-a-pipeline-is-placed)."""
    b = p.sites_behind
    if b is None:
        return []
    parts = [f"site {s} joined after it was placed: not read" for s in b.joined]
    parts += [f"site {s} was removed: still in its plan" for s in b.left]
    return [Concern(level="amber", what=f"pipeline {p.name}", reason=r) for r in parts]


def _cold_standbys(p: PipelineStatus) -> list[Concern]:
    """Running replicas of one fragment whose input lag exceeds their peer's by more
    than :data:`COLD_SECONDS` of its input rate (docs/cluster.md#hot-standby)."""
    groups: dict[str, list[FragmentRuntime]] = {}
    for f in p.fragments:
        if f.status == "running" and f.runtime is not None:
            base = f.id.rsplit(".r", 1)[0] if f.replica else f.id
            groups.setdefault(base, []).append(f.runtime.model_copy(update={"fragment_id": f.id}))
    out = []
    for replicas in groups.values():
        ahead = min(replicas, key=lambda r: r.lag)
        rate = ahead.input_rows_per_s
        for r in replicas:
            behind = r.lag - ahead.lag
            if r is ahead or rate <= 0 or behind / rate < COLD_SECONDS:
                continue
            out.append(
                Concern(
                    level="amber",
                    what=f"fragment {r.fragment_id}",
                    reason=f"standby not hot: {behind} messages ({behind / rate:.0f} s of input) "
                    f"behind {ahead.fragment_id}; were {ahead.fragment_id}'s node to die, the "
                    "output would stall while it caught up",
                )
            )
    return out


def _behind(p: PipelineStatus) -> list[Concern]:
    """Fragments whose queries' last batches took longer than their trigger
    (backpressure): one concern per fragment, naming its slowest query."""
    out = []
    for f in p.fragments:
        if f.status != "running" or f.runtime is None:
            continue
        timed = [
            (m.last_batch_seconds / m.trigger_seconds, query, m)
            for query, m in sorted(f.runtime.metrics.items())
            if not m.realtime and m.trigger_seconds > 0
        ]
        behind = [t for t in timed if t[0] >= BEHIND]
        if not behind:
            continue
        ratio, query, m = max(behind, key=lambda t: t[0])
        out.append(
            Concern(
                level="amber",
                what=f"fragment {f.id}",
                reason=f"{len(behind)} of {len(timed)} queries behind their trigger (slowest "
                f"{query}: last batch {m.last_batch_seconds:.1f} s for a "
                f"{m.trigger_seconds:g} s trigger, {ratio:.1f}×)",
            )
        )
    return out


def _rising(
    pipelines: Sequence[PipelineStatus],
    samples: Mapping[str, Sequence[FragmentSample]],
    now: float,
) -> list[Concern]:
    """Dead letters and restarts that grew over the last :data:`RECENT` seconds."""
    out = []
    for p in pipelines:
        for f in p.fragments:
            recent = [s for s in samples.get(f.id, ()) if s.at >= now - RECENT]
            if len(recent) < 2:
                continue
            first, last = recent[0], recent[-1]
            rises: tuple[tuple[Level, int, str], ...] = (
                ("red", last.restarts - first.restarts, "query restarts"),
                ("amber", last.dead_letters - first.dead_letters, "dead letters"),
            )
            out += [
                Concern(
                    level=level, what=f"fragment {f.id}", reason=f"{n} {what} in the last minute"
                )
                for level, n, what in rises
                if n > 0
            ]
    return out
