"""The demo pipeline: sensors → validate → 10 s tumbling window per device, and an
alert for each reading over a limit, in Spark's Real-Time Mode (milliseconds).

The same pipeline is in ``examples/sensor_alerts.yaml``; a test checks both front
ends produce the same spec.
"""

from __future__ import annotations

from spanflow.api import Flow, Pipeline, Stream
from spanflow.api.patterns import Pattern
from spanflow.simulator import SENSOR_SCHEMA

TEMPERATURE_LIMIT = 45.0
VIBRATION_LIMIT = 3.0


def validated(readings: Stream) -> Stream:
    return readings.filter("temperature BETWEEN -40 AND 125 AND vibration >= 0", id="valid")


def device_windows(valid: Stream) -> Stream:
    """10 s tumbling window per device."""
    return (
        valid.key_by("device", id="by_device")
        .window(tumbling="10s")
        .aggregate(
            readings="count",
            avg_temperature="avg(temperature)",
            max_temperature="max(temperature)",
            max_vibration="max(vibration)",
            id="per_device_10s",
        )
    )


def reading_alerts(valid: Stream, *where: str) -> Stream:
    """Each reading over a limit, as it arrives: an all-SQL path, so it runs in Spark's
    Real-Time Mode (docs/realtime.md) — the alert is out in milliseconds, not at the
    next micro-batch. ``where``: the fields that say where it comes from."""
    return (
        valid.filter(
            f"temperature > {TEMPERATURE_LIMIT} OR vibration > {VIBRATION_LIMIT}", id="over_limit"
        )
        .select(
            *where,
            "ts",
            "temperature",
            "vibration",
            f"CASE WHEN temperature > {TEMPERATURE_LIMIT} THEN 'temperature' "
            "ELSE 'vibration' END AS reason",
            "_published AS received",  # when the site's server stored the reading
            id="alert",
        )
        .realtime()
    )


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
    valid = validated(readings)
    to_windows = device_windows(valid).sink_jetstream(
        "SENSOR_WINDOWS", subject="windows.{device}", id="windows_out"
    )
    to_alerts = reading_alerts(valid, "device").sink_jetstream(
        "SENSOR_ALERTS", subject="alerts.{device}", id="alerts_out", feed="alert"
    )
    return to_windows.merge(to_alerts)


flow = sensor_alerts()
"""``spanflow run spanflow.demo:flow`` runs it."""


# -- the cluster demo: two factories (edge sites) and a cloud region ----------------------
SITES = ("factory-a", "factory-b")
"""Edge sites of the cluster demo; both publish to ``SENSORS`` on ``sensors.<site>.>``."""


def overheat_then_vibration() -> Pattern:
    """A machine that overheats and then vibrates within 30 s (a seizing bearing):
    one match per episode (the next one starts after its last event)."""
    return (
        Pattern.begin("overheat").where(f"temperature > {TEMPERATURE_LIMIT}")
        .followed_by("spike").where(f"vibration > {VIBRATION_LIMIT}")
        .within("30s")
        .skip_past_last_event()
    )  # fmt: skip


def factory_monitoring() -> Flow:
    """One pipeline for every factory. The planner runs validation, anomaly detection
    per machine, the overheat-then-vibration pattern per machine, the 10 s window per
    device, the alerts (in real time) and the partial per-site summary at each factory, and merges
    the summaries in the cloud. Same as ``examples/cluster/factory_monitoring.yaml``."""
    p = Pipeline("factory-monitoring", trigger="1s")
    readings = p.source(
        "SENSORS",
        subjects=["sensors.>"],
        schema={k: v for k, v in SENSOR_SCHEMA.items() if k != "humidity"},
        key="device",
        event_time="ts",
        max_out_of_orderness="5s",
        id="readings",
    )
    valid = validated(readings)
    by_device = valid.key_by("site", "device", id="by_device")
    # Each machine scored against its own learnt baseline, at its factory: a row when an
    # anomaly episode starts and one when it ends (not one per anomalous reading).
    # The simulator's anomalies are of one sensor at a time, many of them single spikes
    # or a stuck value: the likelihood method's kind (the multivariate default waits for
    # a deviation that persists). Sensors with Gaussian noise on a slow cycle: a reading
    # 5 sigma from the machine's level alarms, a new extreme only when it is 6 sigma
    # away, a run of errors only when its reading is 3 sigma away; and a value frozen
    # for 10 readings alarms (docs/ml.md, "Sensors with Gaussian noise")
    anomalies = by_device.detect_anomalies(
        ["temperature", "vibration"],
        method="likelihood",
        emit="episodes",
        quiet="10s",
        params={"extreme_sigma": 6, "sigma": 5, "confirm": 3, "stuck": 10},
        id="anomalies",
    ).sink_jetstream("SITE_ANOMALIES", subject="anomalies.{site}.{device}", id="anomalies_out")
    # Each machine's events, in event-time order, matched against a failure pattern
    seizing = by_device.match(
        overheat_then_vibration(),
        select={
            "peak_temperature": "max(overheat.temperature)",
            "vibration": "first(spike.vibration)",
        },
        rule="overheat_then_vibration",
        id="seizing",
    ).sink_jetstream("SITE_PATTERNS", subject="patterns.{site}.{device}", id="patterns_out")
    windows = by_device.window(tumbling="10s").aggregate(
        readings="count",
        avg_temperature="avg(temperature)",
        max_temperature="max(temperature)",
        max_vibration="max(vibration)",
        id="per_device_10s",
    )
    to_windows = windows.sink_jetstream(
        "SITE_WINDOWS", subject="windows.{site}.{device}", id="windows_out"
    )
    # Each reading over a limit, alerted at its factory within milliseconds
    to_alerts = reading_alerts(valid, "site", "device").sink_jetstream(
        "SITE_ALERTS", subject="alerts.{site}.{device}", id="alerts_out", feed="alert"
    )
    summary = (
        windows.key_by("site", id="by_site")
        .window(tumbling="10s")
        .aggregate(
            devices="count",
            readings="sum(readings)",
            avg_temperature="avg(avg_temperature)",
            max_temperature="max(max_temperature)",
            id="per_site_10s",
        )
        .sink_jetstream("GLOBAL_SUMMARY", subject="global.{site}", id="summary_out")
    )
    return to_windows.merge(to_alerts, summary, anomalies, seizing)
