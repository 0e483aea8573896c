"""``spanflow plan``: compile and place a pipeline offline, against a topology file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from spanflow.cli.common import app, console, fail, load_target
from spanflow.errors import SpanflowError
from spanflow.spec.durations import parse_duration


@app.command()
def plan(
    target: Annotated[str, typer.Argument(help="PIPELINE.yaml or module:object")],
    topology: Annotated[
        Path, typer.Option("--topology", "-t", help="The topology file to plan against.")
    ],
    explain: Annotated[
        bool, typer.Option("--explain", help="Also say why every step is local or global.")
    ] = False,
    priority: Annotated[int, typer.Option(help="Pipeline priority (0-1000).")] = 0,
    latency_budget: Annotated[
        str | None, typer.Option(help="End-to-end latency budget, e.g. 500ms.")
    ] = None,
    parallelism: Annotated[int, typer.Option(help="Desired parallelism.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Show the fragments a pipeline compiles into and where each would run.

    Every node of the topology is assumed up and idle; the coordinator plans the same
    way against the nodes that are live.
    """
    from spanflow.api.topology_loader import load_topology
    from spanflow.plan.explain import explain_dict, explain_text
    from spanflow.plan.fragments import compile_fragments
    from spanflow.plan.placement import PlacementError
    from spanflow.plan.planner import offline_view, plan_pipeline

    try:
        topo = load_topology(topology)
        spec, _ = load_target(target, topology=topo)
        budget = parse_duration(latency_budget) if latency_budget else None
        compiled = compile_fragments(spec, topo, parallelism)
        result = plan_pipeline(
            compiled, offline_view(topo), priority=priority, latency_budget=budget
        )
    except PlacementError as exc:
        raise fail(SpanflowError(f"no placement fits: {exc}")) from None
    except (SpanflowError, ValueError) as exc:
        raise fail(exc if isinstance(exc, SpanflowError) else SpanflowError(str(exc))) from None
    if as_json:
        console.print_json(json.dumps(explain_dict(compiled, result)))
        return
    for line in explain_text(compiled, result, steps=explain):
        console.print(line, markup=False, highlight=False)
