"""A stream join: each temperature reading with the pressure readings of the same
device taken within 5 s of it (event time), kept when hot and low at once.

    ./dev run examples/stream_join.yaml \\
        --feed temps.line1=examples/data/temps.jsonl \\
        --feed pressures.line1=examples/data/pressures.jsonl
"""

import spanflow as sf


def stream_join() -> sf.Flow:
    p = sf.Pipeline("stream-join", trigger="1s")
    temps = p.source(
        "TEMPS",
        subjects=["temps.>"],
        schema={"device": "string", "ts": "timestamp", "temp": "double"},
        event_time="ts",
        max_out_of_orderness="2s",
        id="temps",
    )
    pressures = p.source(
        "PRESSURES",
        subjects=["pressures.>"],
        schema={"device": "string", "ts": "timestamp", "pressure": "double"},
        event_time="ts",
        max_out_of_orderness="2s",
        id="pressures",
    )
    return (
        temps.join(pressures, on="device", within=("-5s", "+5s"), id="together")
        .filter("temp > 80 AND pressure < 2", id="hot_and_low")
        .select("device", "ts", "temp", "ts_right AS pressure_ts", "pressure", id="alert")
        .sink_console(id="out")
    )


flow = stream_join()
