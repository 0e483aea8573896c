"""The dashboard's endpoints without a browser: the pages and their vendored assets are
served by the coordinator itself, /docs loads nothing from a CDN, public reads open GETs
only, and the live stream starts with a snapshot that is the REST API's view."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spanflow.nats.server import EmbeddedNats
from spanflow.server.app import create_app
from tests.cluster.test_coordinator_api import AUTH, coordinator, pipeline, register

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path / "nats") as s:
        yield s


@pytest.fixture
def api(server: EmbeddedNats, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(coordinator(server, tmp_path))) as client:
        yield client


@pytest.fixture
def public(server: EmbeddedNats, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(coordinator(server, tmp_path, public_reads=True))) as client:
        yield client


def test_pages_and_every_asset_they_load_come_from_the_coordinator(public: TestClient) -> None:
    home = public.get("/", follow_redirects=False)
    assert home.status_code == 307 and home.headers["location"] == "/ui/"
    page = public.get("/ui/")
    assert page.status_code == 200 and "spanflow" in page.text
    assets = re.findall(r'(?:src|href)="(vendor/[^"]+|app\.[a-z]+)"', page.text)
    assert len(assets) >= 4
    for asset in assets:
        assert public.get(f"/ui/{asset}").status_code == 200, asset
    docs = public.get("/docs").text
    loaded = re.findall(r"https?://[^'\"]+", docs)
    assert not [u for u in loaded if "cdn" in u or "jsdelivr" in u or "unpkg" in u], loaded
    for path in re.findall(r"'(/ui/vendor/[^']+)'", docs):
        assert public.get(path).status_code == 200, path
    assert public.get("/openapi.json").json()["paths"]["/api/v1/nodes"]["get"]["responses"]


def test_public_reads_open_gets_and_nothing_else(public: TestClient) -> None:
    assert public.get("/api/v1/nodes").status_code == 200
    assert public.get("/metrics").status_code == 200
    r = public.post("/api/v1/pipelines", json={"yaml": pipeline("p1")})
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    assert public.post("/api/v1/models/m/rollback").status_code == 401
    r = public.post("/api/v1/pipelines", json={"yaml": pipeline("p1")}, headers=AUTH)
    assert r.status_code == 201


def test_without_public_reads_the_data_needs_the_token(api: TestClient) -> None:
    assert api.get("/ui/").status_code == 200  # the page itself: it asks for the token
    for path in ("/api/v1/nodes", "/api/v1/stream", "/api/v1/events", "/metrics"):
        assert api.get(path).status_code == 401, path


def test_the_stream_starts_with_the_apis_view_and_the_log(api: TestClient) -> None:
    register(api, "a1", "edge-a")
    api.post("/api/v1/pipelines", json={"yaml": pipeline("p1")}, headers=AUTH)
    events: dict[str, list[dict[str, Any]]] = {"snapshot": [], "log": []}
    with api.stream("GET", "/api/v1/stream?interval=0.2", headers=AUTH) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: ") and kind in events:
                events[kind].append(json.loads(line.removeprefix("data: ")))
            if events["snapshot"] and "pipeline-submitted" in [e["kind"] for e in events["log"]]:
                break
    snap: dict[str, Any] = events["snapshot"][0]
    nodes = api.get("/api/v1/nodes", headers=AUTH).json()
    assert [n["name"] for n in snap["nodes"]] == [n["name"] for n in nodes] == ["a1", "c1"]
    assert snap["pipelines"][0]["name"] == "p1"
    metrics = api.get("/api/v1/cluster/metrics", headers=AUTH).json()
    assert snap["cluster"] == metrics | {"uptime_s": snap["cluster"]["uptime_s"]}
    kinds = [e["kind"] for e in events["log"]]
    assert "pipeline-submitted" in kinds and "node-registered" in kinds
    assert api.get("/api/v1/pipelines/nope/history", headers=AUTH).status_code == 404
    history = api.get("/api/v1/pipelines/p1/history", headers=AUTH).json()
    assert history["name"] == "p1" and set(history["fragments"]) == {"p1.f0"}
