"""What ``spanflow model`` and ``spanflow rules`` share: how they reach their catalog.
With ``--coordinator`` every call goes through the coordinators' REST API (a change
is made by the leader and recorded in the control log); without, through the node's
NATS (started for the call when there is none), as on a single machine."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spanflow.cli.common import data_dir_or_default, nats_url


@dataclass(frozen=True)
class Catalog:
    api: str
    """Its REST path under ``/api/v1``."""
    store_module: str
    """The module with its ``with_store`` (imported when first used: the CLI starts fast)."""
    manifest: Callable[[dict[str, Any]], Any]
    """A manifest from the REST API's answer."""

    def rest(
        self, coordinator: str, token: str | None, method: str, path: str = "", **given: Any
    ) -> Any:
        """A call through the coordinators' REST API."""
        from spanflow.local.api import Api

        where = f"/api/v1/{self.api}" + (f"/{path}" if path else "")
        return Api(coordinator, token).call(method, where, **given)

    def run(self, url: str | None, data_dir: Path | None, work: Any) -> Any:
        """``work(store)`` on the store over NATS."""
        with_store = importlib.import_module(self.store_module).with_store
        with nats_url(url, data_dir_or_default(data_dir)) as resolved:
            return asyncio.run(with_store(resolved, work))

    def manifests(
        self,
        name: str | None,
        nats: str | None,
        data_dir: Path | None,
        coordinator: str | None,
        token: str | None,
    ) -> list[Any]:
        """Every manifest (``name``'s only, when given)."""
        if coordinator:
            found = self.rest(coordinator, token, "GET", name or "")
            return [self.manifest(m) for m in (found if name is None else [found])]
        return list(self.run(nats, data_dir, lambda store: store.every(name)))


def pushed_at(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%d %H:%M:%S")
