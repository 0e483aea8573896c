"""Sliding windows over sensor data: per device, every 5 s, the count, mean and maximum
temperature of the last 10 s of event time (late readings up to 5 s still count).

    ./dev run examples/sliding_windows.yaml --feed examples/data/readings.jsonl
"""

import spanflow as sf


def sliding_windows() -> sf.Flow:
    p = sf.Pipeline("sliding-windows", trigger="1s")
    return (
        p.source(
            "READINGS",
            subjects=["readings.>"],
            schema={"device": "string", "ts": "timestamp", "temperature": "double"},
            key="device",
            event_time="ts",
            max_out_of_orderness="5s",
            id="readings",
        )
        .window(sliding="10s", slide="5s")
        .aggregate(n="count", mean="avg(temperature)", hottest="max(temperature)", id="last_10s")
        .sink_console(id="out")
    )


flow = sliding_windows()
