"""The coordinators' REST API as scripts, tests and CLI commands on this host use it.

:class:`Api` wraps :class:`~spanflow.protocol.client.CoordinatorClient` (fail-over
along the URL list, waiting out an election) with this host's defaults: the REST token
of its secrets directory, its CA when locked; failures come back as
:class:`~spanflow.errors.SpanflowError` saying what the coordinator answered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from spanflow.errors import SecurityError, SpanflowError
from spanflow.nats.server import default_data_dir
from spanflow.protocol.client import ApiError, CoordinatorClient, CoordinatorUnreachable
from spanflow.security.environment import secrets_from_env
from spanflow.security.https import client_context
from spanflow.security.secrets import Secrets

T = TypeVar("T")


def find_secrets(data_dir: Path | None) -> Secrets | None:
    """This host's secrets directory (``SPANFLOW_SECRETS``, else ``<data dir>/secrets``
    if it exists), without adopting it."""
    found = secrets_from_env()
    if found is None:
        candidate = Secrets((data_dir or default_data_dir()) / "secrets")
        found = candidate if candidate.exists() else None
    return found


def host_rest_token() -> str | None:
    """The REST token of this host's secrets directory, if it has one (so CLI commands
    on a locked host work without --token)."""
    found = find_secrets(None)
    if found is None:
        return None
    try:
        return found.credentials().rest_token  # None in a host's bundle: give --token
    except SecurityError:
        return None


class Api:
    """The coordinators' API for CLI commands: fails over along the URL list and waits
    out an election (a few seconds) before giving up."""

    def __init__(self, url: str, token: str | None, patience: float = 30.0) -> None:
        self.client = CoordinatorClient(
            url, token or host_rest_token(), patience=patience, verify=client_context()
        )

    @property
    def url(self) -> str:
        return self.client.url

    def typed(self, call: Callable[[CoordinatorClient], T]) -> T:
        """A typed call of the client (``lambda c: c.nodes()``); its failures as a
        SpanflowError that says what the coordinator answered."""
        try:
            return call(self.client)
        except CoordinatorUnreachable as exc:
            raise SpanflowError(f"no coordinator answered: {exc}") from None
        except ApiError as exc:
            raise SpanflowError(str(exc)) from None

    def call(
        self, method: str, path: str, body: Any = None, *, content: bytes | None = None
    ) -> Any:
        """An untyped call: the answer's JSON."""
        try:
            r = self.client.request(method, path, body, content=content)
        except CoordinatorUnreachable as exc:
            raise SpanflowError(f"no coordinator answered: {exc}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail")
            except ValueError:
                detail = r.text
            if not isinstance(detail, str):
                detail = json.dumps(detail)
            raise SpanflowError(f"{r.status_code}: {detail}")
        return r.json() if r.content else None
