"""Stateful de-duplication with a keyed processor: devices resend readings when they
are not sure they got through; pass each reading id on once, and forget ids after
ten minutes (state TTL) so memory stays bounded.

    ./dev run examples/dedup.yaml --feed examples/data/resent.jsonl
"""

import spanflow as sf


class FirstSeen(sf.KeyedProcessor):
    """Emits the first record of each key; later ones within ``ttl`` are dropped."""

    def __init__(self, ttl: str = "10m") -> None:
        self.ttl = ttl

    def init(self, state):
        self.seen = state.value("seen", "boolean", ttl=self.ttl)

    def process(self, key, rows, ctx):
        if self.seen.get(False):
            return
        self.seen.set(True)
        first = rows[0]
        yield {"device": first["device"], "value": first["value"]}


def dedup() -> sf.Flow:
    p = sf.Pipeline("dedup", trigger="1s")
    return (
        p.source(
            "RESENT",
            subjects=["resent.>"],
            schema={"reading_id": "string", "device": "string", "value": "double"},
            id="readings",
        )
        .key_by("reading_id", id="by_id")
        .process(
            FirstSeen,
            output_schema={"reading_id": "string", "device": "string", "value": "double"},
            params={"ttl": "10m"},
            id="first_seen",
        )
        .sink_console(id="out")
    )


flow = dedup()
