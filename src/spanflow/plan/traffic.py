"""What a fragment would ship across a site link, from the topology's declared rates.

A hosted stream may declare ``rate`` (records per second at its busiest) and
``record_bytes``; each step type says what it does to a rate (its ``rate`` trait:
keeps it, keeps at most it, adds its inputs', or makes it unknown — a window emits
per key and window, which the topology does not tell). Carried through the pipeline,
that gives what every step's output amounts to at each site, and so what a fragment
pulls from each of its input sites: the planner compares it with the bandwidth of
the link the fragment's placement would put it on (:mod:`spanflow.plan.planner`).

Pure: a pipeline, the sites each step's data is born at, and a topology go in.

>>> from spanflow.spec import PipelineSpec
>>> from spanflow.spec.topology import Topology
>>> topo = Topology.model_validate({"sites": [{"name": "a"}], "nodes": [
...     {"name": "n", "site": "a", "streams": [{"name": "S", "rate": 1000, "record_bytes": 150}]}]})
>>> spec = PipelineSpec.model_validate({"name": "p", "steps": [
...   {"id": "in", "type": "source", "stream": "S", "schema": {"x": "double"}},
...   {"id": "hot", "type": "filter", "where": "x > 1", "inputs": ["in"]},
...   {"id": "out", "type": "sink", "connector": "console", "inputs": ["hot"]}]})
>>> t = step_traffic(spec, {"in": frozenset({"a"}), "hot": frozenset({"a"})}, topo)
>>> t["hot"]["a"].bytes_per_s, t["hot"]["a"].at_most
(250000.0, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from spanflow.spec.cluster import Traffic
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps import Rate, Step
from spanflow.spec.steps.io import SourceStep
from spanflow.spec.topology import Topology

SiteTraffic = dict[str, Traffic]
"""Site → what a step's output amounts to there; a site missing: not known."""


def step_traffic(
    plan: PipelineSpec, sites: Mapping[str, frozenset[str]], topology: Topology
) -> dict[str, SiteTraffic]:
    """Step id → site → its output's estimated traffic, for every step whose rate the
    declared stream rates and the step traits tell."""
    out: dict[str, SiteTraffic] = {}
    for step in plan.topological():
        if isinstance(step, SourceStep):
            out[step.id] = _source(step, topology)
        else:
            out[step.id] = _through(step, sites, out)
    return out


def pulled(
    boundary: Iterable[str],
    sites: Mapping[str, frozenset[str]],
    traffic: Mapping[str, SiteTraffic],
) -> SiteTraffic:
    """What a fragment pulls from each site when it reads the output of the
    ``boundary`` steps (its sources, or the cuts other fragments send it): a site is
    left out when any of those steps' traffic there is unknown."""
    return _summed(list(boundary), sites, traffic)


def _source(step: SourceStep, topology: Topology) -> SiteTraffic:
    if step.stream is None:
        return {}
    per_site: dict[str, list[float | None]] = {}
    for node in topology.hosts_of(step.stream):
        for hosted in node.streams:
            if hosted.name == step.stream:
                per_site.setdefault(node.site, []).append(hosted.bytes_per_second())
    return {
        site: Traffic(bytes_per_s=sum(v for v in rates if v is not None), streams=(step.stream,))
        for site, rates in per_site.items()
        if all(v is not None for v in rates)
    }


def _through(
    step: Step, sites: Mapping[str, frozenset[str]], traffic: Mapping[str, SiteTraffic]
) -> SiteTraffic:
    rate = type(step).rate
    if rate is Rate.UNKNOWN or (rate is not Rate.SUMS and len(step.inputs) != 1):
        return {}
    summed = _summed(step.inputs, sites, traffic)
    if rate is Rate.AT_MOST:
        return {site: t.model_copy(update={"at_most": True}) for site, t in summed.items()}
    return summed


def _summed(
    steps: list[str] | tuple[str, ...],
    sites: Mapping[str, frozenset[str]],
    traffic: Mapping[str, SiteTraffic],
) -> SiteTraffic:
    out: SiteTraffic = {}
    for site in sorted(set().union(*(sites.get(s, frozenset()) for s in steps))):
        parts = [traffic.get(s, {}).get(site) for s in steps if site in sites.get(s, ())]
        known = [p for p in parts if p is not None]
        if len(known) < len(parts) or not known:
            continue
        out[site] = Traffic(
            bytes_per_s=sum(p.bytes_per_s for p in known),
            at_most=any(p.at_most for p in known),
            streams=tuple(dict.fromkeys(s for p in known for s in p.streams)),
        )
    return out
