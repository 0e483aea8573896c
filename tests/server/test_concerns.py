"""The health strip's concerns, from statuses and samples (no cluster needed)."""

from __future__ import annotations

from spanflow.protocol.metrics import FragmentRuntime, QueryMetrics
from spanflow.protocol.rest import (
    FragmentSample,
    FragmentStatus,
    NodeStatus,
    PipelineStatus,
    SitesBehind,
)
from spanflow.server.concerns import concerns
from spanflow.spec.cluster import PipelineState


def node(name: str, health: str, warnings: tuple[str, ...] = ()) -> NodeStatus:
    return NodeStatus.model_construct(
        name=name, health=health, last_heartbeat_s=4.0, warnings=list(warnings)
    )


def fragment(fid: str, status: str, batch: float = 0.2, trigger: float = 1.0) -> FragmentStatus:
    metrics = {"out": QueryMetrics(trigger_seconds=trigger, last_batch_seconds=batch)}
    rt = FragmentRuntime(fragment_id=fid, epoch=1, status="running", metrics=metrics)
    return FragmentStatus.model_construct(id=fid, status=status, runtime=rt)


def pipeline(
    name: str, health: str, *fragments: FragmentStatus, over: bool = False
) -> PipelineStatus:
    return PipelineStatus.model_construct(
        name=name,
        state=PipelineState.RUNNING,
        health=health,
        reason="",
        fragments=list(fragments),
        over_latency_budget=over,
        latency_estimate_s=3.0,
        latency_budget=2.0,
    )


def sample(at: float, dead: int = 0, restarts: int = 0) -> FragmentSample:
    return FragmentSample.model_construct(at=at, dead_letters=dead, restarts=restarts)


def test_all_well_is_no_concern() -> None:
    p = pipeline("p", "healthy", fragment("p.f0", "running"))
    history = {"p.f0": [sample(100.0), sample(130.0)]}
    assert concerns([node("a", "alive")], [p], history, now=130.0) == []


def test_red_before_amber_with_their_reasons() -> None:
    nodes = [node("a", "dead"), node("b", "alive", ("stream S is 90 % full",))]
    p = pipeline("p", "degraded", fragment("p.f0", "unreachable"), over=True)
    q = pipeline("q", "healthy", fragment("q.f0", "running", batch=2.4, trigger=1.0))
    history = {"q.f0": [sample(50.0), sample(80.0, dead=3), sample(110.0, dead=5, restarts=1)]}
    found = [(c.level, c.what, c.reason) for c in concerns(nodes, [p, q], history, now=110.0)]
    assert found[:3] == [
        ("red", "node a", "dead, last heard 4 s ago"),
        ("red", "pipeline p", "degraded: p.f0 unreachable"),
        ("red", "fragment q.f0", "1 query restarts in the last minute"),
    ]
    assert set(found[3:]) == {
        ("amber", "node b", "stream S is 90 % full"),
        ("amber", "pipeline p", "latency estimate 3.0 s over its budget 2.0 s"),
        (
            "amber",
            "fragment q.f0",
            "1 of 1 queries behind their trigger (slowest out: last batch 2.4 s for a 1 s "
            "trigger, 2.4×)",
        ),
        ("amber", "fragment q.f0", "5 dead letters in the last minute"),
    }
    # counters that stopped rising a minute ago are no concern any more
    later = concerns([], [q], history, now=175.0)
    assert [c.reason[:31] for c in later] == ["1 of 1 queries behind their tri"]


def replica(fid: str, n: int, lag: int, rate: float = 100.0) -> FragmentStatus:
    rt = FragmentRuntime(fragment_id=fid, epoch=1, status="running", lag=lag, input_rows_per_s=rate)
    return FragmentStatus.model_construct(id=fid, replica=n, status="running", runtime=rt)


def test_a_standby_replica_far_behind_its_peer_is_not_hot() -> None:
    p = pipeline("p", "healthy", replica("p.f0", 0, lag=40), replica("p.f0.r1", 1, lag=940))
    found = [(c.level, c.what, c.reason) for c in concerns([], [p], {}, now=0.0)]
    assert found == [
        (
            "amber",
            "fragment p.f0.r1",
            "standby not hot: 900 messages (9 s of input) behind p.f0; were p.f0's node to "
            "die, the output would stall while it caught up",
        )
    ]
    # replicas a batch or two apart are hot; so is the original behind its replica
    close = pipeline("p", "healthy", replica("p.f0", 0, lag=40), replica("p.f0.r1", 1, lag=240))
    assert concerns([], [close], {}, now=0.0) == []
    flipped = pipeline("p", "healthy", replica("p.f0", 0, lag=900), replica("p.f0.r1", 1, lag=0))
    assert [c.what for c in concerns([], [flipped], {}, now=0.0)] == ["fragment p.f0"]


def test_sites_a_pipelines_plan_does_not_follow_are_amber() -> None:
    p = pipeline("p", "healthy", fragment("p.f0", "running"))
    p.sites_behind = SitesBehind(joined=["edge-c"], left=["edge-b"])
    found = [(c.level, c.what, c.reason) for c in concerns([], [p], {}, now=1.0)]
    assert found == [
        ("amber", "pipeline p", "site edge-c joined after it was placed: not read"),
        ("amber", "pipeline p", "site edge-b was removed: still in its plan"),
    ]
