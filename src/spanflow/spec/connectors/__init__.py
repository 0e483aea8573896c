"""Connectors: the systems a source reads from and a sink writes to.

A connector is one module here. It declares, in one place, what the rest of
spanflow needs to know about it — its typed options (each default written once),
how it is exactly once, whether it can run in Real-Time Mode, whether it reaches a
system outside spanflow's own NATS servers (so the planner must place it where that
system is reachable), and which install extra brings its client library — and
registers itself. How it runs on Spark is registered apart, in
:mod:`spanflow.spark.connectors`. Adding a connector is those two modules; nothing
else switches on connector names.

Every connector module in this package is imported on first use, like the step
families of :mod:`spanflow.spec.steps`.
"""

from __future__ import annotations

from spanflow.plugins import import_all
from spanflow.spec.connectors.base import (
    Connector,
    ConnectorOptions,
    NoOptions,
    Role,
    connectors,
    lookup,
    register,
)

import_all(__name__, __path__, skip=("base",))

__all__ = [
    "Connector",
    "ConnectorOptions",
    "NoOptions",
    "Role",
    "connectors",
    "lookup",
    "register",
]
