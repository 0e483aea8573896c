"""What the browser tests share: the watched page (console errors, failed requests and
4xx/5xx answers fail a test), where screenshots go, and small readers of the page and
of /metrics."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from spanflow.local.cluster import LocalCluster

ARTIFACTS = (
    Path(
        os.environ.get(
            "SPANFLOW_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"
        )
    )
    / "dashboard"
)


class Watched:
    """A page whose console errors, uncaught exceptions, failed requests and 4xx/5xx
    answers are collected; ``expected`` statuses (a test that clicks without the token)
    are let through."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: list[str] = []
        self.expected: set[int] = set()
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.problems.append(f"uncaught: {e}"))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)

    def _console(self, m: Any) -> None:
        if m.type not in ("error", "warning"):
            return
        if any(f"status of {s}" in m.text for s in self.expected):
            return  # the browser's own note about an expected refusal
        self.problems.append(f"console {m.type}: {m.text}")

    def _failed(self, r: Any) -> None:
        if "/api/v1/stream" in r.url and r.failure == "net::ERR_ABORTED":
            return  # the page restarts its live stream itself when the token changes
        self.problems.append(f"request failed: {r.method} {r.url}: {r.failure}")

    def _response(self, r: Any) -> None:
        if r.status >= 400 and r.status not in self.expected:
            self.problems.append(f"{r.status} from {r.request.method} {r.url}")


def open_page(w: Watched, c: LocalCluster, route: str) -> Any:
    w.page.goto(f"{c.url}/ui/#/{route}")
    w.page.wait_for_selector("#live.on", timeout=30_000)  # the live stream answers
    return w.page


def cells(page: Any, row: str, field: str) -> str:
    return str(page.locator(f"{row} [data-field={field}]").inner_text()).strip()


def fragment_up(c: LocalCluster, fragment: str) -> float | None:
    """``spanflow_fragment_up`` of one fragment in a scrape of /metrics (None: absent)."""
    text = httpx.get(f"{c.url}/metrics", timeout=10).raise_for_status().text
    for line in text.splitlines():
        if line.startswith("spanflow_fragment_up{") and f'fragment="{fragment}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None
