"""Compile a pipeline into fragments: local groups at every site that hosts its input,
and a global group where several sites' data meet.

SpanEdge's split, decided step by step from the topology and from what each step
type declares about itself (its traits, see :mod:`spanflow.spec.steps.base`):

* record-at-a-time steps (filter, select, map, ...) run where their input is; a
  union or join of streams born at different sites is global;
* a keyed step (window, de-duplication, running aggregate, keyed processor, join,
  count window) stays local when all its input comes from one site, when its state
  key is born at one site (a device is born at one site, so its state is too), or
  when it is pinned ``at: edge``;
* a keyed step that can split (a final window of count/sum/avg/min/max) is *split*
  over several sites: each site aggregates its own records (avg travels as sum +
  count) and a ``merge`` step in the global group folds the sites' partials into
  exactly the unsplit values;
* anything else that needs several sites' data, and every step after it, is global.

Where a local step feeds a global one, the local fragment publishes to a planner-owned
stream (``SF_<pipeline>_<step>``, one subject per site) and the global fragment reads
each site's part as its own source. Spark keeps the minimum watermark of unioned
sources, so a window closes only when every site has passed it: a late site (a cut
uplink) delays global results but never loses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from spanflow.errors import SpecError
from spanflow.plan.traffic import pulled, step_traffic
from spanflow.protocol.names import CUT_SUBJECT_PREFIX as CUT_SUBJECT_PREFIX
from spanflow.spec.cluster import Fragment
from spanflow.spec.pipeline import PipelineSpec
from spanflow.spec.steps import Placement, Step, StepBase, StreamFacts, derived_id
from spanflow.spec.steps.io import SinkStep, SourceStep
from spanflow.spec.steps.stateless import KeyByStep, UnionStep
from spanflow.spec.topology import External, Topology, addresses_of

Scope = Literal["local", "global"]


class PlanError(SpecError):
    """A pipeline cannot be split as asked (the message names the step and why)."""

    code = "plan_error"


@dataclass
class _Facts:
    """What the planner knows about a step's output: where it is computed, at which
    sites its data is born, and what the step itself declares (:class:`StreamFacts`)."""

    scope: Scope
    sites: frozenset[str]
    key: tuple[str, ...] = ()
    entity: frozenset[str] = frozenset()
    event_time: tuple[str, float] | None = None
    reason: str = ""

    @classmethod
    def of(cls, scope: Scope, sites: frozenset[str], stream: StreamFacts, reason: str) -> _Facts:
        return cls(scope, sites, stream.key, stream.entity, stream.event_time, reason)

    @property
    def stream(self) -> StreamFacts:
        return StreamFacts(self.key, self.entity, self.event_time)


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
    ...   {"id": "out", "type": "sink", "connector": "console", "inputs": ["in"]}]})
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
    plan, facts = _analyse(spec.expanded(), topology)
    reasons = {s.id: facts[s.id].reason for s in plan.steps}
    scopes = {s.id: facts[s.id].scope for s in plan.steps}
    local_sites = sorted({s for f in facts.values() if f.scope == "local" for s in f.sites})
    has_global = any(f.scope == "global" for f in facts.values())
    if len(local_sites) + has_global <= 1:
        fragments = [_whole(spec, plan, facts, local_sites, topology)]
    else:
        fragments = [_local(plan, facts, site, topology) for site in local_sites]
        if has_global:
            fragments.append(_global(plan, facts, topology))
    needs = _NodeNeeds(plan, facts, topology)
    return CompiledPipeline(spec, plan, [needs.of(f) for f in fragments], reasons, scopes)


class _NodeNeeds:
    """What a fragment asks of its node besides tags and accelerators: the most cores
    and memory any of its steps is pinned to, and what it pulls from each input site
    (what a link would carry if it ran at another site)."""

    def __init__(self, plan: PipelineSpec, facts: dict[str, _Facts], topology: Topology) -> None:
        self.sites = {step_id: f.sites for step_id, f in facts.items()}
        self.traffic = step_traffic(plan, self.sites, topology)
        self.cuts = _cuts(plan, facts)
        self.sources = {s.id for s in plan.sources()}

    def of(self, fragment: Fragment) -> Fragment:
        steps = fragment.spec.steps
        boundary = [s for s in fragment.steps if s in self.sources]
        if fragment.kind == "global":
            boundary += self.cuts  # none when the pipeline is one fragment
        traffic = pulled(boundary, self.sites, self.traffic)
        if fragment.kind == "local" and fragment.site is not None:
            traffic = {s: t for s, t in traffic.items() if s == fragment.site}
        return fragment.model_copy(
            update={
                "node_cores": max((s.node_cores or 0 for s in steps), default=0),
                "node_memory_mb": max((s.node_memory_mb or 0 for s in steps), default=0),
                "traffic": traffic,
            }
        )


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


def _analyse(spec: PipelineSpec, topology: Topology) -> tuple[PipelineSpec, dict[str, _Facts]]:
    """Decide each step's scope from what it declares (its traits), and split the steps
    that must be global but can pre-aggregate at each site. Returns the planned
    pipeline (split steps replaced by partial → merge) and the facts of its steps."""
    facts: dict[str, _Facts] = {}
    splits: dict[str, tuple[StepBase, ...]] = {}
    for step in spec.topological():
        if isinstance(step, SourceStep):
            facts[step.id] = _source_facts(step, topology)
            continue
        ups = [facts[i] for i in step.inputs]
        streams = [u.stream for u in ups]
        sites = frozenset().union(*(u.sites for u in ups))
        out = _Facts.of(ups[0].scope, sites, step.facts(streams), "")
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
        ext = reach_of(step, topology) if isinstance(step, SinkStep) else None
        if ext is not None and out.scope == "local" and not out.sites <= set(ext.sites):
            out.scope = "global"
            where = _site_list(frozenset(ext.sites))
            out.reason = f"writes {step.connector} {ext.name}, reachable only from {where}"  # type: ignore[attr-defined]
        split = step.split(streams) if out.reason.startswith(SPLIT_REASON) else None
        if split is not None:
            partial = split.partial.facts(streams)
            facts[split.partial.id] = _Facts.of(
                "local", sites, partial, "partial aggregates at each site"
            )
            out = _Facts.of("global", sites, split.merge.facts([partial]), out.reason)
            splits[step.id] = (split.partial, split.merge)
        facts[step.id] = out
    steps = [part for step in spec.steps for part in splits.get(step.id, (step,))]
    return spec.model_copy(update={"steps": tuple(steps)}), facts


def _source_facts(step: SourceStep, topology: Topology) -> _Facts:
    if step.stream is None:  # an external system (Kafka, ...): read once, where reachable
        ext = reach_of(step, topology)
        out = _Facts.of("global", frozenset(), step.facts([]), "")
        if ext is None:
            out.reason = (
                f"reads {step.connector}, an external system the topology does not declare "
                "(under externals:), from any node"
            )
        else:
            where = _site_list(frozenset(ext.sites))
            out.reason = f"reads {step.connector} {ext.name}, reachable from {where}"
        return out
    sites = frozenset(n.site for n in topology.hosts_of(step.stream))
    out = _Facts.of("local", sites, step.facts([]), "")
    if step.at == "cloud":
        out.scope, out.reason = "global", "pinned to the cloud"
    elif not sites:
        out.scope, out.reason = "global", f"no node declares stream {step.stream}"
    else:
        out.reason = f"reads {step.stream} where it is born ({_site_list(sites)})"
    return out


SPLIT_REASON = "split: partial aggregates at each site, merged where they meet"


def reach_of(step: Step, topology: Topology) -> External | None:
    """The declared external system a source or sink reads or writes: the one it names
    (``external:``), else the one its options point at (None: none declared)."""
    if not isinstance(step, SourceStep | SinkStep):
        return None
    connector = step.connector
    if step.external:
        ext = topology.external(step.external)
        if ext is None:
            known = ", ".join(e.name for e in topology.externals) or "none"
            raise PlanError(
                f"step {step.id!r} uses external {step.external!r}, which the topology does "
                f"not declare (externals: {known})"
            )
        if ext.type != connector:
            raise PlanError(
                f"step {step.id!r} is a {connector} {step.type_name} but external "
                f"{ext.name!r} is {ext.type}"
            )
        return ext
    address = step.connector_info.address(step.options)
    return topology.external_at(connector, addresses_of(address)) if address else None


def _reach_sites(steps: Sequence[Step], topology: Topology) -> tuple[str, ...] | None:
    """Sites from which every external the steps use is reachable (None: they use none)."""
    reach: set[str] | None = None
    users: list[str] = []
    for step in steps:
        ext = reach_of(step, topology)
        if ext is None:
            continue
        users.append(f"{step.id} ({ext.name}: {', '.join(ext.sites)})")
        reach = set(ext.sites) if reach is None else reach & set(ext.sites)
    if reach is not None and not reach:
        raise PlanError(f"no site reaches every external these steps use: {'; '.join(users)}")
    return None if reach is None else tuple(sorted(reach))


def _local_or_global(step: Step, ups: list[_Facts], out: _Facts) -> tuple[Scope, str]:
    """Scope of a step none of whose inputs is global, from its declared placement."""
    same_sites = len({u.sites for u in ups}) == 1
    if not same_sites:
        return "global", "joins streams born at different sites"
    if type(step).placement is Placement.RECORD:
        if len(ups) > 1:
            return "local", "its inputs come from the same sites"
        return "local", f"{type(step).local_reason} ({_site_list(out.sites)})"
    if step.at == "edge":
        return "local", "pinned at the edge: state per site"
    if len(out.sites) <= 1:
        return "local", f"all of its input is at {_site_list(out.sites)}"
    key = step.state_key([u.stream for u in ups])
    born = [sorted(set(key) & u.entity) for u in ups]
    if all(born):
        return "local", f"keyed by {', '.join(born[0])}, which is born at one site"
    if step.split([u.stream for u in ups]) is not None:
        return "global", SPLIT_REASON
    return "global", f"keyed by {list(key) or 'nothing'}, which may span sites"


# -- fragments ----------------------------------------------------------------------------
def _whole(
    spec: PipelineSpec,
    plan: PipelineSpec,
    facts: dict[str, _Facts],
    sites: list[str],
    topology: Topology,
) -> Fragment:
    """No split needed: the pipeline as written, in one fragment."""
    site = sites[0] if sites else None
    return Fragment(
        id=Fragment.make_id(spec.name, 0),
        pipeline=spec.name,
        spec=spec,
        input_streams=tuple(dict.fromkeys(s.stream for s in spec.sources() if s.stream)),
        kind="local" if site else "global",
        site=site,
        input_sites=tuple(sorted({s for f in facts.values() for s in f.sites})),
        steps=tuple(s.id for s in spec.steps),
        cloud=any(s.at == "cloud" for s in spec.steps),
        node_tags=_tags(spec.steps),
        node_accelerators=_accelerators(spec.steps),
        reach_sites=_reach_sites(spec.steps, topology),
    )


def _tags(steps: tuple[Step, ...] | list[Step]) -> tuple[str, ...]:
    return tuple(sorted({t for s in steps for t in s.node_tags}))


def _accelerators(steps: tuple[Step, ...] | list[Step]) -> tuple[str, ...]:
    return tuple(sorted({a for s in steps for a in s.node_accelerators}))


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
        if isinstance(step, SourceStep) and step.stream:
            streams.append(step.stream)
            step = _at_site(step, site, topo)
        steps.append(step)
    own = tuple(s.id for s in steps)
    for cut in _cuts(plan, facts):
        if site in facts[cut].sites:
            steps.append(
                SinkStep(
                    id=derived_id(cut, "out"),
                    inputs=(cut,),
                    connector="jetstream",
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
        node_accelerators=_accelerators(steps),
        reach_sites=_reach_sites(steps, topo),
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
        for node in topo.hosts_of(step.stream_name)
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
    hosts = topo.hosts_of(step.stream_name)
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
            if step.stream:
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
        node_accelerators=_accelerators(steps),
        reach_sites=_reach_sites(steps, topo),
        plan=plan,
    )


def _cut_sources(plan: PipelineSpec, cut: str, f: _Facts, topo: Topology) -> tuple[str, list[Step]]:
    """One source per site for a cut's output (+ a union, + the key): the step id that
    now stands for ``cut`` in the global group, and the steps added.

    A site with its own NATS server keeps the cut stream in its own JetStream domain
    (buffered on its disk while the uplink is down); the reader sources it from there."""
    event_time = f.event_time  # what the cut step declares (a window: its window_end)
    added: list[Step] = []
    for site in sorted(f.sites):
        own = topo.site(site)
        added.append(
            SourceStep(
                id=derived_id(cut, f"from_{site}"),
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
        union = UnionStep(id=derived_id(cut, "union"), inputs=tuple(s.id for s in added))
        added.append(union)
        head = union.id
    if f.key:
        key_by = KeyByStep(id=derived_id(cut, "key"), inputs=(head,), key=f.key)
        added.append(key_by)
        head = key_by.id
    return head, added


def _checked(spec: PipelineSpec) -> PipelineSpec:
    """Re-validate a fragment's spec: a planner bug must fail here, not on a node."""
    return PipelineSpec.model_validate(spec.model_dump(by_alias=True))
