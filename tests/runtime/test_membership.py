"""SWIM with Lifeguard: the real protocol over the simulated network (no sockets, no
sleeps - simulated time), and its pieces on their own."""

from __future__ import annotations

import pytest

from spanflow.runtime.membership.broadcasts import BroadcastQueue
from spanflow.runtime.membership.config import MembershipConfig
from spanflow.runtime.membership.memory_network import MemoryNetwork
from spanflow.runtime.membership.messages import (
    Ack,
    Alive,
    CodecError,
    Dead,
    Load,
    NodeState,
    Ping,
    PushPull,
    State,
    Suspect,
    decode,
    encode,
)
from spanflow.runtime.membership.protocol import Membership
from spanflow.runtime.membership.suspicion import Suspicion

LAN = MembershipConfig.lan()


def group(
    size: int, *, loss: float = 0.0, config: MembershipConfig = LAN, seed: int = 7
) -> MemoryNetwork:
    """``size`` members joined through m0 and converged (every one sees every other)."""
    net = MemoryNetwork(seed=seed, loss=loss, wire=True)
    net.add("m0", config)
    for i in range(1, size):
        net.add(f"m{i}", config, seeds=["m0"])
    assert net.run_while(lambda: not converged(net), step=0.05, limit=10.0)
    return net


def converged(net: MemoryNetwork) -> bool:
    live = net.live()
    return all(net.member(a).state_of(b) == State.ALIVE for a in live for b in live if a != b)


def everyone_holds(net: MemoryNetwork, name: str, states: set[State]) -> bool:
    return all(net.member(a).state_of(name) in states for a in net.live() if a != name)


def dead_verdicts(net: MemoryNetwork) -> list[tuple[str, str]]:
    verdicts: list[tuple[str, str]] = []
    net.observers.append(
        lambda source, changes: verdicts.extend(
            (source, c.node) for c in changes if c.state == State.DEAD
        )
    )
    return verdicts


# ------------------------------------------------------------------- pieces


def test_codec_round_trips_every_message() -> None:
    load = Load(0.42, 3, 1.5)
    messages = [
        Ping(1, "b", "a", "10.0.0.1:7946", load),
        Ack(1, "b", None),
        Alive(3, "c", "10.0.0.3:7946"),
        Suspect(3, "c", "a"),
        Dead(4, "c", "c"),
        PushPull("a", "10.0.0.1:7946", True, False, (NodeState("a", "x:1", 2, 0, load),)),
    ]
    assert decode(encode(messages)) == messages


@pytest.mark.parametrize(
    ("packet", "reason"),
    [
        (b"not json", "not JSON"),
        (b'{"p": 1}', "array of messages"),
        (b'[["Z", 1]]', "unknown message tag"),
        (b'[["S", 1, "c"]]', "has 3 fields"),
        (b'[["S", "one", "c", "a"]]', "incarnation must be an integer"),
        (b'[["S", true, "c", "a"]]', "incarnation must be an integer"),
        (b'[["p", 1, "b", "a", "x", [1, 2]]]', "[score, free_slots, age]"),
        (b'[["P", "a", "x", true, false, [["b", "y", 1, 9, null]]]]', "unknown state"),
    ],
)
def test_codec_refuses_malformed_packets_with_the_reason(packet: bytes, reason: str) -> None:
    with pytest.raises(CodecError, match=reason if reason[0] != "[" else r"\[score"):
        decode(packet)


def test_a_suspicion_shrinks_from_max_to_min_with_confirmations() -> None:
    suspicion = Suspicion("a", expected=2, minimum=1.0, maximum=6.0, start=100.0)
    assert suspicion.deadline == 106.0
    assert suspicion.confirm("b")
    first = suspicion.deadline
    assert 101.0 < first < 106.0
    assert not suspicion.confirm("b"), "the same accuser counts once"
    assert suspicion.confirm("c")
    assert suspicion.deadline == 101.0
    assert not suspicion.confirm("d"), "beyond the expected confirmations nothing changes"
    assert Suspicion("a", expected=0, minimum=1.0, maximum=6.0, start=0.0).deadline == 1.0


def test_the_broadcast_queue_keeps_the_latest_rumour_and_a_transmit_limit() -> None:
    queue = BroadcastQueue()
    queue.push(Suspect(1, "c", "a"))
    queue.push(Dead(1, "c", "a"))
    queue.push(Alive(2, "d", "x"))
    assert len(queue) == 2
    first = queue.take(1400, limit=2)
    assert set(first) == {Dead(1, "c", "a"), Alive(2, "d", "x")}
    queue.push(Alive(5, "e", "y"))
    assert queue.take(30, limit=2) == [Alive(5, "e", "y")], "least sent goes first"
    assert set(queue.take(1400, limit=2)) == {
        Dead(1, "c", "a"),
        Alive(2, "d", "x"),
        Alive(5, "e", "y"),
    }
    assert len(queue) == 0, "each sent twice: dropped"


