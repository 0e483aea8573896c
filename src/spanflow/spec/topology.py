"""The network a cluster runs on: sites, nodes, the streams they host, and the links
between sites.

A topology is written once (a YAML file, see ``docs/topology.md``) and then changed
live through the coordinator's API as nodes join, leave or change. The planner reads
it for data locality (which node hosts which stream), capability (cores, memory,
accelerators, tags) and distance (the latency and bandwidth of each site link).

>>> topo = Topology.model_validate({
...     "name": "t",
...     "sites": [{"name": "edge-a", "kind": "edge"}, {"name": "cloud", "kind": "cloud"}],
...     "nodes": [{"name": "a1", "site": "edge-a"}, {"name": "c1", "site": "cloud"}],
...     "links": [{"between": ["edge-a", "cloud"], "latency": "30ms"}]})
>>> topo.latency("edge-a", "cloud")
0.03
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spanflow.spec.durations import Duration
from spanflow.spec.retention import DEFAULT_RETENTION, Retention
from spanflow.spec.schema import Schema, StreamFormat, estimated_json_bytes

NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
"""Site and node names: they become NATS subject tokens and KV keys, so no dots."""

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


DEFAULT_RECORD_BYTES = 200
"""Bytes per record assumed for a stream with a rate but no schema or record_bytes."""

MESSAGE_OVERHEAD_BYTES = 100
"""What a JetStream message adds to its payload on a link: the subject, the
``Nats-Msg-Id`` header and the protocol line (measured ≈90 bytes for spanflow's cut
subjects and ids)."""


def memory_mb(value: Any) -> Any:
    """MiB from a size like ``"512m"`` or ``"4g"``; anything else as given (a number is
    MiB already; pydantic checks the rest).

    >>> memory_mb("4g"), memory_mb("512m"), memory_mb(100)
    (4096, 512, 100)
    """
    if isinstance(value, str):
        match = _MEMORY.match(value)
        if not match:
            raise ValueError(f"memory {value!r} is not a size like 512m or 4g")
        return int(float(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()])
    return value


class SiteKind(StrEnum):
    EDGE = "edge"
    CLOUD = "cloud"


class Site(BaseModel):
    """A place with its own network: a factory, a shop, a vehicle depot, a cloud region."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME, max_length=64)
    kind: SiteKind = SiteKind.EDGE
    partition: str | None = Field(
        default=None,
        pattern=NAME,
        description="Gossip/failure-detection partition; defaults to the site's name.",
    )
    nats_url: str | None = Field(
        default=None,
        pattern=r"^(nats|tls)://\S+$",
        description="The site's own NATS server, a leaf node of the hub with JetStream "
        "domain = the site's name. Its nodes read and buffer their data there, so the "
        "site keeps working while its uplink is down. None: the cluster's server.",
    )
    state: str | None = Field(
        default=None,
        min_length=1,
        description="Where fragments placed at this site keep checkpoints and savepoints: "
        "a directory its nodes share, or a Hadoop URL (jetstream://<store>/<path>: the "
        "site's own NATS; hdfs://...). None: the coordinator's --state-dir.",
    )
    retention: Retention = Field(
        default=DEFAULT_RETENTION,
        description="Limits of every stream spanflow creates on this site's nodes "
        "(see spanflow.spec.retention): max_age, max_bytes, discard (new or old).",
    )

    @property
    def partition_name(self) -> str:
        return self.partition or self.name


