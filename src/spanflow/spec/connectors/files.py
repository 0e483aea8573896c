"""Sinks to this node's own file system and terminal."""

from __future__ import annotations

from spanflow.spec.connectors.base import Connector, NoOptions, register

PARQUET = register(
    Connector(
        name="parquet",
        role="sink",
        options=NoOptions,
        append_only=True,
        exactly_once="Spark's file sink: a batch's files are listed in its _spark_metadata "
        "log, which readers of the folder through Spark trust",
    )
)
CONSOLE = register(
    Connector(
        name="console",
        role="sink",
        options=NoOptions,
        exactly_once="not applicable: printed for people, at least once",
        standby="printed by both replicas, each on its own node",
    )
)
