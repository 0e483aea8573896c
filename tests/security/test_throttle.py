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


def test_a_guesser_locks_its_address_and_the_name_it_tries_but_not_known_devices() -> None:
    t = LoginThrottle(failures=3, window=60, penalty=30)
    t.login_succeeded("nat", "press-7")  # a device behind the NAT logged in before
    for now in (0.0, 1.0, 2.0):  # a guesser behind the same NAT tries press-8
        assert t.may_check("nat", "press-8", now)
        t.login_failed("nat", "press-8", now)
    assert not t.may_check("nat", "press-8", 3.0)  # the guesser is throttled
    assert not t.may_check("nat", "press-9", 3.0)  # and any name it tries from there
    assert not t.may_check("elsewhere", "press-8", 3.0)  # and press-8 from anywhere
    assert t.may_check("nat", "press-7", 3.0)  # the known device is not
    assert t.may_check("elsewhere", "press-7", 3.0)
    t.login_succeeded("nat", "press-7")  # its success does not clear the guesser's record
    assert not t.may_check("nat", "press-8", 4.0)
    # a guesser trying press-7's name from elsewhere does not lock press-7 out at home
    for now in (5.0, 6.0, 7.0):
        t.login_failed("elsewhere", "press-7", now)
    assert not t.may_check("elsewhere", "press-7", 8.0)
    assert t.may_check("nat", "press-7", 8.0)
    # only the pair's own failures lock a known pair (someone at its address with its name)
    for now in (9.0, 10.0, 11.0):
        t.login_failed("nat", "press-7", now)
    assert not t.may_check("nat", "press-7", 12.0)
    assert t.may_check("nat", "press-7", 12.0 + 31.0)
