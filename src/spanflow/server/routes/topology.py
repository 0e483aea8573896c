"""``/api/v1/topology``: sites, links and their latencies (the planner's map)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from spanflow.control.coordinator import Coordinator
from spanflow.spec.topology import Link, NodeSpec, Site, Topology

API = "/api/v1/topology"


def add_topology_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    @app.get(API, tags=["topology"], dependencies=guarded, response_model_by_alias=True)
    async def topology() -> Topology:
        return coordinator.view.topology()

    @app.put(f"{API}/sites", tags=["topology"], dependencies=guarded, response_model_by_alias=True)
    async def put_site(site: Site) -> Topology:
        return await coordinator.put_site(site)

    @app.put(f"{API}/nodes", tags=["topology"], dependencies=guarded, response_model_by_alias=True)
    async def put_node(node: NodeSpec) -> Topology:
        """Declare a node or change its spec: the streams it hosts bring its site into
        the running pipelines that read them."""
        return await coordinator.put_node(node)

    @app.put(f"{API}/links", tags=["topology"], dependencies=guarded, response_model_by_alias=True)
    async def put_link(link: Link) -> Topology:
        return await coordinator.put_link(link)
