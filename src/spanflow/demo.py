"""The demo pipeline: sensors → validate → 10 s tumbling window per device → alerts.

The same pipeline is in ``examples/sensor_alerts.yaml``; a test checks both front
ends produce the same spec.
"""

from __future__ import annotations

from spanflow.api import Flow, Pipeline
from spanflow.simulator import SENSOR_SCHEMA

TEMPERATURE_LIMIT = 45.0
VIBRATION_LIMIT = 3.0


def sensor_alerts() -> Flow:
    p = Pipeline("sensor-alerts", trigger="1s")
    readings = p.source(
        "SENSORS",
        subjects=["sensors.>"],
        schema=SENSOR_SCHEMA,
        key="device",
        event_time="ts",
        max_out_of_orderness="5s",
        id="readings",
    )
    windows = (
        readings.filter("temperature BETWEEN -40 AND 125 AND vibration >= 0", id="valid")
        .key_by("device", id="by_device")
        .window(tumbling="10s")
        .aggregate(
            readings="count",
            avg_temperature="avg(temperature)",
            max_temperature="max(temperature)",
            max_vibration="max(vibration)",
            id="per_device_10s",
        )
    )
    to_windows = windows.sink_jetstream(
        "SENSOR_WINDOWS", subject="windows.{device}", id="windows_out"
    )
    alerts = windows.filter(
        f"max_temperature > {TEMPERATURE_LIMIT} OR max_vibration > {VIBRATION_LIMIT}",
        id="threshold",
    ).select(
        "device",
        "window_start",
        "window_end",
        "max_temperature",
        "max_vibration",
        f"CASE WHEN max_temperature > {TEMPERATURE_LIMIT} THEN 'temperature' "
        "ELSE 'vibration' END AS reason",
        id="alert",
    )
    to_alerts = alerts.sink_jetstream("SENSOR_ALERTS", subject="alerts.{device}", id="alerts_out")
    return to_windows.merge(to_alerts)


flow = sensor_alerts()
"""``spanflow run spanflow.demo:flow`` runs it."""
