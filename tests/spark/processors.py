"""Keyed processors used by the tests (importable by module name, as in production)."""

from __future__ import annotations

from datetime import timedelta

import spanflow as sf


class RunningMean(sf.KeyedProcessor):
    """Count and mean per key in a record-typed ValueState; rejects negative readings."""

    def init(self, state):
        self.stats = state.value("stats", {"n": "long", "mean": "double"})

    def process(self, key, rows, ctx):
        stats = self.stats.get() or {"n": 0, "mean": 0.0}
        for row in rows:
            if row["v"] < 0:
                raise ValueError(f"negative reading {row['v']}")
            stats["n"] += 1
            stats["mean"] += (row["v"] - stats["mean"]) / stats["n"]
        self.stats.set(stats)
        yield {"n": stats["n"], "mean": stats["mean"]}


class Silence(sf.KeyedProcessor):
    """Reports a key that has sent nothing for ``gap`` seconds of event time.

    Every record moves the key's deadline (an event-time timer); when the watermark
    passes it, one 'silent' row is emitted with the time of the last record."""

    def __init__(self, gap: float = 10.0) -> None:
        self.gap = gap

    def init(self, state):
        self.last = state.value("last", "timestamp")
        self.deadline = state.value("deadline", "timestamp")

    def process(self, key, rows, ctx):
        last = rows[-1]["ts"]
        old = self.deadline.get()
        if old is not None:
            ctx.timers.delete(old)
        deadline = last + timedelta(seconds=self.gap)
        ctx.timers.register(deadline)
        self.last.set(last)
        self.deadline.set(deadline)
        return []

    def on_timer(self, key, timer, ctx):
        self.deadline.clear()
        yield {"silent_since": self.last.get(), "fired_at": timer}


class Dedup(sf.KeyedProcessor):
    """Keeps the first record of each id per key (a MapState of seen ids), forever or
    for ``ttl``."""

    def __init__(self, ttl: str | None = None) -> None:
        self.ttl = ttl

    def init(self, state):
        self.seen = state.map("seen", "long", "boolean", ttl=self.ttl)

    def process(self, key, rows, ctx):
        for row in rows:
            if not self.seen.contains(row["id"]):
                self.seen.put(row["id"], True)
                yield {"id": row["id"], "v": row["v"]}


class Heartbeat(sf.KeyedProcessor):
    """A processing-time timer one second after each batch of a key; emits once."""

    def init(self, state):
        self.armed = state.value("armed", "boolean")

    def process(self, key, rows, ctx):
        if not self.armed.get(False):
            ctx.timers.register_after(1.0)
            self.armed.set(True)
        return []

    def on_timer(self, key, timer, ctx):
        yield {"tick": timer}


class KeepsHistory(sf.KeyedProcessor):
    """A ListState of every value seen, and a json state of free-form data."""

    def init(self, state):
        self.values = state.list("values", "double")
        self.profile = state.value("profile")  # json: any plain data

    def process(self, key, rows, ctx):
        self.values.extend(r["v"] for r in rows)
        profile = self.profile.get({"tags": [], "raw": b""})
        profile["tags"].append(len(rows))
        profile["raw"] += b"\x00\xff"
        self.profile.set(profile)
        yield {"count": len(self.values.get()), "batches": len(profile["tags"])}


def keep_max(acc, record):
    """A reduce: the record with the largest v."""
    return acc if acc["v"] >= record["v"] else record


class Alarm(sf.KeyedProcessor):
    """Arms a processing-time timer ``delay`` seconds after a key's first record and
    rings once; remembers ids for ``ttl`` (processing time) and drops repeats."""

    def __init__(self, delay: float = 5.0, ttl: str = "10m") -> None:
        self.delay, self.ttl = delay, ttl

    def init(self, state):
        self.armed = state.value("armed", "timestamp")
        self.seen = state.map("seen", "long", "boolean", ttl=self.ttl)

    def process(self, key, rows, ctx):
        for row in rows:
            if self.seen.contains(row["id"]):
                continue
            self.seen.put(row["id"], True)
            yield {"kind": "record", "id": row["id"], "at": ctx.processing_time}
        if self.armed.get() is None:
            self.armed.set(ctx.processing_time)
            ctx.timers.register_after(self.delay)
            yield {"kind": "armed", "id": None, "at": ctx.processing_time}

    def on_timer(self, key, timer, ctx):
        yield {"kind": "ring", "id": None, "at": timer}
