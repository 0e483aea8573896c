"""``spanflow node``: a node agent, and the options of what it offers (cores, slots,
Spark master, gossip, shedding, executors)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

import typer

from spanflow.cli import scaling
from spanflow.cli.cluster import DEFAULT_URL, CoordinatorOption, TokenOption, _logging
from spanflow.cli.common import (
    Interrupted,
    SparkConfOption,
    _quiet_spark,
    app,
    err,
    fail,
    spark_settings,
    use_secrets,
)
from spanflow.errors import SpanflowError
from spanflow.spec.topology import Capabilities

SlotsOption = Annotated[
    int | None,
    typer.Option(
        help="Fragment slots: fragments at once, one more per Python stateful step "
        "(default: cores)."
    ),
]
MasterOption = Annotated[
    str | None,
    typer.Option(
        help="Spark master (default local[cores]); spark://HOST:PORT runs the node's "
        "fragments on a Spark standalone cluster (`spanflow spark-cluster`), whose "
        "cores and memory the node then offers."
    ),
]
MasterUiOption = Annotated[
    str | None,
    typer.Option(
        help="The Spark master's web UI, read for the cluster's capacity (default "
        "http://MASTER-HOST:8080)."
    ),
]
RealtimeSlotsOption = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Spark task slots above the cores for Real-Time Mode queries (each holds "
        "1-2 for its whole batch; default 4; see docs/realtime.md).",
    ),
]
BatchOffsetOption = Annotated[
    float,
    typer.Option(
        min=0.0,
        max=0.999,
        help="Shift of this node's micro-batch start slots, as a fraction of the trigger "
        "interval; give nodes that share a machine different ones.",
    ),
]
AgentStateDirOption = Annotated[
    Path | None,
    typer.Option(
        help="Where the agent keeps its last registration, to start without the "
        "coordinator (default: spanflow's data dir)."
    ),
]
NodeNatsOption = Annotated[
    str | None,
    typer.Option(
        help="Reach NATS at this URL instead of the one the coordinator names "
        "(a proxy or another route to the same server)."
    ),
]
GossipOption = Annotated[
    bool, typer.Option(help="Run membership (SWIM gossip) with the partition's nodes.")
]
GossipBindOption = Annotated[str, typer.Option(help="Address of the membership endpoint.")]
GossipPortOption = Annotated[
    int, typer.Option(help="UDP+TCP port of the membership endpoint (0: any free).")
]
GossipAdvertiseOption = Annotated[
    str | None, typer.Option(help="Address peers reach the endpoint at (NAT, 0.0.0.0).")
]
GossipProfileOption = Annotated[
    str | None,
    typer.Option(help="lan, wan or local_test (default: the coordinator's choice)."),
]
ShedOption = Annotated[
    bool, typer.Option(help="Ask a less-loaded peer to take a fragment when overloaded.")
]
ShedHighOption = Annotated[
    float, typer.Option(help="Load score above which the node is overloaded.")
]
ShedLowOption = Annotated[
    float, typer.Option(help="A peer takes a fragment only if it stays below this.")
]


@app.command()
def node(
    name: Annotated[str, typer.Option(help="Node name (unique in the cluster).")],
    site: Annotated[str, typer.Option(help="Site the node is in.")],
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
    cores: Annotated[int | None, typer.Option(help="Cores to offer (default: detected).")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory to offer, e.g. 4g.")] = None,
    slots: SlotsOption = None,
    tag: Annotated[list[str] | None, typer.Option(help="Capability tag (repeatable).")] = None,
    master: MasterOption = None,
    master_ui: MasterUiOption = None,
    realtime_slots: RealtimeSlotsOption = None,
    batch_offset: BatchOffsetOption = 0.0,
    state_dir: AgentStateDirOption = None,
    nats: NodeNatsOption = None,
    gossip: GossipOption = True,
    gossip_bind: GossipBindOption = "127.0.0.1",
    gossip_port: GossipPortOption = 0,
    gossip_advertise: GossipAdvertiseOption = None,
    gossip_profile: GossipProfileOption = None,
    shed: ShedOption = True,
    shed_high: ShedHighOption = 0.9,
    shed_low: ShedLowOption = 0.6,
    shed_sustain: Annotated[float, typer.Option(help="Seconds overloaded before shedding.")] = 10.0,
    shed_cooldown: Annotated[float, typer.Option(help="Seconds between two shed requests.")] = 30.0,
    executors: scaling.ExecutorsOption = None,
    executor_cores: scaling.ExecutorCoresOption = 1,
    executor_memory: scaling.ExecutorMemoryOption = "1g",
    scale_out_after: scaling.ScaleOutAfterOption = 10.0,
    scale_in_after: scaling.ScaleInAfterOption = 60.0,
    scale_cooldown: scaling.ScaleCooldownOption = 30.0,
    spark_conf: SparkConfOption = None,
) -> None:
    """Run a node agent: register (retrying for as long as it takes), heartbeat, run
    assigned fragments as Spark queries. A node that registered before starts from its
    saved registration and its site's last-known assignments when the coordinator
    cannot be reached."""
    from spanflow.runtime.agent import AgentSettings, NodeAgent

    _logging()
    _quiet_spark()
    token = _node_token(state_dir, name, given=token)
    told_memory = memory
    if master and master.startswith("spark://") and cores is None:
        cores, memory = _spark_cluster_offer(master, master_ui, memory)
    shedding = _shedding(shed, shed_high, shed_low, shed_sustain, shed_cooldown)
    _check_gossip_profile(gossip_profile)
    try:
        executor = (executor_cores, executor_memory)
        timing = (scale_out_after, scale_in_after, scale_cooldown)
        scale = scaling.scaling_config(executors, master, *executor, *timing)
        conf = {**scaling.spark_conf(scale), **spark_settings(spark_conf)}
    except SpanflowError as exc:
        raise fail(exc) from None
    offered = _offered(cores, memory, slots, tag, realtime_slots)
    settings = AgentSettings(
        name=name,
        site=site,
        coordinator_url=coordinator_url,
        token=token or None,
        capabilities=offered,
        spark_conf={**_driver_memory(offered, told_memory, master), **conf},
        scaling=scale,
        master=master,
        batch_offset=batch_offset,
        state_dir=state_dir,
        nats_url=nats,
        gossip=gossip,
        gossip_bind=gossip_bind,
        gossip_port=gossip_port,
        gossip_advertise=gossip_advertise,
        gossip_profile=gossip_profile,
        shedding=shedding,
    )
    stop = Interrupted()
    try:
        NodeAgent(settings).run(stop.event, after_spark=stop.install)
    except SpanflowError as exc:
        raise fail(exc) from None


def _node_token(state_dir: Path | None, name: str, *, given: str | None) -> str | None:
    """The REST token the node uses: ``given``, else its own from its bundle (None in
    open mode). Either way this process adopts the bundle's NATS identity."""
    secrets = use_secrets(state_dir, "agent")
    if given or secrets is None:
        return given
    return secrets.credentials().api_token(name)


