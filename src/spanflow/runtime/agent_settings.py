"""What a node agent is told (:class:`AgentSettings`) and how patient it is
(:class:`AgentTimings`), both frozen: an agent's behaviour is fixed when it starts.

Every time-out and period of the agent is set here, once, with the reason for its
value. Three profiles: :meth:`AgentTimings.lan` (the default, a site's own network),
:meth:`AgentTimings.wan` (nodes reaching the control plane over a slow or lossy
uplink: more patience before calling something gone) and
:meth:`AgentTimings.local_test` (everything on one machine: reports come sooner).

>>> AgentTimings.lan().reconnect_grace < AgentTimings.wan().reconnect_grace
True
>>> AgentTimings.profile("local_test").progress_every
1.0
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from spanflow.runtime.scaling.policy import ScalingConfig
from spanflow.runtime.shedding.policy import SheddingConfig
from spanflow.spec.topology import Capabilities


@dataclass(frozen=True)
class AgentTimings:
    progress_every: float = 5.0
    """Seconds between progress reports of each running fragment to the activity log."""
    usage_every: float = 10.0
    """Seconds between looks at how full the streams this node uses are (in heartbeats)."""
    usage_timeout: float = 3.0
    """Seconds one stream's usage may take to answer; it keeps its last figure otherwise."""
    sourcing_check_every: float = 1.0
    """Seconds between checks that the copies of other sites' streams flow again after
    their link came back (the broker's own retries wait up to two minutes)."""
    control_patience: float = 15.0
    """Seconds to wait for the control plane's assignments bucket at start."""
    control_patience_offline: float = 2.0
    """The same for an agent that can run without it: started from its saved
    registration (the uplink is likely down) or with its site's copy of its last-known
    assignments; those are not held up for long, and it keeps trying in the background."""
    reconnect_grace: float = 3.0
    """Seconds a node whose NATS connection is re-establishing still reports its data
    path up: a client moves to another server of its site's cluster within a second of
    losing one (0.2 s measured in benchmarks/chaos.py), so losing a NATS server fails no
    node; a node whose own links are down fails within seconds and its fragments move.
    A site whose every server is down fails no node early either: its nodes' peers are
    cut off too, and only a peer the coordinator hears can say a node is disconnected.
    (It was 20 s, sized from JetStream's failover, which a reconnection does not wait
    for.)"""
    rejoin_every: float = 10.0
    """Longest wait between attempts to reach the control plane after starting without it."""
    register_timeout: float = 10.0
    """Seconds one registration request may take (less when the saved registration is
    due sooner: it is used ``offline_after`` seconds in, not a hung request later)."""
    shed_timeout: float = 10.0
    """Seconds a request to move a fragment away may take."""
    report_timeout: float = 10.0
    """Seconds an activity report may take while the control plane is reachable."""
    report_timeout_cut_off: float = 2.0
    """The same while cut off from it: a report never holds the main loop for long."""

    @classmethod
    def lan(cls) -> AgentTimings:
        """A site's own network: the defaults."""
        return cls()

    @classmethod
    def wan(cls) -> AgentTimings:
        """An uplink with long round trips and short outages: twice the patience."""
        return cls(
            control_patience=30.0,
            reconnect_grace=6.0,
            register_timeout=20.0,
            shed_timeout=20.0,
            report_timeout=20.0,
            report_timeout_cut_off=4.0,
        )

    @classmethod
    def local_test(cls) -> AgentTimings:
        """Every process on one machine: progress and usage are reported sooner."""
        return cls(progress_every=1.0, usage_every=2.0, rejoin_every=2.0)

    @classmethod
    def profile(cls, name: str) -> AgentTimings:
        profiles = {"lan": cls.lan, "wan": cls.wan, "local_test": cls.local_test}
        if name not in profiles:
            raise ValueError(f"unknown agent profile {name!r} (one of {', '.join(profiles)})")
        return profiles[name]()


@dataclass(frozen=True)
class AgentSettings:
    name: str
    site: str
    coordinator_url: str
    token: str | None = None
    capabilities: Capabilities | None = None
    master: str | None = None
    offline_after: float = 2.0
    """Seconds without an answer from the coordinator after which a node that has
    registered before starts from its saved registration (it keeps trying in the
    background, and takes the coordinator's answer when it comes). Short: a coordinator
    answers within milliseconds when it can, a restarted edge node with a cut uplink
    should not wait for one, and its Spark session takes longer to start anyway."""
    state_dir: Path | None = None
    """Where the agent keeps its last registration (default: spanflow's data dir)."""
    spark_conf: dict[str, str] = field(default_factory=dict)
    batch_offset: float = 0.0
    """Shift of this node's batch start slots, a fraction of the trigger interval: nodes
    sharing one machine take different ones (:mod:`spanflow.spark.query.stagger`)."""
    nats_url: str | None = None
    """Reach NATS here instead of at the URL the coordinator names (a proxy, a NAT, a
    different route to the same server)."""
    gossip: bool = True
    """Run membership (SWIM) with the other nodes of this node's partition."""
    gossip_bind: str = "127.0.0.1"
    gossip_port: int = 0
    """UDP and TCP port of the membership endpoint (0: a free one)."""
    gossip_advertise: str | None = None
    """The address peers reach it at, when not the bind address (NAT, 0.0.0.0)."""
    gossip_profile: str | None = None
    """``lan``, ``wan`` or ``local_test``; None: the coordinator's choice."""
    shedding: SheddingConfig = field(default_factory=SheddingConfig)
    """When this node asks a peer to take one of its fragments (docs/balancing.md)."""
    scaling: ScalingConfig | None = None
    """On a Spark cluster: the executors it holds and when it asks for more or gives
    some back (docs/cluster.md#scaling-with-load); None: what the cluster gives."""
    timings: AgentTimings = field(default_factory=AgentTimings.lan)
    """Periods and time-outs of the agent (above)."""


def detect_capabilities() -> Capabilities:
    """What this machine offers: its cores and memory."""
    cores = os.cpu_count() or 1
    memory_mb = int(psutil.virtual_memory().total / (1024 * 1024))
    return Capabilities(cores=cores, memory_mb=memory_mb)
