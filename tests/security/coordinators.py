"""Shared by the security tests: a locked coordinator's REST API over a real NATS server."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spanflow.api.topology_loader import load_topology_text
from spanflow.control.coordinator import Coordinator, CoordinatorSettings
from spanflow.nats.server import EmbeddedNats
from spanflow.security.secrets import Secrets
from spanflow.server.app import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@contextmanager
def coordinator_api(
    full: Secrets, root: Path, topology: str, **settings: Any
) -> Iterator[tuple[TestClient, str]]:
    """A coordinator holding the operator's token and the node-token key of ``full``
    (so it checks node tokens and node reports' seals), its REST API and its NATS URL."""
    creds = full.credentials()
    with EmbeddedNats(root / "nats") as server:
        config = CoordinatorSettings(
            nats_url=server.url,
            state_dir=str(root / "state"),
            token=creds.rest_token,
            node_token_key=creds.agent_key,
            topology=load_topology_text(topology),
            **settings,
        )
        with TestClient(create_app(Coordinator(config))) as client:
            yield client, server.url
