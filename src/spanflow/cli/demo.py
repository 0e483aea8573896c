"""``spanflow demo``: two factories and a cloud region on this machine (or, with
``--single-node``, the sensor-alerts pipeline in this process alone)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from spanflow.cli.common import (
    Interrupted,
    _error,
    _quiet_spark,
    app,
    console,
    err,
    nats_url,
)
from spanflow.cli.local import status_table
from spanflow.errors import SpanflowError


def single_node_demo(
    duration: Annotated[
        float | None, typer.Option(help="Seconds to run (default: until Ctrl-C).")
    ] = None,
    rate: Annotated[float, typer.Option(help="Simulated messages per second.")] = 200.0,
    devices: Annotated[int, typer.Option(help="Simulated devices.")] = 8,
    nats: str | None = None,
) -> None:
    """Embedded NATS + simulator + the sensor-alerts pipeline, with live results."""
    import tempfile

    from spanflow.demo.single_node import SingleNodeDemo

    _quiet_spark()
    stop = Interrupted()
    work = Path(tempfile.mkdtemp(prefix="spanflow-demo-"))
    with nats_url(nats, work) as url:
        run = SingleNodeDemo(url, work, rate, devices, console, err)
        try:
            closing = run.run(stop.event, duration, status_table, after_spark=stop.install)
        except SpanflowError as exc:
            _error(exc)
            raise typer.Exit(2) from None
    shutil.rmtree(work, ignore_errors=True)
    console.print(closing)


@app.command()
def demo(
    duration: Annotated[
        float | None, typer.Option(help="Seconds to run (default: until Ctrl-C).")
    ] = None,
    rate: Annotated[float, typer.Option(help="Simulated messages per second per site.")] = 100.0,
    devices: Annotated[int, typer.Option(help="Simulated devices per site.")] = 6,
    single_node: Annotated[
        bool, typer.Option("--single-node", help="One process, one pipeline, no cluster.")
    ] = False,
    nats: Annotated[
        str | None, typer.Option(help="With --single-node: NATS URL (default embedded).")
    ] = None,
    until_global: Annotated[
        int | None,
        typer.Option(hidden=True, help="Stop once every site has this many global summaries."),
    ] = None,
    until_patterns: Annotated[
        int | None,
        typer.Option(hidden=True, help="… and the event pattern matched this many times."),
    ] = None,
    hosts: Annotated[
        bool,
        typer.Option(
            "--hosts",
            help="Run it across hosts: cloud and factories in their own network namespaces "
            "and addresses, every door locked (needs root).",
        ),
    ] = False,
    cut: Annotated[
        str | None,
        typer.Option(help="With --hosts: unplug a factory for a while, e.g. factory-a:30."),
    ] = None,
) -> None:
    """Two factories and a cloud on this machine, each factory with its own NATS server:
    one pipeline, split by the planner into per-machine anomaly detection and an
    overheat-then-vibration event pattern, per-site
    windows and alerts at the edge and a global summary in the cloud, with the
    cluster's status live."""
    if single_node:
        single_node_demo(duration=duration, rate=rate * 2, devices=devices, nats=nats)
        return
    if hosts:
        from spanflow.demo.hosts import run_hosts_demo

        try:
            run_hosts_demo(duration, rate, devices, cut)
        except SpanflowError as exc:
            _error(exc)
            raise typer.Exit(2) from None
        return
    from spanflow.cli.cluster import status_view
    from spanflow.demo.cluster import ClusterDemo
    from spanflow.demo.feed import incident_report

    stop = Interrupted()
    run = ClusterDemo(rate, devices, console, err)
    try:
        states = run.run(stop.event, status_view, duration, until_global, until_patterns)
    except SpanflowError as exc:
        _error(exc)
        raise typer.Exit(2) from None
    console.print(run.feed.summary(states))
    console.print(f"anomaly detection: {run.feed.detection_report().summary()}")
    injected = [e for sim in run.sims for e in sim.stats.injected]
    console.print(incident_report(run.incidents, injected))