def test_profiles_explain_themselves_and_unknown_names_are_refused() -> None:
    assert MembershipConfig.named("wan").probe_interval > LAN.probe_interval
    assert MembershipConfig.named("local_test").profile == "local_test"
    assert LAN.suspicion_min(1000) == pytest.approx(3 * 3 * 0.15)
    assert LAN.retransmit_limit(10) == 8
    assert LAN.push_pull_every(1000) > LAN.push_pull_every(10)
    with pytest.raises(ValueError, match="unknown membership profile 'lann'"):
        MembershipConfig.named("lann")


# ------------------------------------------------------------------ protocol


def test_a_killed_member_is_declared_dead_by_everyone_within_two_seconds() -> None:
    net = group(8, loss=0.05)
    verdicts = dead_verdicts(net)
    start = net.now
    net.kill("m5")
    assert net.run_while(lambda: not everyone_holds(net, "m5", {State.DEAD}), step=0.05, limit=10.0)
    assert net.now - start <= 2.0
    assert {node for _, node in verdicts} == {"m5"}, "only the killed member is declared dead"


def test_no_live_member_is_declared_dead_at_ten_percent_loss() -> None:
    net = group(10, loss=0.10)
    verdicts = dead_verdicts(net)
    net.run_until(net.now + 60.0)
    assert verdicts == []
    assert converged(net)
    assert net.stats.lost > 1000, "the network really lost packets"


def test_a_suspected_member_refutes_with_a_higher_incarnation() -> None:
    net = group(5)
    verdicts = dead_verdicts(net)
    accused = net.member("m3")
    before = accused.me.incarnation
    net.nodes["m1"].membership.receive([Suspect(before, "m3", "m1")], net.now)
    net.run_until(net.now + 5.0)
    assert accused.me.incarnation > before
    assert accused.counters.refutations >= 1
    assert verdicts == []
    assert everyone_holds(net, "m3", {State.ALIVE})


def test_a_graceful_leave_is_left_not_dead_and_nobody_suspects_it() -> None:
    net = group(6)
    suspected: list[str] = []
    net.observers.append(
        lambda _s, changes: suspected.extend(c.node for c in changes if c.state == State.SUSPECT)
    )
    net.leave("m4")
    net.run_until(net.now + LAN.leave_propagation)
    net.kill("m4")
    assert net.run_while(lambda: not everyone_holds(net, "m4", {State.LEFT}), step=0.05, limit=3.0)
    assert suspected == []


def test_a_healed_partition_converges_back() -> None:
    net = group(10, loss=0.02)
    left, right = {f"m{i}" for i in range(5)}, {f"m{i}" for i in range(5, 10)}
    net.partition(left, right)
    net.run_until(net.now + 5.0)
    assert all(net.member("m0").state_of(n) == State.DEAD for n in right)
    net.heal()
    start = net.now
    assert net.run_while(lambda: not converged(net), step=0.05, limit=20.0)
    assert net.now - start < 10.0


def test_a_restarted_member_rejoins_under_its_name() -> None:
    net = group(5)
    net.kill("m2")
    assert net.run_while(lambda: not everyone_holds(net, "m2", {State.DEAD}), step=0.05, limit=10.0)
    del net.nodes["m2"]
    reborn = net.add("m2", LAN, seeds=["m0"])
    assert reborn.me.incarnation == 1
    assert net.run_while(lambda: not converged(net), step=0.05, limit=10.0)
    assert reborn.me.incarnation > 1, "it refuted the dead verdict it found"


def test_lifeguard_keeps_a_slow_member_from_killing_healthy_ones() -> None:
    def healthy_declared_dead(lifeguard: bool) -> int:
        net = group(10, config=LAN.replace(lifeguard=lifeguard), seed=3)
        verdicts = dead_verdicts(net)
        net.set_slow("m9", 1.0)
        net.run_until(net.now + 20.0)
        return sum(1 for _, node in verdicts if node != "m9")

    with_lifeguard, classic = healthy_declared_dead(True), healthy_declared_dead(False)
    assert classic >= 10, "classic SWIM: the slow member declares healthy peers dead"
    assert with_lifeguard * 10 <= classic


def test_load_travels_with_probes_and_carries_its_age() -> None:
    net = group(4)
    net.member("m2").set_load(0.8, 1, net.now)
    net.run_until(net.now + 3.0)
    seen = net.member("m0").members["m2"]
    assert seen.load is not None and seen.load.score == 0.8 and seen.load.free_slots == 1
    assert 0.0 <= net.now - seen.load_at <= 3.0
    assert seen.load.connected
    net.member("m2").set_connected(False)
    net.run_until(net.now + 3.0)
    after = net.member("m0").members["m2"].load
    assert after is not None and not after.connected, "a lost data path travels with the load"


def test_a_packet_for_a_previous_owner_of_the_address_is_ignored() -> None:
    member = Membership("new", "10.0.0.9:7946", LAN, now=0.0)
    assert member.receive([Ping(1, "old", "a", "10.0.0.1:7946")], 0.0) == []
    assert member.counters.ignored == 1
