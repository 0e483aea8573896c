"""Compile a pipeline into fragments: local groups at every site that hosts its input,
and a global group where several sites' data meet.

SpanEdge's split, decided step by step from the topology:

* record-at-a-time steps (filter, select, map, ...) run where their input is;
* a stateful step (window, de-duplication, running count) stays local when all its
  input comes from one site, when it is keyed by the source's key (a device is born
  at one site, so its state is too), or when it is pinned ``at: edge``;
* a final window of count/sum/avg/min/max over several sites is *split*: each site
  aggregates its own records (avg travels as sum + count) and a ``merge`` step in the
  global group folds the sites' partials into exactly the unsplit values;
* anything else that needs several sites' data, and every step after it, is global.

Where a local step feeds a global one, the local fragment publishes to a planner-owned
stream (``SF_<pipeline>_<step>``, one subject per site) and the global fragment reads
each site's part as its own source. Spark keeps the minimum watermark of unioned
sources, so a window closes only when every site has passed it: a late site (a cut
uplink) delays global results but never loses them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

from spanflow.errors import SpecError
from spanflow.spec.cluster import Fragment
from spanflow.spec.operators import (
    AverageStep,
    CountStep,
    DeduplicateStep,
    EventTimeStep,
    FlatMapStep,
    KeyByStep,
    MapStep,
    MergeStep,
    SelectStep,
    SinkStep,
    SourceStep,
    Step,
    UnionStep,
    WindowStep,
)
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.topology import Topology

Scope = Literal["local", "global"]

WATERMARK_EPSILON = 0.001
"""Seconds of out-of-orderness a merge allows: every row of a window arrives with the
same ``window_end``, possibly across micro-batches, and must not count as late."""

CUT_SUBJECT_PREFIX = "spanflow.cut"


class PlanError(SpecError):
    """A pipeline cannot be split as asked (the message names the step and why)."""

    code = "plan_error"


@dataclass
class _Facts:
    """What the planner knows about a step's output."""

    scope: Scope
    sites: frozenset[str]
    key: tuple[str, ...] = ()
    entity: frozenset[str] = frozenset()
    event_time: tuple[str, float] | None = None
    reason: str = ""


@dataclass
class CompiledPipeline:
    """The fragments of a pipeline and why each step went where it did."""

    spec: PipelineSpec
    plan: PipelineSpec
    fragments: list[Fragment]
    reasons: dict[str, str] = field(default_factory=dict)
    scopes: dict[str, Scope] = field(default_factory=dict)


def fragments_of(
    spec: PipelineSpec, parallelism: int = 1, topology: Topology | None = None
) -> list[Fragment]:
    """The fragments of a pipeline. ``parallelism`` > 1 reads each source with at least
    that many tasks per micro-batch (per-key order across tasks is then not kept).

    >>> from spanflow.spec import PipelineSpec
    >>> spec = PipelineSpec.model_validate({"name": "p", "steps": [
    ...   {"id": "in", "type": "source", "stream": "S", "schema": {"x": "long"}},
    ...   {"id": "out", "type": "sink", "kind": "console", "inputs": ["in"]}]})
    >>> [(f.id, f.input_streams) for f in fragments_of(spec)]
    [('p.f0', ('S',))]
    >>> fragments_of(spec, parallelism=4)[0].spec.sources()[0].partitions
    4
    """
    return compile_fragments(spec, topology or Topology(), parallelism).fragments


