"""A stream that stops answering (its leader died) reads as "nothing new" for a while."""

from __future__ import annotations

import pytest

from spanflow.spark.connectors.jetstream.source import Silence


def test_silence_is_tolerated_until_it_lasts_too_long() -> None:
    silence = Silence("stream S", tolerance=10.0)
    timeout = TimeoutError("no answer")
    silence.tolerate(timeout, now=100.0)
    silence.tolerate(timeout, now=109.5)  # an election's length: the query keeps running
    with pytest.raises(TimeoutError):
        silence.tolerate(timeout, now=110.5)


def test_an_answer_ends_the_silence() -> None:
    silence = Silence("stream S", tolerance=10.0)
    silence.tolerate(TimeoutError(), now=100.0)
    silence.answered()
    silence.tolerate(TimeoutError(), now=150.0)  # a new silence: counted from now
    silence.tolerate(TimeoutError(), now=159.0)
    assert silence.since == 150.0
