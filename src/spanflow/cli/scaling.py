"""The node command's options for scaling with load on a Spark cluster, and what they
turn into: the policy's bounds and timings, and the Spark settings they need."""

from __future__ import annotations

from typing import Annotated

import typer

from spanflow.errors import SpanflowError
from spanflow.runtime.scaling.policy import ScalingConfig
from spanflow.spec.topology import memory_mb

ExecutorsOption = Annotated[
    str | None,
    typer.Option(
        help="MIN:MAX executors a node on a Spark cluster holds: it starts with MIN, asks "
        "for one more while its fragments fall behind and gives one back while they idle "
        "(docs/cluster.md#scaling-with-load). Default: every core the cluster gives.",
    ),
]
ExecutorCoresOption = Annotated[
    int, typer.Option(help="Cores of one executor (with --executors).", min=1)
]
ExecutorMemoryOption = Annotated[
    str, typer.Option(help="Memory of one executor, e.g. 1g (with --executors).")
]
ScaleOutAfterOption = Annotated[
    float, typer.Option(help="Seconds behind (pressure above 1) before one more executor.")
]
ScaleInAfterOption = Annotated[
    float, typer.Option(help="Seconds idle (pressure at or below 0.3) before one fewer.")
]
ScaleCooldownOption = Annotated[
    float, typer.Option(help="Seconds after a change before the next one.")
]


def scaling_config(
    executors: str | None,
    master: str | None,
    cores: int,
    memory: str,
    out_after: float,
    in_after: float,
    cooldown: float,
) -> ScalingConfig | None:
    """The policy for ``--executors MIN:MAX`` (None without it)."""
    if executors is None:
        return None
    if not master or master.startswith("local"):
        raise SpanflowError("--executors needs a Spark cluster: --master spark://HOST:PORT")
    low, sep, high = executors.partition(":")
    try:
        bounds = (int(low), int(high if sep else low))
        per_executor = int(memory_mb(memory))
        return ScalingConfig(
            min_executors=bounds[0],
            max_executors=bounds[1],
            executor_cores=cores,
            executor_memory_mb=per_executor,
            sustain_out=out_after,
            sustain_in=in_after,
            cooldown=cooldown,
        )
    except ValueError as exc:
        raise SpanflowError(f"--executors {executors!r}: {exc}") from None


def spark_conf(config: ScalingConfig | None) -> dict[str, str]:
    """What Spark needs for the node to choose its executors: executors of a fixed
    size (a worker then hosts several), never more cores than the maximum holds, and
    Spark's own dynamic allocation off (it would fight the node's requests)."""
    if config is None:
        return {}
    return {
        "spark.executor.cores": str(config.executor_cores),
        "spark.executor.memory": f"{config.executor_memory_mb}m",
        "spark.cores.max": str(config.max_executors * config.executor_cores),
        "spark.dynamicAllocation.enabled": "false",
    }
