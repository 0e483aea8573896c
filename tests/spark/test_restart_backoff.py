"""A failed query's restart backoff (pure): it grows with failures in a row and starts
again once the query has run a healthy while."""

from __future__ import annotations

from spanflow.spark.query.supervised import HEALTHY_RUN_S, RESTART_BACKOFF_MAX_S, restart_backoff


def _fail(times: int, ran_for_s: float) -> list[float]:
    failing, delays = 0, []
    for _ in range(times):
        delay, failing = restart_backoff(failing, ran_for_s)
        delays.append(delay)
    return delays


def test_failures_in_a_row_double_the_wait_up_to_its_cap() -> None:
    assert _fail(7, ran_for_s=1.0) == [1, 2, 4, 8, 16, RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_MAX_S]


def test_a_query_that_ran_a_healthy_while_restarts_after_a_second_again() -> None:
    delay, failing = restart_backoff(6, ran_for_s=1.0)
    assert (delay, failing) == (RESTART_BACKOFF_MAX_S, 7)
    delay, failing = restart_backoff(failing, ran_for_s=HEALTHY_RUN_S)
    assert (delay, failing) == (1.0, 1)


def test_a_restart_that_failed_at_once_counts_as_one_more_failure() -> None:
    delay, failing = restart_backoff(2, ran_for_s=0.0)
    assert (delay, failing) == (4.0, 3)
