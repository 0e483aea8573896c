from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanflow.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_validate_prints_the_spec_of_a_good_file():
    result = runner.invoke(app, ["validate", str(ROOT / "examples" / "sensor_alerts.yaml")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "sensor-alerts"


def test_validate_a_python_object():
    result = runner.invoke(app, ["validate", "spanflow.demo:flow"])
    assert result.exit_code == 0 and '"per_device_10s"' in result.stdout


def test_bad_pipeline_file_exits_2_naming_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nsources:\n  - id: s\n    stream: S\n    schema: {a: long}\n"
        "    formt: json\n    to: [o]\nsinks:\n  - {id: o, type: console}\n"
    )
    result = runner.invoke(app, ["run", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:6: sources[0].formt: Extra inputs are not permitted" in result.output.replace(
        "\n", ""
    )


def test_unknown_target_is_a_clear_error():
    result = runner.invoke(app, ["validate", "no_such_module:thing"])
    assert result.exit_code == 2 and "cannot load 'no_such_module:thing'" in result.output


@pytest.mark.slow
@pytest.mark.solo  # four processes with their Spark, each query's first batch within 10 s
def test_cluster_demo_shows_site_and_global_results_and_exits_cleanly():
    """The README's main command: two edge sites and a cloud, each node its own process.
    It stops once both sites have three global summaries and the event pattern matched
    (or after 300 s, and then fails): the simulated overheats come at random moments."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        # three summaries a site: on a busy machine the pattern query's first batch takes
        # up to a minute (its planning and Python workers), and the matches come after it
        [
            *(sys.executable, "-m", "spanflow.cli", "demo", "--duration", "300"),
            *("--until-global", "3", "--until-patterns", "1"),
        ],
        capture_output=True,
        text=True,
        timeout=420,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for site in ("factory-a", "factory-b"):
        assert re.search(rf"window {site}/dev-\d{{3}} \d\d:\d\d:\d\d–", out), out[-3000:]
        assert re.search(rf"GLOBAL {site} window .* devices=\d+ readings=\d+", out), out[-3000:]
    summary = re.search(
        r"demo finished: ([\d,]+) readings, (\d+) site windows, (\d+) alerts, (\d+) global "
        r"summaries; pipelines: (.*); (\d+) anomaly episodes detected, (\d+) pattern matches",
        out,
    )
    assert summary, out[-2000:]
    assert int(summary.group(2)) > 0 and int(summary.group(4)) >= 2
    assert summary.group(5).strip() == "factory-monitoring running"
    # The simulators' machines overheat, then vibrate (≈ 8 a minute per factory): the
    # event pattern at each factory finds them.
    assert int(summary.group(7)) > 0, out[-2000:]
    assert re.search(r"PATTERN factory-[ab]/dev-\d{3} overheat_then_vibration ", out)
    # The end of the run scores the detected anomaly episodes against the injected ones
    assert re.search(
        r"anomaly detection: \d+ of \d+ flagged readings \(\d+ %\) fell inside injected "
        r"anomalies; \d+ of \d+ detected episodes were injected ones; injected episodes found: ",
        out,
    ), out[-2000:]
    # The dashboard's feed: incidents, not rows — each injected overheat the feed saw is
    # at most one anomaly, one pattern and one alert incident (with their counts)
    feed = re.search(
        r"event feed: ([\d,]+) records in (\d+) incidents \(anomaly \d+, pattern \d+, alert "
        r"(\d+)\); (\d+) injected overheats, (\d+) seen, (\d+) of them as one incident per kind",
        out,
    )
    assert feed, out[-2000:]
    records, incidents = int(feed.group(1).replace(",", "")), int(feed.group(2))
    assert int(feed.group(3)) > 0 and records > incidents
    assert int(feed.group(5)) > 0 and feed.group(6) == feed.group(5), feed.group(0)
    # One pipeline, split by the planner: each factory's part at home, the merge in the cloud.
    assert (
        "submitted factory-monitoring → at-factory-a on edge-a, at-factory-b on edge-b, "
        "global on cloud-1" in proc.stderr
    )


@pytest.mark.slow
def test_single_node_demo_prints_windows_and_alerts_and_exits_cleanly():
    """``demo --single-node``: windows close 10 s + 5 s lateness after start."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spanflow.cli",
            "demo",
            "--single-node",
            "--duration",
            "45",
            "--rate",
            "150",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"window dev-\d{3} \d\d:\d\d:\d\d–\d\d:\d\d:\d\d readings=\d+", out), out[
        -2000:
    ]
    summary = re.search(
        r"demo finished: ([\d,]+) readings, (\d+) window results, (\d+) alerts, (\d+) dead letters",
        out,
    )
    assert summary, out[-2000:]
    assert int(summary.group(2)) > 0 and int(summary.group(4)) > 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--mqtt-listen", "1883"], "--mqtt-listen: listen address '1883' is not HOST:PORT"),
        (["--mqtt", "--nats", "nats://127.0.0.1:4222"], "need the embedded server"),
    ],
    ids=["no-host", "external-server"],
)
def test_mqtt_options_that_cannot_be_honoured_exit_2(args, words):
    result = runner.invoke(app, ["run", str(ROOT / "examples" / "sensor_alerts.yaml"), *args])
    assert result.exit_code == 2
    assert words in " ".join(result.output.split())
