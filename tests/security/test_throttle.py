"""Login throttling per address: pure, driven with the time passed in."""

from __future__ import annotations

from spanflow.security.throttle import LoginThrottle


def test_an_address_that_keeps_failing_is_locked_out_for_longer_each_time() -> None:
    t = LoginThrottle(failures=3, window=60, penalty=10, max_penalty=25)
    for now in (0.0, 1.0, 2.0):
        assert t.allowed("a", now)
        t.failed("a", now)
    assert not t.allowed("a", 5.0) and t.allowed("a", 12.0)  # first lock-out: 10 s
    for now in (12.0, 13.0, 14.0):
        t.failed("a", now)
    assert not t.allowed("a", 33.0) and t.allowed("a", 34.0)  # doubled: 20 s
    for now in (34.0, 35.0, 36.0):
        t.failed("a", now)
    assert not t.allowed("a", 60.0) and t.allowed("a", 61.0)  # capped at 25 s
    assert t.allowed("b", 5.0)  # other addresses are not affected
    assert t.refused == 3


def test_failures_spread_beyond_the_window_never_lock_and_success_forgets() -> None:
    t = LoginThrottle(failures=3, window=10, penalty=30)
    for now in (0.0, 6.0, 12.0, 18.0, 24.0):
        t.failed("a", now)
        assert t.allowed("a", now + 0.5)
    t.failed("a", 25.0)
    t.succeeded("a")
    t.failed("a", 26.0)
    assert t.allowed("a", 26.5)


def test_memory_is_bounded_under_a_flood_of_addresses() -> None:
    t = LoginThrottle(failures=1, penalty=100, max_addresses=100)
    for n in range(1000):
        t.failed(f"10.0.{n // 256}.{n % 256}", float(n))
    assert len(t._seen) == 100
    assert not t.allowed("10.0.3.231", 1000.0)  # the newest are remembered
