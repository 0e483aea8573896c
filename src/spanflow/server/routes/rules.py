"""REST endpoints of rule sets (``/api/v1/rules``), token-protected like the rest of
the API. A rule set's rules are patterns with SQL conditions: data, evaluated by
spanflow's own expression engine (no code is loaded from them)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from spanflow.cep.rule_store import RuleStore
from spanflow.cep.rules import RuleSetManifest, RuleSetVersion
from spanflow.control.coordinator import Coordinator
from spanflow.server.routes.models import principal
from spanflow.spec.patterns import RuleSpec

API = "/api/v1/rules"


class PushBody(BaseModel):
    rules: tuple[RuleSpec, ...] = Field(min_length=1)
    note: str = ""


def add_rule_routes(app: FastAPI, coordinator: Coordinator, guarded: list[Any]) -> None:
    def store() -> RuleStore:
        return RuleStore(coordinator.jetstream())

    @app.get(API, tags=["rules"], dependencies=guarded)
    async def list_rule_sets() -> list[RuleSetManifest]:
        return await store().every()

    @app.get(f"{API}/{{name}}", tags=["rules"], dependencies=guarded)
    async def get_rule_set(name: str) -> RuleSetManifest:
        manifest, _ = await store().manifest(name)
        return manifest

    @app.post(f"{API}/{{name}}", tags=["rules"], dependencies=guarded, status_code=201)
    async def push(name: str, body: PushBody, request: Request) -> RuleSetVersion:
        """A new version, current at once; by the leader, in the control log."""
        return await coordinator.change_catalog(
            lambda: store().push(name, body.rules, note=body.note),
            lambda v: change(name, "push", principal(request), v.version),
        )

    @app.post(f"{API}/{{name}}/rollback", tags=["rules"], dependencies=guarded)
    async def rollback(name: str, request: Request) -> RuleSetManifest:
        """The previous version current again; by the leader, in the control log."""
        return await coordinator.change_catalog(
            lambda: store().rollback(name),
            lambda m: change(name, "rollback", principal(request), m.current),
        )


def change(name: str, action: str, by: str, version: int | None) -> dict[str, Any]:
    """The fields of a rule set's CatalogChanged record."""
    return {"catalog": "rules", "name": name, "action": action, "by": by, "version": version}