def compile_fragments(
    spec: PipelineSpec, topology: Topology, parallelism: int = 1
) -> CompiledPipeline:
    """Split ``spec`` for ``topology`` (see the module docstring)."""
    if parallelism > 1:
        spec = _with_parallelism(spec, parallelism)
    facts = _analyse(spec, topology)
    plan, facts = _with_split_windows(spec, facts)
    reasons = {s.id: facts[s.id].reason for s in plan.steps}
    scopes = {s.id: facts[s.id].scope for s in plan.steps}
    local_sites = sorted({s for f in facts.values() if f.scope == "local" for s in f.sites})
    has_global = any(f.scope == "global" for f in facts.values())
    if len(local_sites) + has_global <= 1:
        fragment = _whole(spec, plan, facts, local_sites)
        return CompiledPipeline(spec, plan, [fragment], reasons, scopes)
    fragments = [_local(plan, facts, site, topology) for site in local_sites]
    if has_global:
        fragments.append(_global(plan, facts, topology))
    return CompiledPipeline(spec, plan, fragments, reasons, scopes)


# -- analysis -----------------------------------------------------------------------------
def _with_parallelism(spec: PipelineSpec, parallelism: int) -> PipelineSpec:
    steps = [
        s.model_copy(update={"partitions": min(64, max(s.partitions, parallelism))})
        if isinstance(s, SourceStep)
        else s
        for s in spec.steps
    ]
    return spec.model_copy(update={"steps": tuple(steps)})


def _site_list(sites: frozenset[str]) -> str:
    return ", ".join(sorted(sites))


def _analyse(spec: PipelineSpec, topology: Topology) -> dict[str, _Facts]:
    facts: dict[str, _Facts] = {}
    for step in spec.topological():
        if isinstance(step, SourceStep):
            facts[step.id] = _source_facts(step, topology)
            continue
        ups = [facts[i] for i in step.inputs]
        up = ups[0]
        sites = frozenset().union(*(u.sites for u in ups))
        out = _Facts(
            scope=up.scope,
            sites=sites,
            key=up.key,
            entity=up.entity,
            event_time=up.event_time,
        )
        _carry(step, out)
        if step.at == "cloud":
            out.scope, out.reason = "global", "pinned to the cloud"
        elif any(u.scope == "global" for u in ups):
            if step.at == "edge":
                raise PlanError(
                    f"step {step.id!r} is pinned at the edge but reads data gathered from "
                    "several sites; pin an earlier step, or remove at: edge"
                )
            out.scope, out.reason = "global", "reads data gathered from several sites"
        else:
            out.scope, out.reason = _local_or_global(step, ups, out)
        facts[step.id] = out
    return facts


def _source_facts(step: SourceStep, topology: Topology) -> _Facts:
    sites = frozenset(n.site for n in topology.hosts_of(step.stream))
    out = _Facts(
        scope="local",
        sites=sites,
        key=(step.key,) if step.key else (),
        entity=frozenset({step.key}) if step.key else frozenset(),
        event_time=(step.event_time, step.max_out_of_orderness) if step.event_time else None,
    )
    if step.at == "cloud":
        out.scope, out.reason = "global", "pinned to the cloud"
    elif not sites:
        out.scope, out.reason = "global", f"no node declares stream {step.stream}"
    else:
        out.reason = f"reads {step.stream} where it is born ({_site_list(sites)})"
    return out


def _carry(step: Step, out: _Facts) -> None:
    """How a step changes the key, the entity fields and event time."""
    if isinstance(step, KeyByStep):
        out.key = step.key
    elif isinstance(step, EventTimeStep):
        out.event_time = (step.field, step.max_out_of_orderness)
    elif isinstance(step, SelectStep):
        kept = {c.strip() for c in step.columns}
        out.entity = frozenset(f for f in out.entity if f in kept)
        out.key = out.key if all(k in kept for k in out.key) else ()
        if out.event_time and out.event_time[0] not in kept:
            out.event_time = None
    elif isinstance(step, MapStep | FlatMapStep):
        replaced = set(step.columns or {}) if isinstance(step, MapStep) else set()
        schema = step.schema_ if step.function else None
        if schema is not None:
            replaced |= {f for f in out.entity if f not in schema}
        out.entity = frozenset(f for f in out.entity if f not in replaced)
    elif isinstance(step, WindowStep | AverageStep):
        key = out.key if isinstance(step, WindowStep) or step.key is None else (step.key,)
        out.key, out.event_time = key, None
        out.entity = frozenset(f for f in out.entity if f in key)
    elif isinstance(step, CountStep):
        out.key = (step.key,) if step.key else out.key
        out.entity = frozenset(f for f in out.entity if f in out.key)
        out.event_time = None


