"""Registry room: sites, links and nodes — who is in the cluster and what each offers.

Pure decisions: each function takes a :class:`~spanflow.control.state.Draft` (the state
plus the time of the request), adds the records it decides and returns what the caller
answers with, or raises a :mod:`spanflow.control.errors` error.
"""

from __future__ import annotations

from pydantic import ValidationError

from spanflow.control import records as r
from spanflow.control.errors import Conflict, Invalid, NotFound
from spanflow.control.requests import Registration
from spanflow.control.state import ClusterState, Draft
from spanflow.protocol.messages import ScaleReport
from spanflow.protocol.rest import Connection
from spanflow.spec.cluster import NodeRecord, NodeState
from spanflow.spec.retention import DEFAULT_RETENTION
from spanflow.spec.topology import Capabilities, Link, NodeSpec, Site, Topology


def node(state: ClusterState, name: str) -> NodeRecord:
    record = state.nodes.get(name)
    if record is None:
        raise NotFound("no_node", f"no node {name!r}")
    return record


def merge_topology(tx: Draft, given: Topology) -> None:
    """A topology file: its sites, links and node specs win; node states stay."""
    before = tx.state.topology
    merged = Topology(
        name=given.name,
        sites=tuple({s.name: s for s in (*before.sites, *given.sites)}.values()),
        links=tuple({lk.key(): lk for lk in (*before.links, *given.links)}.values()),
    )
    if merged != before:
        tx.add(r.TopologyApplied, name=given.name, sites=given.sites, links=given.links)
    for spec in given.nodes:
        _declare(tx, spec)


def _declare(tx: Draft, spec: NodeSpec) -> None:
    """A node's spec as the topology gives it (its site, capabilities, the streams it
    hosts); an agent already registered under the name keeps its state."""
    old = tx.state.nodes.get(spec.name)
    if old is not None and old.spec == spec:
        return
    declared = NodeRecord(
        spec=spec,
        state=old.state if old else NodeState.DECLARED,
        agent_id=old.agent_id if old else None,
        host=old.host if old else None,
        since=old.since if old else tx.at,
    )
    tx.add(r.NodeDeclared, node=declared)


def _at_its_site(state: ClusterState, name: str, site: str) -> NodeRecord | None:
    """The node ``name`` as known (None: new), checked to be at ``site``: a site the
    topology has (422), and the node's own if it is known (409)."""
    site_names = [s.name for s in state.topology.sites]
    if site not in site_names:
        raise Invalid(
            "unknown_site", f"unknown site {site!r} (sites: {', '.join(site_names) or 'none'})"
        )
    old = state.nodes.get(name)
    if old is not None and old.spec.site != site:
        raise Conflict(
            "wrong_site", f"node {name!r} belongs to site {old.spec.site!r}, not {site!r}"
        )
    return old


def register(tx: Draft, reg: Registration) -> NodeRecord:
    """An agent started: the node is alive with what it (or the topology) declares."""
    old = _at_its_site(tx.state, reg.name, reg.site)
    base = old.spec if old is not None else None
    caps = reg.capabilities or (base.capabilities if base else None) or reg.detected
    try:
        spec = NodeSpec(
            name=reg.name,
            site=reg.site,
            capabilities=caps or Capabilities(),
            streams=reg.streams if reg.streams is not None else (base.streams if base else ()),
            local=base.local if base else False,
        )
    except ValidationError as exc:
        raise Invalid("invalid_node", str(exc)) from None
    record = NodeRecord(
        spec=spec,
        state=NodeState.ALIVE,
        agent_id=reg.agent_id,
        host=reg.host,
        since=tx.at,
        gossip=reg.gossip,
    )
    tx.add(r.NodeRegistered, node=record, rejoined=old is not None)
    return record


def drain(tx: Draft, name: str) -> bool:
    """Mark a node draining; False when it already was (nothing to decide)."""
    if node(tx.state, name).state == NodeState.DRAINING:
        return False
    tx.add(r.NodeDrained, node=name, reason="drained by request")
    return True


def remove(tx: Draft, name: str) -> None:
    node(tx.state, name)
    tx.add(r.NodeRemoved, node=name)


def update_capabilities(tx: Draft, name: str, caps: Capabilities) -> None:
    node(tx.state, name)
    tx.add(r.NodeCapabilitiesChanged, node=name, capabilities=caps)


def scaled(tx: Draft, name: str, report: ScaleReport) -> None:
    """Record a node's new executor allocation (refused for a node that does not run,
    or a total outside the bounds it reports)."""
    record = node(tx.state, name)
    if record.state != NodeState.ALIVE:
        raise Conflict("node_not_alive", f"node {name!r} is {record.state.value}, not alive")
    if not report.min_executors <= report.executors <= report.max_executors:
        raise Invalid(
            "executors_out_of_bounds",
            f"{report.executors} executors is outside {report.min_executors}:"
            f"{report.max_executors}",
        )
    bounds = {"min_executors", "max_executors"}
    tx.add(r.NodeScaled, node=name, **report.model_dump(exclude=bounds))


def put_site(tx: Draft, site: Site) -> None:
    tx.add(r.SitePut, site=site)


def put_node(tx: Draft, spec: NodeSpec) -> None:
    """Declare a node, or change one's spec (the streams it hosts: a plant's readings
    stream), at a site the topology has; running pipelines that read one of its streams
    take the site in (:func:`spanflow.control.pipelines.follow_sites`)."""
    _at_its_site(tx.state, spec.name, spec.site)
    _declare(tx, spec)


def put_link(tx: Draft, link: Link) -> None:
    known = {s.name for s in tx.state.topology.sites}
    for end in link.between:
        if end not in known:
            raise Invalid("unknown_site", f"link names unknown site {end!r}")
    tx.add(r.LinkPut, link=link)


def connection_for(
    state: ClusterState,
    name: str,
    nats_url: str,
    hub_domain: str | None,
    replicas: int | None = None,
) -> Connection:
    """Which NATS server a node uses and where the control plane's JetStream is: the
    site's own server (a leaf node) with the hub's domain, or the cluster's; and the
    limits of the streams it creates (its site's; on the cluster's servers, at least
    ``replicas`` copies)."""
    record = node(state, name)
    site = state.topology.site(record.spec.site)
    own = site.nats_url if site is not None else None
    retention = site.retention if site is not None else DEFAULT_RETENTION
    if not own and replicas and replicas > (retention.replicas or 0):
        retention = retention.model_copy(update={"replicas": replicas})
    return Connection(
        nats_url=own or nats_url,
        control_domain=hub_domain if own else None,
        site_domain=record.spec.site if own else None,
        retention=retention,
        partition=partition_of(state, name),
        gossip_peers=gossip_peers(state, name),
    )


def partition_of(state: ClusterState, name: str) -> str:
    """The membership partition a node gossips in: its site's ``partition`` (or the
    site's name)."""
    site_name = node(state, name).spec.site
    site = state.topology.site(site_name)
    return site.partition_name if site is not None else site_name


def gossip_peers(state: ClusterState, name: str) -> list[str]:
    """Membership endpoints of the other live nodes of ``name``'s partition: the seeds
    its agent joins through."""
    partition = partition_of(state, name)
    return sorted(
        n.gossip
        for n in state.nodes.values()
        if n.name != name
        and n.gossip
        and n.state in (NodeState.ALIVE, NodeState.DRAINING)
        and partition_of(state, n.name) == partition
    )
