"""A client of the coordinators' REST API that knows there may be several.

Given a list of coordinator URLs (``http://a:7070,http://b:7070``), a request goes to
the one that answered last; when it cannot be reached, or answers 503 (a standby that
cannot take writes, or a leader that just lost its lease), the next URL is tried, and
so on for up to ``patience`` seconds. A standby that knows the leader answers a write
with a redirect to it (307), which is followed with the token (httpx's own redirects
drop it on the way to another host, and every coordinator is another host). Errors
other than these come back to
the caller as they are from :meth:`CoordinatorClient.request`; the typed methods
(``nodes()``, ``pipeline(name)``, ``submit(...)``, ...) parse answers into the models
of :mod:`spanflow.protocol.rest` and raise :class:`ApiError` for a 4xx or 5xx.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from spanflow.protocol.rest import (
    ClusterInfo,
    ClusterMetrics,
    Health,
    Incident,
    LogEntry,
    NodeStatus,
    PipelineMetrics,
    PipelineStatus,
    RebaselineBody,
    Rebaselined,
    SubmitBody,
    Upgrading,
)

M = TypeVar("M", bound=BaseModel)
MAX_REDIRECTS = 3
"""Hops a request follows: a standby names the leader, which answers itself."""


def parse_urls(given: str | Sequence[str]) -> list[str]:
    """``"http://a, http://b"`` or a list → clean URLs without trailing slashes."""
    parts = given.split(",") if isinstance(given, str) else list(given)
    urls = [u.strip().rstrip("/") for u in parts if u.strip()]
    if not urls:
        raise ValueError("no coordinator URL given")
    return urls


class CoordinatorUnreachable(Exception):
    """No coordinator of the list answered (the message lists what each said)."""


class ApiError(Exception):
    """The coordinator refused a request: its status and what it said."""

    def __init__(self, status: int, detail: str, code: str | None = None) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail
        self.code = code


class CoordinatorClient:
    def __init__(
        self,
        urls: str | Sequence[str],
        token: str | None = None,
        *,
        timeout: float = 30.0,
        patience: float = 0.0,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.urls = parse_urls(urls)
        self.verify = verify
        """How ``https://`` coordinators are checked (spanflow.security.https.client_context)."""
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.patience = patience
        """Seconds to keep going round the list while every coordinator is unavailable
        (an election takes a few seconds); 0: one round."""
        self._current = 0

    @property
    def url(self) -> str:
        """The coordinator that answered last (or the first)."""
        return self.urls[self._current]

    def skip(self) -> None:
        """Send the next request to the next coordinator of the list first (the last
        one answered, but wrongly: a 5xx)."""
        self._current = (self._current + 1) % len(self.urls)

    def _follow(self, r: httpx.Response) -> None:
        """Remember the coordinator that answered (a redirect may have named another)."""
        final = str(r.url)
        for i, u in enumerate(self.urls):
            if final.startswith(u + "/"):
                self._current = i

    def request(
        self, method: str, path: str, body: Any = None, *, content: bytes | None = None
    ) -> httpx.Response:
        """The first answer that is not 'unavailable'; raises
        :class:`CoordinatorUnreachable` when every coordinator failed. ``body`` goes as
        JSON, ``content`` (a file) as it is."""
        deadline = time.monotonic() + self.patience
        problems: dict[str, str] = {}
        while True:
            for _ in range(len(self.urls)):
                url = self.url
                try:
                    r = self._send(method, f"{url}{path}", body, content)
                except httpx.HTTPError as exc:
                    problems[url] = str(exc) or type(exc).__name__
                else:
                    if r.status_code != 503:
                        self._follow(r)
                        return r
                    problems[url] = f"503 {_detail(r)}"
                self._current = (self._current + 1) % len(self.urls)
            if time.monotonic() >= deadline:
                raise CoordinatorUnreachable(
                    "; ".join(f"coordinator {u}: {p}" for u, p in problems.items())
                )
            time.sleep(0.25)

    def _send(self, method: str, url: str, body: Any, content: bytes | None) -> httpx.Response:
        """One request, following a standby's redirect to the leader with the same
        token, method and body. A redirect from https to plain http is not followed (the
        token would travel in the clear); its 307 comes back as the answer."""
        for _ in range(MAX_REDIRECTS + 1):
            r = httpx.request(
                method,
                url,
                json=body,
                content=content,
                headers=self.headers,
                timeout=self.timeout,
                follow_redirects=False,
                verify=self.verify,
            )
            location = r.headers.get("location")
            if r.status_code not in (307, 308) or not location:
                return r
            target = r.url.join(location)
            if r.url.scheme == "https" and target.scheme != "https":
                return r
            url = str(target)
        return r

    # -- typed calls -------------------------------------------------------------------
    def _checked(self, method: str, path: str, body: Any = None) -> httpx.Response:
        r = self.request(method, path, body)
        if r.status_code >= 400:
            raise ApiError(r.status_code, _detail(r), _code(r))
        return r

    def one(self, method: str, path: str, model: type[M], body: Any = None) -> M:
        """The answer parsed as ``model``; :class:`ApiError` for a 4xx or 5xx."""
        return model.model_validate_json(self._checked(method, path, body).content)

    def many(self, path: str, model: type[M]) -> list[M]:
        """A GET answered with a list of ``model``."""
        return TypeAdapter(list[model]).validate_json(  # type: ignore[valid-type]
            self._checked("GET", path).content
        )

    def health(self) -> Health:
        return self.one("GET", "/healthz", Health)

    def cluster(self) -> ClusterInfo:
        return self.one("GET", "/api/v1/cluster", ClusterInfo)

    def cluster_metrics(self) -> ClusterMetrics:
        return self.one("GET", "/api/v1/cluster/metrics", ClusterMetrics)

    def log(self, after: int = 0, limit: int = 100) -> list[LogEntry]:
        """The newest ``limit`` control-log records after ``after``."""
        return self.many(f"/api/v1/cluster/log?after={after}&limit={limit}", LogEntry)

    def nodes(self) -> list[NodeStatus]:
        return self.many("/api/v1/nodes", NodeStatus)

    def node(self, name: str) -> NodeStatus:
        return self.one("GET", f"/api/v1/nodes/{name}", NodeStatus)

    def drain(self, name: str) -> NodeStatus:
        """Move a node's fragments away; it takes no new ones until it re-registers."""
        return self.one("POST", f"/api/v1/nodes/{name}/drain", NodeStatus)

    def pipelines(self) -> list[PipelineStatus]:
        return self.many("/api/v1/pipelines", PipelineStatus)

    def pipeline(self, name: str) -> PipelineStatus:
        return self.one("GET", f"/api/v1/pipelines/{name}", PipelineStatus)

    def pipeline_metrics(self, name: str) -> PipelineMetrics:
        return self.one("GET", f"/api/v1/pipelines/{name}/metrics", PipelineMetrics)

    def submit(self, body: SubmitBody) -> PipelineStatus:
        payload = body.model_dump(mode="json", exclude_none=True)
        return self.one("POST", "/api/v1/pipelines", PipelineStatus, payload)

    def upgrade(self, name: str, body: SubmitBody) -> Upgrading:
        """Replace a running pipeline by a new version that keeps its state."""
        payload = body.model_dump(mode="json", exclude_none=True)
        return self.one("POST", f"/api/v1/pipelines/{name}/upgrade", Upgrading, payload)

    def rebaseline(self, name: str, body: RebaselineBody) -> Rebaselined:
        """Accept a key's current behaviour as normal in a pipeline's detector."""
        payload = body.model_dump(mode="json", exclude_none=True)
        return self.one("POST", f"/api/v1/pipelines/{name}/rebaseline", Rebaselined, payload)

    def incidents(self, limit: int = 300) -> list[Incident]:
        """The event feed's incidents, newest first."""
        return self.many(f"/api/v1/incidents?limit={limit}", Incident)

    def pipeline_action(self, name: str, action: str, body: Any = None) -> PipelineStatus:
        """``cancel``, ``savepoint`` or ``resume`` a pipeline."""
        return self.one("POST", f"/api/v1/pipelines/{name}/{action}", PipelineStatus, body)


def _code(r: httpx.Response) -> str | None:
    try:
        code = r.json().get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, str) else None


def _detail(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail")
    except ValueError:
        return r.text[:200]
    return detail if isinstance(detail, str) else str(detail)
