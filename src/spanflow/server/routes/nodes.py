"""``/api/v1/nodes``: registration, status, drain, capabilities, shedding."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response

from spanflow.control.coordinator import Coordinator
from spanflow.control.requests import Registration
from spanflow.protocol.messages import ScaleReport, ShedRequest
from spanflow.protocol.rest import NodeStatus, Registered, ShedAnswer
from spanflow.server.errors import RequestError
from spanflow.server.principals import node_of
from spanflow.spec.topology import Capabilities

API = "/api/v1/nodes"


def add_node_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    @app.get(API, tags=["nodes"], dependencies=guarded)
    async def list_nodes() -> list[NodeStatus]:
        return coordinator.view.node_statuses()

    @app.post(API, tags=["nodes"], dependencies=guarded, status_code=201)
    async def register(reg: Registration, request: Request) -> Registered:
        """An agent registers its node (again after every restart)."""
        node = node_of(request)
        if node is not None and node != reg.name:
            raise RequestError(403, f"node {node}'s token cannot register {reg.name}", "forbidden")
        record = await coordinator.register_node(reg)
        s = coordinator.settings
        return Registered(
            node=record,
            **coordinator.view.connection_for(record.name).model_dump(),
            heartbeat_interval=s.heartbeat_interval,
            gossip_profile=s.gossip_profile,
        )

    @app.post(f"{API}/{{name}}/shed", tags=["nodes"], dependencies=guarded)
    async def shed(name: str, request: ShedRequest) -> ShedAnswer:
        """An overloaded node asks for one of its fragments to move to a peer (the
        agent's shedding policy sends it; an operator may too)."""
        return await coordinator.shed(name, request)

    @app.post(f"{API}/{{name}}/scaled", tags=["nodes"], dependencies=guarded)
    async def scaled(name: str, report: ScaleReport) -> NodeStatus:
        """A node on a Spark cluster asked for more executors or gave some back (its
        agent's scaling policy sends it): recorded in the control log."""
        await coordinator.node_scaled(name, report)
        return coordinator.view.node_status(name)

    @app.get(f"{API}/{{name}}", tags=["nodes"], dependencies=guarded)
    async def get_node(name: str) -> NodeStatus:
        return coordinator.view.node_status(name)

    @app.post(f"{API}/{{name}}/drain", tags=["nodes"], dependencies=guarded)
    async def drain(name: str) -> NodeStatus:
        await coordinator.drain_node(name)
        return coordinator.view.node_status(name)

    @app.put(f"{API}/{{name}}/capabilities", tags=["nodes"], dependencies=guarded)
    async def capabilities(name: str, caps: Capabilities) -> NodeStatus:
        await coordinator.update_capabilities(name, caps)
        return coordinator.view.node_status(name)

    @app.delete(f"{API}/{{name}}", tags=["nodes"], dependencies=guarded, status_code=204)
    async def remove(name: str) -> Response:
        await coordinator.remove_node(name)
        return Response(status_code=204)
