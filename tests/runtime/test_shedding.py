"""The shedding policy: when, what and where (pure: time is an argument)."""

from __future__ import annotations

from spanflow.runtime.load import FragmentLoad, load_score
from spanflow.runtime.shedding.policy import PeerLoad, Running, Shedder, SheddingConfig

CONFIG = SheddingConfig(high=0.9, low=0.6, sustain=10.0, cooldown=30.0)


def frag(name: str, priority: int, batch_ms: int, budget: float | None = None) -> Running:
    load = FragmentLoad(name, batch_ms, 1000, 100.0, 100.0, 0)
    return Running(name, priority, budget, load)


RUNNING = [frag("hi.f0", 5, 600), frag("lo.f0", 0, 300), frag("mid.f0", 2, 300)]
PEERS = [PeerLoad("p1", 0.5, 2, 1.0), PeerLoad("p2", 0.1, 1, 1.0), PeerLoad("p3", 0.0, 2, 9.0)]


def test_nothing_moves_before_the_overload_has_lasted() -> None:
    shedder = Shedder(CONFIG)
    assert shedder.observe(0.0, 1.2, RUNNING, PEERS) is None
    assert shedder.observe(9.0, 1.2, RUNNING, PEERS) is None
    assert shedder.observe(9.5, 0.8, RUNNING, PEERS) is None, "a dip resets the clock"
    assert shedder.observe(15.0, 1.2, RUNNING, PEERS) is None
    request = shedder.observe(25.0, 1.2, RUNNING, PEERS)
    assert request is not None


def test_the_lowest_priority_fragment_goes_to_the_least_loaded_fresh_peer() -> None:
    shedder = Shedder(CONFIG)
    shedder.observe(0.0, 1.2, RUNNING, PEERS)
    request = shedder.observe(10.0, 1.2, RUNNING, PEERS)
    assert request is not None
    assert (request.fragment, request.to) == ("lo.f0", "p2"), "p3 is idle but its load is stale"
    assert abs(request.share - 0.25) < 1e-9, "a quarter of the node's capacity"
    assert "load 1.20 above 0.90" in request.reason


def test_a_peer_without_room_below_low_is_never_asked() -> None:
    shedder = Shedder(CONFIG)
    busy = [PeerLoad("p1", 0.4, 2, 1.0)]
    shedder.observe(0.0, 1.2, RUNNING, busy)
    assert shedder.observe(10.0, 1.2, RUNNING, busy) is None, "0.4 + 0.25 would pass low"
    full = [PeerLoad("p1", 0.0, 0, 1.0)]
    assert shedder.observe(11.0, 1.2, RUNNING, full) is None, "no free slot"


def test_cool_down_after_a_request_and_refusals_are_remembered() -> None:
    shedder = Shedder(CONFIG)
    shedder.observe(0.0, 1.2, RUNNING, PEERS)
    first = shedder.observe(10.0, 1.2, RUNNING, PEERS)
    assert first is not None and (first.fragment, first.to) == ("lo.f0", "p2")
    shedder.refused(first, 10.0)
    assert shedder.observe(20.0, 1.2, RUNNING, PEERS) is None, "overload must last again"
    assert shedder.observe(35.0, 1.2, RUNNING, PEERS) is None, "cooling down"
    second = shedder.observe(45.0, 1.2, RUNNING, PEERS)
    assert second is not None
    assert (second.fragment, second.to) == ("mid.f0", "p2"), "lo.f0 to p2 was refused"
    shedder.sent(45.0)
    assert shedder.observe(60.0, 1.2, RUNNING, PEERS) is None


def test_hysteresis_a_node_that_took_a_fragment_is_far_from_shedding_it_back() -> None:
    config = SheddingConfig()
    assert config.low < config.high
    taker = Shedder(config)
    # p2 took lo.f0: at most low afterwards, so it is never overloaded by it.
    assert taker.observe(0.0, config.low, [frag("lo.f0", 0, 300)], PEERS) is None
    assert taker.observe(100.0, config.low, [frag("lo.f0", 0, 300)], PEERS) is None


def test_the_load_score_is_the_worst_bottleneck() -> None:
    calm = load_score(20.0, 50.0, [FragmentLoad("a", 200, 1000, 50.0, 100.0, 0)])
    assert calm.score == 0.5 and calm.bottleneck == "rate", "processing at twice the input"
    behind = load_score(20.0, 50.0, [FragmentLoad("a", 1500, 1000, 300.0, 100.0, 500)])
    assert behind.score == 3.0 and behind.bottleneck == "rate"
    stuck = load_score(20.0, 50.0, [FragmentLoad("a", 60000, 500, 100.0, 100.0, 0)])
    assert stuck.score == 4.0 and stuck.bottleneck == "batch", "capped"
    assert behind.worst_fragment == "a"
    piled_up = load_score(20.0, 50.0, [FragmentLoad("a", 100, 1000, 100.0, 200.0, 4000)])
    assert piled_up.score == 2.0 and piled_up.bottleneck == "backlog", "20 s of backlog"
    full_memory = load_score(10.0, 97.0, [])
    assert full_memory.score == 0.9 and full_memory.bottleneck == "memory"


def test_a_real_time_query_weighs_by_its_backlog_alone() -> None:
    """A real-time query that keeps up reads exactly what arrives: its rate is no sign of
    load. What it has not read yet, at the rate it reads, is."""
    keeping_up = load_score(20.0, 50.0, [FragmentLoad("rt", 0, 1000, 0.0, 0.0, 3, 10_000.0)])
    assert keeping_up.score == 0.2 and keeping_up.bottleneck == "cpu"
    behind = load_score(20.0, 50.0, [FragmentLoad("rt", 0, 1000, 0.0, 0.0, 150_000, 10_000.0)])
    assert behind.score == 1.5 and behind.bottleneck == "backlog", "15 s behind"