def _local_or_global(step: Step, ups: list[_Facts], out: _Facts) -> tuple[Scope, str]:
    if isinstance(step, UnionStep):
        if len({u.sites for u in ups}) == 1:
            return "local", "its inputs come from the same sites"
        return "global", "joins streams born at different sites"
    if isinstance(step, SinkStep):
        return "local", f"writes where its input is computed ({_site_list(out.sites)})"
    if not isinstance(step, WindowStep | DeduplicateStep | CountStep | AverageStep):
        return "local", f"record by record, where its data is ({_site_list(out.sites)})"
    if step.at == "edge":
        return "local", "pinned at the edge: state per site"
    if len(out.sites) <= 1:
        return "local", f"all of its input is at {_site_list(out.sites)}"
    key = ups[0].key if not isinstance(step, DeduplicateStep) else step.key
    if isinstance(step, CountStep) and step.key:
        key = (step.key,)
    entity = sorted(set(key) & ups[0].entity)
    if entity:
        return "local", f"keyed by {', '.join(entity)}, which is born at one site"
    if _splittable(step):
        return "global", "split: partial aggregates at each site, merged where they meet"
    return "global", f"keyed by {list(key) or 'nothing'}, which may span sites"


def _splittable(step: Step) -> bool:
    return (
        isinstance(step, WindowStep)
        and step.aggregates is not None
        and step.emit == "final"
        and step.kind != "session"
    )


def _with_split_windows(
    spec: PipelineSpec, facts: dict[str, _Facts]
) -> tuple[PipelineSpec, dict[str, _Facts]]:
    """The planned pipeline: every split window becomes ``<id>__partial`` (local) →
    ``<id>`` (a global merge), so downstream steps still read ``<id>``."""
    steps: list[Step] = []
    out = dict(facts)
    for step in spec.steps:
        f = facts[step.id]
        if not (f.reason.startswith("split:") and isinstance(step, WindowStep)):
            steps.append(step)
            continue
        partial_id = _step_id(step.id, "partial")
        # Pins on a split window hold for its merge; the partial is a cheap pre-aggregation
        # that runs wherever the site's data is.
        partial = {"id": partial_id, "partial": True, "at": None, "node_tags": ()}
        steps.append(step.model_copy(update=partial))
        key = facts[step.inputs[0]].key
        merge = MergeStep(
            id=step.id,
            inputs=(partial_id,),
            key=key,
            aggregates=dict(step.aggregates or {}),
            node_tags=step.node_tags,
        )
        steps.append(merge)
        out[partial_id] = _Facts(
            "local", f.sites, key, f.entity, None, "partial aggregates at each site"
        )
        out[step.id] = _Facts("global", f.sites, key, f.entity, None, f.reason)
    plan = spec.model_copy(update={"steps": tuple(steps)})
    return plan, out


def _step_id(base: str, suffix: str) -> str:
    """``<base>__<suffix>``, shortened with a hash when it would pass 64 characters."""
    text = f"{base}__{suffix}"
    if len(text) <= 64:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{text[:55]}_{digest}"


# -- fragments ----------------------------------------------------------------------------
def _whole(
    spec: PipelineSpec, plan: PipelineSpec, facts: dict[str, _Facts], sites: list[str]
) -> Fragment:
    """No split needed: the pipeline as written, in one fragment."""
    site = sites[0] if sites else None
    return Fragment(
        id=Fragment.make_id(spec.name, 0),
        pipeline=spec.name,
        spec=spec,
        input_streams=tuple(dict.fromkeys(s.stream for s in spec.sources())),
        kind="local" if site else "global",
        site=site,
        input_sites=tuple(sorted({s for f in facts.values() for s in f.sites})),
        steps=tuple(s.id for s in spec.steps),
        cloud=any(s.at == "cloud" for s in spec.steps),
        node_tags=_tags(spec.steps),
    )


