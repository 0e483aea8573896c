"""Say where a pipeline's fragments go and why: for ``spanflow plan --explain`` and tools.

Text for people, a dict for programs; both come from the same compiled pipeline and
placement, so they cannot disagree.
"""

from __future__ import annotations

from typing import Any

from spanflow.plan.fragments import CompiledPipeline
from spanflow.plan.placement import slot_need
from spanflow.plan.planner import BATCH_OVERHEAD, Decision, Plan


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def explain_dict(compiled: CompiledPipeline, plan: Plan) -> dict[str, Any]:
    return {
        "pipeline": compiled.spec.name,
        "solver": plan.solver,
        "exact_cost": plan.exact_cost,
        "greedy_cost": plan.greedy_cost,
        "fragments": [
            {
                "id": d.fragment.id,
                "kind": d.fragment.kind,
                "site": d.fragment.site,
                "input_sites": list(d.fragment.input_sites),
                "node": d.node,
                "why": d.why,
                "worst_input_latency_s": d.worst_latency,
                "alternatives": [
                    {"node": n, "worst_input_latency_s": w} for n, w in d.alternatives
                ],
                "steps": list(d.fragment.steps),
                "slots": d.slots,
            }
            for d in plan.decisions
        ],
        "steps": {
            sid: {"scope": compiled.scopes[sid], "why": why}
            for sid, why in compiled.reasons.items()
        },
        "latency": {
            "network_s": plan.path_latency,
            "processing_s": plan.processing,
            "estimate_s": plan.latency_estimate,
            "budget_s": plan.latency_budget,
        },
    }


def _slots(d: Decision) -> str:
    """``3 (Python state: a, b)``, and what a smaller node caps it at."""
    python = [s.id for s in d.fragment.spec.expanded().steps if s.keeps_python_state()]
    need = slot_need(d.fragment)
    why = f"one, plus one per step with Python state: {', '.join(python)}"
    if need > d.slots:
        return f"{d.slots}, all {d.node} has ({need} asked: {why})"
    return f"{d.slots} ({why})"


def explain_text(compiled: CompiledPipeline, plan: Plan, *, steps: bool = True) -> list[str]:
    """Readable lines: fragments with their node and reason, then (optionally) every step
    with why it is local or global, then the latency estimate against the budget."""
    name = compiled.spec.name
    n = len(plan.decisions)
    lines = [f"pipeline {name}: {n} fragment{'s' if n != 1 else ''} (placement: {plan.solver})"]
    width = max(len(d.fragment.id) for d in plan.decisions)
    for d in plan.decisions:
        f = d.fragment
        where = f"site {f.site}" if f.kind == "local" else f"inputs {', '.join(f.input_sites)}"
        lines.append(f"  {f.id:<{width}}  {f.kind:<6}  → {d.node}  ({where})")
        lines.append(f"  {'':<{width}}    why: {d.why}")
        if d.alternatives:
            alts = ", ".join(f"{node} {_ms(w)}" for node, w in d.alternatives)
            lines.append(f"  {'':<{width}}    next best: {alts}")
        lines.append(f"  {'':<{width}}    steps: {', '.join(f.steps)}")
        if d.slots > 1 or slot_need(f) > 1:
            lines.append(f"  {'':<{width}}    slots: {_slots(d)}")
    if plan.exact_cost is not None and plan.greedy_cost is not None:
        gap = plan.greedy_cost / plan.exact_cost if plan.exact_cost else 1.0
        lines.append(
            f"cost: exact {plan.exact_cost:.4f}, greedy {plan.greedy_cost:.4f} (ratio {gap:.3f})"
        )
    if steps:
        lines.append("steps:")
        sw = max(len(s) for s in compiled.reasons)
        for sid, why in compiled.reasons.items():
            lines.append(f"  {sid:<{sw}}  {compiled.scopes[sid]:<6}  {why}")
    per_hop = f"trigger {_ms(plan.trigger)} + {_ms(BATCH_OVERHEAD)}"
    estimate = (
        f"latency: network {_ms(plan.path_latency)} + processing {_ms(plan.processing)} "
        f"({plan.hops} × ({per_hop})) = {_ms(plan.latency_estimate)}"
    )
    if plan.latency_budget is not None:
        spare = plan.latency_budget - plan.latency_estimate
        estimate += f"; budget {_ms(plan.latency_budget)}, {_ms(spare)} to spare"
    lines.append(estimate)
    return lines
