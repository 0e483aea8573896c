"""What the namespaced-host tests share: waiting for a process's log line, reading a
stream whole, the coordinator's REST API, the windows a stream's readings fall in."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from spanflow.nats.streams import connect
from spanflow.security.secrets import Secrets
from tests.helpers import wait_for

TOPOLOGY = """\
sites: [{name: cloud, kind: cloud}]
nodes:
  - {name: n1, site: cloud, capabilities: {cores: 2, slots: 4}}
"""


def plant_windows(stream: str) -> str:
    """The pipeline the host tests submit: readings of ``stream`` counted per device in
    10 s windows, into stream PLANT_WINDOWS."""
    return f"""\
name: plant-windows
trigger: 1s
sources:
  - id: readings
    stream: {stream}
    schema: {{id: long, device: string, ts: timestamp, temp: double}}
    event_time: ts
    max_out_of_orderness: 5s
    to: [by_device]
processors:
  - {{id: by_device, type: key_by, key: device, to: [per_10s]}}
  - id: per_10s
    type: window
    tumbling: 10s
    aggregates: {{readings: count}}
    to: [out]
sinks:
  - {{id: out, type: jetstream, stream: PLANT_WINDOWS, subject: "plantwindows.{{device}}"}}
"""


def wait_line(log: Path, pattern: str, timeout: float = 60.0) -> re.Match[str]:
    found: list[re.Match[str]] = []

    def seen() -> bool:
        match = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if match:
            found.append(match)
        return match is not None

    try:
        wait_for(seen, timeout=timeout, interval=0.2)
    except AssertionError:
        raise AssertionError(f"no {pattern!r} in {log}:\n{log.read_text()[-3000:]}") from None
    return found[0]


async def ids(url: str, stream: str, secrets: Secrets, role: str = "reader") -> Counter[int]:
    nc = await connect(url, identity=secrets.identity(role))
    try:
        js = nc.jetstream()
        total = (await js.stream_info(stream)).state.messages
        seen: Counter[int] = Counter()
        if total:
            sub = await js.subscribe(">", ordered_consumer=True, stream=stream)
            for _ in range(total):
                msg = await sub.next_msg(timeout=5)
                seen[orjson.loads(msg.data)["id"]] += 1
            await sub.unsubscribe()
        return seen
    finally:
        await nc.close()


class Api:
    def __init__(self, base: str, token: str, verify: Any) -> None:
        self.base, self.headers = base, {"Authorization": f"Bearer {token}"}
        self.verify = verify

    def node_state(self, name: str) -> str | None:
        r = httpx.get(
            f"{self.base}/api/v1/nodes", headers=self.headers, timeout=5, verify=self.verify
        )
        return next((n["state"] for n in r.json() if n["name"] == name), None)

    def submit(self, text: str) -> None:
        r = httpx.post(
            f"{self.base}/api/v1/pipelines",
            json={"yaml": text},
            headers=self.headers,
            timeout=30,
            verify=self.verify,
        )
        assert r.status_code < 300, r.text


def window_of(ts: str) -> str:
    moment = datetime.fromisoformat(ts)
    start = moment.replace(second=moment.second - moment.second % 10, microsecond=0)
    return start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


async def rows(
    url: str, stream: str, secrets: Secrets, role: str = "reader"
) -> list[dict[str, Any]]:
    nc = await connect(url, identity=secrets.identity(role))
    try:
        js = nc.jetstream()
        total = (await js.stream_info(stream)).state.messages
        out = []
        if total:
            sub = await js.subscribe(">", ordered_consumer=True, stream=stream)
            for _ in range(total):
                out.append(orjson.loads((await sub.next_msg(timeout=5)).data))
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()


def window_counts(url: str, secrets: Secrets, stream: str = "PLANT_WINDOWS") -> Counter[str]:
    try:
        found = asyncio.run(rows(url, stream, secrets))
    except Exception:  # the sink stream does not exist before the first window
        return Counter()
    out: Counter[str] = Counter()
    for row in found:
        out[str(row["window_start"])[:19]] += int(row["readings"])
    return out


def status(url: str, token: str | None = None, wrong: str | None = None, verify: Any = True) -> int:
    bearer = token or wrong
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    try:
        return httpx.get(url, headers=headers, timeout=5, verify=verify).status_code
    except httpx.HTTPError:
        return 0