def _tags(steps: tuple[Step, ...] | list[Step]) -> tuple[str, ...]:
    return tuple(sorted({t for s in steps for t in s.node_tags}))


def cut_stream(pipeline: str, step_id: str) -> str:
    """The planner-owned stream a step's output crosses sites on."""
    return f"SF_{pipeline}_{step_id}"


def cut_subject(pipeline: str, step_id: str, site: str) -> str:
    return f"{CUT_SUBJECT_PREFIX}.{pipeline}.{step_id}.{site}"


def _cuts(plan: PipelineSpec, facts: dict[str, _Facts]) -> list[str]:
    """Local steps that feed a global step: their output crosses to the global group."""
    out: list[str] = []
    for step in plan.steps:
        if facts[step.id].scope != "global":
            continue
        for up in step.inputs:
            if facts[up].scope == "local" and up not in out:
                out.append(up)
    return out


def _local(plan: PipelineSpec, facts: dict[str, _Facts], site: str, topo: Topology) -> Fragment:
    steps: list[Step] = []
    streams: list[str] = []
    for step in plan.steps:
        f = facts[step.id]
        if f.scope != "local" or site not in f.sites:
            continue
        if isinstance(step, SourceStep):
            streams.append(step.stream)
            step = _at_site(step, site, topo)
        steps.append(step)
    own = tuple(s.id for s in steps)
    for cut in _cuts(plan, facts):
        if site in facts[cut].sites:
            steps.append(
                SinkStep(
                    id=_step_id(cut, "out"),
                    inputs=(cut,),
                    kind="jetstream",
                    stream=cut_stream(plan.name, cut),
                    subject=cut_subject(plan.name, cut, site),
                    trigger=_cut_trigger(plan, cut),
                )
            )
    spec = plan.model_copy(update={"steps": tuple(steps), "fragment": f"at-{site}"})
    return Fragment(
        id=f"{plan.name}.at-{site}",
        pipeline=plan.name,
        spec=_checked(spec),
        input_streams=tuple(dict.fromkeys(streams)),
        kind="local",
        site=site,
        input_sites=(site,),
        steps=own,
        node_tags=_tags(steps),
    )


def _cut_trigger(plan: PipelineSpec, cut: str) -> float | None:
    """The interval a cut's query can batch at: that of the fastest sink it feeds.

    A cut feeding only slow sinks (10 s windows on a 10 s trigger) need not cross every
    pipeline trigger; one feeding any sink on the pipeline's trigger keeps it (None)."""
    reached = {cut}
    for step in plan.topological():
        if reached.intersection(step.inputs):
            reached.add(step.id)
    triggers = [plan.trigger_of(s) for s in plan.sinks() if s.id in reached]
    fastest = min(triggers, default=plan.trigger)
    return None if fastest == plan.trigger else fastest


def _at_site(step: SourceStep, site: str, topo: Topology) -> SourceStep:
    """A site's replica of a source: it reads (and, if it must create the stream,
    captures) only the subjects born at the site. Capturing the pipeline's wider
    subjects would make a site with its own server pull every other site's data."""
    hosted = tuple(
        subject
        for node in topo.hosts_of(step.stream)
        if node.site == site
        for h in node.streams
        if h.name == step.stream
        for subject in h.subjects
    )
    update: dict[str, object] = {"filter_subjects": _site_subjects(step, site, topo)}
    if hosted:
        update["subjects"] = tuple(dict.fromkeys(hosted))
    return step.model_copy(update=update)