class HostedStream(BaseModel):
    """A JetStream stream that lives on a node: where data is born."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="JetStream stream name.")
    subjects: tuple[str, ...] = ()
    format: StreamFormat = StreamFormat.JSON
    schema_: Schema = Field(default_factory=dict, alias="schema")
    key: str | None = None
    event_time: str | None = None
    retention: Retention | None = Field(
        default=None, description="This stream's limits; default: its site's."
    )
    rate: float | None = Field(
        default=None,
        gt=0,
        description="Records per second published here at the busiest (optional): the "
        "planner checks what a fragment would ship across a site link against the "
        "link's bandwidth_mbps.",
    )
    record_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Bytes per record on the wire; default: estimated from the schema as "
        "JSON (spanflow.spec.schema.estimated_json_bytes), 200 without a schema.",
    )

    def bytes_per_second(self) -> float | None:
        """What this stream carries at its declared rate, message overhead included
        (None: no rate declared)."""
        if self.rate is None:
            return None
        size = self.record_bytes
        if size is None:
            size = estimated_json_bytes(self.schema_) if self.schema_ else DEFAULT_RECORD_BYTES
        return self.rate * (size + MESSAGE_OVERHEAD_BYTES)


class Capabilities(BaseModel):
    """What a node can run. ``slots`` is how many fragments it takes at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cores: int = Field(default=2, ge=1, le=4096)
    memory_mb: int = Field(default=2048, ge=64, description="Memory; '4g' and '512m' accepted.")
    accelerators: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    slots: int | None = Field(default=None, ge=0, le=4096, description="Default: cores.")
    realtime_slots: int = Field(
        default=4,
        ge=0,
        le=4096,
        description="Spark task slots for Real-Time Mode queries, above the cores: each "
        "holds 1 (stateless) or 2 (keyed) for its whole batch (docs/realtime.md).",
    )

    @field_validator("memory_mb", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        return memory_mb(value)

    @property
    def fragment_slots(self) -> int:
        return self.cores if self.slots is None else self.slots

    def slots_for(self, need: int) -> int:
        """The slots a fragment needing ``need`` takes here: never more than the node
        has, so an idle node can take any fragment (it is then full). A node with no
        slots still counts one, and so takes nothing."""
        return max(1, min(need, self.fragment_slots))


class NodeSpec(BaseModel):
    """One machine (or container) that runs a node agent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME, max_length=64)
    site: str = Field(pattern=NAME, max_length=64)
    capabilities: Capabilities = Field(default_factory=Capabilities)
    streams: tuple[HostedStream, ...] = Field(default=(), description="Streams born here.")
    local: bool = Field(default=False, description="`spanflow up` starts this node here.")

    @model_validator(mode="before")
    @classmethod
    def _no_sinks(cls, data: Any) -> Any:
        """``sinks`` was accepted and never used: the systems a site reaches are
        ``externals[]``. An empty list (as older records store it) is dropped."""
        if isinstance(data, dict) and "sinks" in data:
            data = dict(data)
            if data.pop("sinks"):
                raise ValueError(
                    "'sinks' is no longer a node field (it was never used): declare the "
                    "systems a site's nodes can write to under externals: with the sites "
                    "that reach them (docs/topology.md#sections)"
                )
        return data

    def hosts(self, stream: str) -> bool:
        return any(s.name == stream for s in self.streams)


class Link(BaseModel):
    """The network between two sites (symmetric)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    between: tuple[str, str]
    latency: Duration = Field(default=0.0, ge=0, description="One-way latency.")
    bandwidth_mbps: float = Field(default=1000.0, gt=0, description="Megabits per second.")

    @model_validator(mode="after")
    def _two_sites(self) -> Link:
        if self.between[0] == self.between[1]:
            raise ValueError("a link joins two different sites")
        return self

    def key(self) -> frozenset[str]:
        return frozenset(self.between)


class External(BaseModel):
    """A system outside spanflow (a Kafka cluster, a database, an object store) and the
    sites whose nodes can reach it: the planner runs a fragment that reads or writes it
    at one of those sites."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME, max_length=64)
    type: str = Field(description="Its connector: kafka, postgres, s3, mongodb, webhook.")
    sites: tuple[str, ...] = Field(min_length=1, description="Sites that can reach it.")
    address: str | None = Field(
        default=None,
        description="Where it is ('host:port[,host:port]', a URL or DSN): a source or sink "
        "whose options point there is taken to use it (or name it with 'external:').",
    )


def addresses_of(text: str) -> frozenset[str]:
    """``host:port`` pairs a bootstrap list, URL, URI or DSN points at (lowercase; a URL
    without a port gets its scheme's).

    >>> sorted(addresses_of("postgresql://u@DB.example:5433/plant"))
    ['db.example:5433']
    >>> sorted(addresses_of("k1:9092, k2:9092"))
    ['k1:9092', 'k2:9092']
    >>> sorted(addresses_of("https://alerts.example/hook"))
    ['alerts.example:443']
    """
    defaults = {"http": 80, "https": 443, "postgresql": 5432, "postgres": 5432,
                "mongodb": 27017}  # fmt: skip
    scheme, sep, rest = text.partition("://")
    if not sep:
        rest, scheme = text, ""
    hosts = rest.split("/")[0].split("@")[-1]
    if "host=" in text and not sep:  # a key=value DSN
        fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
        hosts = f"{fields.get('host', '')}:{fields.get('port', 5432)}"
    out = set()
    for host in hosts.split(","):
        host = host.strip().lower()
        if not host:
            continue
        if ":" not in host and scheme in defaults:
            host = f"{host}:{defaults[scheme]}"
        out.add(host)
    return frozenset(out)


class Topology(BaseModel):
    """Sites, nodes and links, checked for consistency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(default="spanflow", pattern=NAME, max_length=64)
    sites: tuple[Site, ...] = ()
    nodes: tuple[NodeSpec, ...] = ()
    links: tuple[Link, ...] = ()
    externals: tuple[External, ...] = Field(
        default=(), description="Systems outside spanflow and the sites that reach them."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        problems: list[str] = []
        site_names = [s.name for s in self.sites]
        external_names = [e.name for e in self.externals]
        for dup in sorted({n for n in external_names if external_names.count(n) > 1}):
            problems.append(f"external {dup!r} is declared twice")
        for ext in self.externals:
            for site in ext.sites:
                if site not in site_names:
                    problems.append(f"external {ext.name!r} names unknown site {site!r}")
        for dup in sorted({n for n in site_names if site_names.count(n) > 1}):
            problems.append(f"site {dup!r} is declared twice")
        node_names = [n.name for n in self.nodes]
        for dup in sorted({n for n in node_names if node_names.count(n) > 1}):
            problems.append(f"node {dup!r} is declared twice")
        for node in self.nodes:
            if node.site not in site_names:
                problems.append(
                    f"node {node.name!r} is in unknown site {node.site!r} "
                    f"(sites: {', '.join(site_names) or 'none'})"
                )
        seen: set[frozenset[str]] = set()
        for link in self.links:
            for end in link.between:
                if end not in site_names:
                    problems.append(f"link {'-'.join(link.between)} names unknown site {end!r}")
            if link.key() in seen:
                problems.append(f"link {'-'.join(link.between)} is declared twice")
            seen.add(link.key())
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # -- queries -----------------------------------------------------------------------
    def site(self, name: str) -> Site | None:
        return next((s for s in self.sites if s.name == name), None)

    def node(self, name: str) -> NodeSpec | None:
        return next((n for n in self.nodes if n.name == name), None)

    def latency(self, a: str, b: str) -> float | None:
        """One-way latency between two sites (0 within a site; None if not linked)."""
        if a == b:
            return 0.0
        for link in self.links:
            if link.key() == {a, b}:
                return link.latency
        return None

    def bandwidth_mbps(self, a: str, b: str) -> float | None:
        """Megabits per second between two sites (None within a site: no link to fill,
        or when they are not linked)."""
        if a == b:
            return None
        for link in self.links:
            if link.key() == {a, b}:
                return link.bandwidth_mbps
        return None

    def hosts_of(self, stream: str) -> list[NodeSpec]:
        return [n for n in self.nodes if n.hosts(stream)]

    def external(self, name: str) -> External | None:
        return next((e for e in self.externals if e.name == name), None)

    def external_at(self, connector: str, addresses: frozenset[str]) -> External | None:
        """The declared external of this connector type that the addresses point at."""
        for ext in self.externals:
            if ext.type == connector and ext.address and addresses & addresses_of(ext.address):
                return ext
        return None

    # -- live changes (each returns a new, validated topology) --------------------------
    def with_node(self, node: NodeSpec) -> Topology:
        nodes = [n for n in self.nodes if n.name != node.name]
        return Topology.model_validate({**self._plain(), "nodes": [*nodes, node]})

    def without_node(self, name: str) -> Topology:
        return Topology.model_validate(
            {**self._plain(), "nodes": [n for n in self.nodes if n.name != name]}
        )

    def with_link(self, link: Link) -> Topology:
        links = [lk for lk in self.links if lk.key() != link.key()]
        return Topology.model_validate({**self._plain(), "links": [*links, link]})

    def with_site(self, site: Site) -> Topology:
        sites = [s for s in self.sites if s.name != site.name]
        return Topology.model_validate({**self._plain(), "sites": [*sites, site]})

    def _plain(self) -> dict[str, Any]:
        return {"name": self.name, "sites": self.sites, "nodes": self.nodes, "links": self.links}
