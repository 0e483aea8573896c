"""HTTP ingest against the real NATS server: a reading answered 200 is stored, bodies
that are not JSON get a 400 with the reason, a retried POST stores nothing twice."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from spanflow.doors.ingest import IngestServer
from spanflow.errors import SecurityError
from spanflow.nats.streams import connect, ensure_stream
from spanflow.security.ingest_tokens import group_token
from tests.helpers import read_all


def _stream(url: str, name: str, subjects: list[str]) -> None:
    async def go() -> None:
        nc = await connect(url)
        await ensure_stream(nc.jetstream(), name, subjects)
        await nc.close()

    asyncio.run(go())


@pytest.fixture
def ingest(nats_url):
    server = IngestServer(nats_url, "127.0.0.1", 0, token="s3cret").start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


AUTH = {"Authorization": "Bearer s3cret"}


def test_posted_readings_are_stored_before_the_answer(nats_url, ingest, uid):
    _stream(nats_url, f"HTTP_{uid}", [f"http{uid}.>"])
    url = f"{ingest}/ingest/http{uid}.dev1"
    one = httpx.post(url, json={"t": 21.5}, headers=AUTH)
    assert one.status_code == 200, one.text
    assert one.json()["stored"] == 1 and one.json()["stream"] == f"HTTP_{uid}"
    many = httpx.post(url, json=[{"t": 1}, {"t": 2}, 3], headers=AUTH)
    assert many.json()["stored"] == 3
    lines = httpx.post(
        url, content=b'{"t": 4}\n\n{"t": 5}\n',
        headers={**AUTH, "Content-Type": "application/x-ndjson"},
    )  # fmt: skip
    assert lines.json()["stored"] == 2
    stored = [d for _, d, _ in read_all(nats_url, f"HTTP_{uid}")]
    assert stored == [b'{"t":21.5}', b'{"t":1}', b'{"t":2}', b"3", b'{"t":4}', b'{"t":5}']


def test_bad_requests_get_a_4xx_with_the_reason_and_store_nothing(nats_url, ingest, uid):
    _stream(nats_url, f"BAD_{uid}", [f"bad{uid}.>"])
    url = f"{ingest}/ingest/bad{uid}.dev1"
    cases = [
        (httpx.post(url, content=b"{not json", headers=AUTH), 400, "body: not valid JSON"),
        (httpx.post(url, content=b"", headers=AUTH), 400, "empty body"),
        (
            httpx.post(url, content=b'{"t": 1}\n{oops}',
                       headers={**AUTH, "Content-Type": "application/x-ndjson"}),
            400, "line 2: not valid JSON",
        ),
        (httpx.post(url, json={"t": 1}), 401, "bearer token"),
        (httpx.post(url, json={"t": 1}, headers={"Authorization": "Bearer no"}), 401, "token"),
        (httpx.post(f"{ingest}/ingest/nowhere{uid}.x", json={"t": 1}, headers=AUTH), 404,
         "no stream captures"),
        (httpx.post(f"{ingest}/ingest/a..b", json={"t": 1}, headers=AUTH), 400, "not a subject"),
    ]  # fmt: skip
    for answer, status, reason in cases:
        assert answer.status_code == status, answer.text
        assert reason in answer.json()["detail"]
    assert read_all(nats_url, f"BAD_{uid}") == []


def test_a_retried_post_with_an_idempotency_key_stores_once(nats_url, ingest, uid):
    _stream(nats_url, f"IDEM_{uid}", [f"idem{uid}.>"])
    url = f"{ingest}/ingest/idem{uid}.dev1"
    headers = {**AUTH, "Idempotency-Key": f"batch-{uid}"}
    first = httpx.post(url, json=[{"t": 1}, {"t": 2}], headers=headers)
    again = httpx.post(url, json=[{"t": 1}, {"t": 2}], headers=headers)
    assert first.json()["duplicates"] == 0 and again.json()["duplicates"] == 2
    assert len(read_all(nats_url, f"IDEM_{uid}")) == 2


def test_listening_beyond_loopback_needs_a_token(nats_url):
    with pytest.raises(SecurityError, match="give a token"):
        IngestServer(nats_url, "0.0.0.0", 0)


def test_a_device_groups_token_publishes_on_its_subjects_only(nats_url, ingest, uid):
    """A group token made from the site's token (`spanflow secrets ingest-token SITE
    --subjects PATTERN`) is taken at that site for the subjects it covers only; one
    made from another site's token, or tampered with, is not taken at all."""
    _stream(nats_url, f"GRP_{uid}", [f"grp{uid}.>"])
    line1 = group_token("s3cret", f"grp{uid}.line-1.>")
    mine = {"Authorization": f"Bearer {line1}"}
    ok = httpx.post(f"{ingest}/ingest/grp{uid}.line-1.press", json={"t": 1}, headers=mine)
    assert ok.status_code == 200, ok.text
    other = httpx.post(f"{ingest}/ingest/grp{uid}.line-2.press", json={"t": 2}, headers=mine)
    assert other.status_code == 403 and "line-1" in other.json()["detail"], other.text
    elsewhere = {"Authorization": f"Bearer {group_token('another-site', f'grp{uid}.>')}"}
    widened = line1.replace(line1.split(".")[1], group_token("x", f"grp{uid}.>").split(".")[1])
    for headers in (elsewhere, {"Authorization": f"Bearer {widened}"}):
        refused = httpx.post(f"{ingest}/ingest/grp{uid}.line-1.x", json={"t": 3}, headers=headers)
        assert refused.status_code == 401, refused.text
    assert [d for _, d, _ in read_all(nats_url, f"GRP_{uid}")] == [b'{"t":1}']
