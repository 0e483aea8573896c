"""How a coordinator is configured (command line and ``spanflow up``)."""

from __future__ import annotations

from dataclasses import dataclass

from spanflow.spec import locations
from spanflow.spec.topology import Site, Topology


@dataclass
class CoordinatorSettings:
    nats_url: str
    state_dir: str = "spanflow-data/cluster"
    """Checkpoints and savepoints: storage every node can reach — a local directory on
    one machine or a shared mount, or a Hadoop URL (``jetstream://``, ``hdfs://``; see
    :mod:`spanflow.spec.locations`). A site's ``state:`` overrides it for its nodes."""
    heartbeat_interval: float = 1.0
    hub_domain: str | None = None
    """JetStream domain of the cluster's (hub) server; nodes of sites with their own
    server reach the control plane's buckets and streams through it."""
    failure_after: int = 3
    """A node silent for this many heartbeat periods is failed."""
    token: str | None = None
    node_token_key: str | None = None
    """Checks node tokens (spanflow.security.secrets.node_token): an agent's bundle holds
    its node's token, which registers and sheds as that node and does nothing else; and
    with it only reports sealed by their own node count (security/node_seal.py)."""
    public_reads: bool = False
    """GET requests (the dashboard, /metrics) need no token; writes still do."""
    topology: Topology | None = None
    replan_margin: float = 0.2
    """A fragment moves only when its new place is better by this share of its current
    cost (worst input latency) and by at least a millisecond."""
    name: str = "coordinator"
    """Unique per replica: the lease names its holder."""
    data_dir: str | None = None
    """Where its secrets are (fits started through the API read streams with them)."""
    url: str | None = None
    """Where this replica's API answers (standbys redirect writes to the leader's)."""
    replicas: int | None = None
    """Copies of the control log and buckets; None: one per server of the NATS
    cluster, up to three."""
    lease_seconds: float | None = None
    """A leader that stops renewing its lease loses it after this long; a standby then
    takes office. Renewed every third of it. None: sized from the NATS cluster's
    failover time (``leadership.lease_for``: 3 s on one server, 19 s on a cluster)."""
    gossip_profile: str = "lan"
    """Membership profile agents use unless told otherwise (``lan``, ``wan``,
    ``local_test``; see docs/membership.md)."""
    rebalance: bool = True
    """Run the central rebalancer (docs/balancing.md)."""
    rebalance_interval: float = 10.0
    """Seconds between two rebalancer passes."""
    overload: float = 0.9
    """A node whose load score stays above this is overloaded (as agents' ``--shed-high``)."""
    underload: float = 0.6
    """A node may take a fragment only if its load stays below this (``--shed-low``)."""
    overload_sustain: float = 20.0
    """Seconds a node stays overloaded before the rebalancer moves work off it: longer
    than agents wait before shedding (10 s), so their own requests go first and the
    rebalancer corrects what they could not."""
    move_cooldown: float = 60.0
    """Seconds a fragment that moved is left where it is by the rebalancer."""
    settle_heartbeats: int = 10
    """A node that joined or recovered is a move target only after this many heartbeat
    periods alive, so a flapping node does not pull fragments back and forth."""

    @property
    def settle_seconds(self) -> float:
        return self.settle_heartbeats * self.heartbeat_interval

    @property
    def gossip_silence(self) -> float:
        """Silence a node declared dead by its partition must also show before it is
        failed: one heartbeat and a half."""
        return 1.5 * self.heartbeat_interval

    @property
    def failure_seconds(self) -> float:
        return self.heartbeat_interval * self.failure_after

    def state_root(self, site: Site | None) -> str:
        """Where a fragment placed at ``site`` keeps its state: the site's ``state:``,
        else :attr:`state_dir`."""
        return site.state if site is not None and site.state else self.state_dir

    @property
    def checkpoint_root(self) -> str:
        return locations.join(self.state_dir, "checkpoints")

    @property
    def savepoint_root(self) -> str:
        return locations.join(self.state_dir, "savepoints")