def _shedding(enabled: bool, high: float, low: float, sustain: float, cooldown: float) -> Any:
    """The node's shedding policy settings, checked."""
    from spanflow.runtime.shedding.policy import SheddingConfig

    if low >= high:
        raise fail(SpanflowError("--shed-low must be below --shed-high (hysteresis)"))
    return SheddingConfig(enabled=enabled, high=high, low=low, sustain=sustain, cooldown=cooldown)


def _driver_memory(
    offered: Capabilities | None, told: str | None, master: str | None
) -> dict[str, str]:
    """``--memory`` sizes the Spark driver of a node in local mode (detected memory
    does not: a machine's total is not what a node may take)."""
    from spanflow.runtime.spark_host import driver_memory_conf

    if offered is None or told is None:
        return {}
    return driver_memory_conf(offered.memory_mb, master or "local")


def _offered(
    cores: int | None,
    memory: str | int | None,
    slots: int | None,
    tags: list[str] | None,
    realtime_slots: int | None,
) -> Capabilities | None:
    """What the node offers when told (the rest detected); None: all detected."""
    from spanflow.runtime.agent_settings import detect_capabilities

    if all(v is None for v in (cores, memory, slots, tags, realtime_slots)):
        return None
    detected = detect_capabilities()
    try:
        return Capabilities.model_validate(
            {
                "cores": cores or detected.cores,
                "memory_mb": memory or detected.memory_mb,
                "slots": slots,
                "tags": tuple(tags or ()),
                "realtime_slots": detected.realtime_slots
                if realtime_slots is None
                else realtime_slots,
            }
        )
    except ValueError as exc:
        raise fail(SpanflowError(f"bad capability: {exc}")) from None


def _check_gossip_profile(profile: str | None) -> None:
    from spanflow.runtime.membership.config import MembershipConfig

    if profile is not None:
        try:
            MembershipConfig.named(profile)
        except ValueError as exc:
            raise fail(SpanflowError(str(exc))) from None


# -- the REST client ---------------------------------------------------------------------


def _spark_cluster_offer(
    master: str, master_ui: str | None, memory: str | None
) -> tuple[int | None, str | None]:
    """A node on a Spark standalone cluster offers the cluster's cores and memory (what
    its alive workers have), so the planner sizes its work by the cluster, not by the
    machine the agent runs on. Unreadable: this machine's, with a warning."""
    from spanflow.local.spark_cluster import SparkClusterError, cluster_capacity

    host = urlparse(master.replace("spark://", "http://", 1)).hostname or "127.0.0.1"
    ui = master_ui or f"http://{host}:8080"
    try:
        capacity = cluster_capacity(ui)
    except SparkClusterError as exc:
        err.print(f"[yellow]offering this machine's cores: {exc}[/yellow]")
        return None, memory
    err.print(f"Spark cluster {master}: {capacity.cores} cores, {capacity.memory_mb} MB")
    return capacity.cores or None, memory or (
        f"{capacity.memory_mb}m" if capacity.memory_mb else None
    )