def _site_subjects(step: SourceStep, site: str, topo: Topology) -> tuple[str, ...]:
    """The subjects of ``step.stream`` born at ``site``: what that site's replica reads.

    One site hosting the stream reads all of it; several must each declare subjects,
    or a replica could not tell its records from another site's."""
    hosts = topo.hosts_of(step.stream)
    if len({n.site for n in hosts}) <= 1:
        return ()
    subjects: list[str] = []
    for node in hosts:
        if node.site != site:
            continue
        for hosted in node.streams:
            if hosted.name == step.stream:
                if not hosted.subjects:
                    raise PlanError(
                        f"source {step.id!r}: stream {step.stream} is hosted at several sites, "
                        f"so node {node.name} must list the subjects its site publishes on "
                        f"(e.g. subjects: ['{step.stream.lower()}.{site}.>'])"
                    )
                subjects.extend(hosted.subjects)
    return tuple(dict.fromkeys(subjects))


def _global(plan: PipelineSpec, facts: dict[str, _Facts], topo: Topology) -> Fragment:
    steps: list[Step] = []
    renamed: dict[str, str] = {}
    input_sites: set[str] = set()
    for cut in _cuts(plan, facts):
        f = facts[cut]
        input_sites |= f.sites
        head, added = _cut_sources(plan, cut, f, topo)
        steps.extend(added)
        renamed[cut] = head
    streams: list[str] = [cut_stream(plan.name, c) for c in renamed]
    for step in plan.steps:
        f = facts[step.id]
        if f.scope != "global":
            continue
        if isinstance(step, SourceStep):
            streams.append(step.stream)
            input_sites |= f.sites
        inputs = tuple(renamed.get(i, i) for i in step.inputs)
        steps.append(step.model_copy(update={"inputs": inputs}) if inputs != step.inputs else step)
    spec = plan.model_copy(update={"steps": tuple(steps), "fragment": "global"})
    return Fragment(
        id=f"{plan.name}.global",
        pipeline=plan.name,
        spec=_checked(spec),
        input_streams=tuple(dict.fromkeys(streams)),
        kind="global",
        input_sites=tuple(sorted(input_sites)),
        steps=tuple(s.id for s in plan.steps if facts[s.id].scope == "global"),
        cloud=any(s.at == "cloud" for s in steps),
        node_tags=_tags(steps),
        plan=plan,
    )


def _cut_sources(plan: PipelineSpec, cut: str, f: _Facts, topo: Topology) -> tuple[str, list[Step]]:
    """One source per site for a cut's output (+ a union, + the key): the step id that
    now stands for ``cut`` in the global group, and the steps added.

    A site with its own NATS server keeps the cut stream in its own JetStream domain
    (buffered on its disk while the uplink is down); the reader sources it from there."""
    partial = isinstance(plan.step(cut), WindowStep)
    if partial:
        event_time: tuple[str, float] | None = ("window_end", WATERMARK_EPSILON)
    else:
        event_time = f.event_time
    added: list[Step] = []
    for site in sorted(f.sites):
        own = topo.site(site)
        added.append(
            SourceStep(
                id=_step_id(cut, f"from_{site}"),
                stream=cut_stream(plan.name, cut),
                subjects=(cut_subject(plan.name, cut, site),),
                filter_subjects=(cut_subject(plan.name, cut, site),),
                source_domain=site if own is not None and own.nats_url else None,
                schema_of=cut,
                event_time=event_time[0] if event_time else None,
                max_out_of_orderness=event_time[1] if event_time else 0.0,
            )
        )
    head = added[0].id
    if len(added) > 1:
        union = UnionStep(id=_step_id(cut, "union"), inputs=tuple(s.id for s in added))
        added.append(union)
        head = union.id
    if f.key:
        key_by = KeyByStep(id=_step_id(cut, "key"), inputs=(head,), key=f.key)
        added.append(key_by)
        head = key_by.id
    return head, added


def _checked(spec: PipelineSpec) -> PipelineSpec:
    """Re-validate a fragment's spec: a planner bug must fail here, not on a node."""
    return PipelineSpec.model_validate(spec.model_dump(by_alias=True))
