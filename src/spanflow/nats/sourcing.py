"""Catch-up that starts when the link does: reviving stream sourcing after a cut.

A cloud stream that sources a site's stream (:func:`spanflow.nats.streams.ensure_sourced`)
is fed by a consumer the NATS server keeps on the site's server across the leaf link.
When the link drops, the server retries that consumer on its own back-off — 10 s
more per failure, up to two minutes (``calculateRetryBackoff`` in nats-server) — so
after a long cut the copy resumed up to minutes after the link was back. Measured
here: 21 s after a 40 s cut, 40 s after 60 and 120 s cuts.

:func:`revive_stalled` looks at each external source: one that has heard nothing for
:data:`STALL_AFTER` seconds while its origin's JetStream API answers is removed from
the stream's configuration and put back at once. A source added to a stream starts
from the last sequence the stream holds from it (nats-server scans its messages'
``Nats-Stream-Source`` headers), so nothing is lost or copied twice, and the copy
resumes within about a second of the link.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

import orjson
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamSource

log = logging.getLogger(__name__)

STALL_AFTER = 3.0
"""Seconds without a message or heartbeat from a source before it counts as stalled (a
live source heartbeats every second)."""
PROBE_TIMEOUT = 1.0
COOLDOWN = 5.0
"""Seconds between two revivals of one stream: the new consumer needs a moment."""


SourceKey = tuple[str, str]
"""A source by stream name and origin API prefix (one stream may source the stream of
the same name from several sites)."""


def key_of(source: StreamSource) -> SourceKey:
    return source.name, source.external.api if source.external is not None else ""


def stalled_sources(info: dict[str, Any], stall_after: float = STALL_AFTER) -> list[SourceKey]:
    """The external sources of a stream's info (the JetStream API's JSON: nats-py's
    typed info drops each source's ``external``) silent for longer than ``stall_after``
    (``active`` is nanoseconds since the last contact; -1 while being set up)."""
    out = []
    for source in info.get("sources") or []:
        active, api = source.get("active"), (source.get("external") or {}).get("api")
        if not api or active is None or active < 0:
            continue
        if active / 1e9 > stall_after:
            out.append((source["name"], api))
    return out


async def origin_answers(nc: Client, source: SourceKey, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the source's origin server answers its JetStream API (the link is up)."""
    name, api = source
    try:
        await nc.request(f"{api}.STREAM.INFO.{name}", b"", timeout=timeout)
    except Exception:  # no responders (link down), a time-out
        return False
    return True


async def resubscribe(js: JetStreamContext, name: str, keys: list[SourceKey]) -> None:
    """Remove the sources ``keys`` from the stream and put them back (see the module
    doc: they resume from the last sequence the stream holds from each)."""
    config = (await js.stream_info(name)).config
    every = list(config.sources or [])
    kept = [s for s in every if key_of(s) not in keys]
    await js.update_stream(replace(config, sources=kept))
    await js.update_stream(replace(config, sources=every))


class SourcingWatch:
    """Revives the stalled sources of the streams a node reads, each at most once per
    :data:`COOLDOWN`. :meth:`check` is one pass; the agent calls it every second."""

    def __init__(self, nc: Client, domain: str | None = None) -> None:
        self.nc = nc
        self.js = nc.jetstream(domain=domain)
        self.api = f"$JS.{domain}.API" if domain else "$JS.API"
        self.revived: dict[str, float] = {}
        """Stream → monotonic time of its last revival."""
        self.revivals = 0

    async def check(self, streams: list[str]) -> list[str]:
        """Revive what needs it among ``streams``; the names of those revived."""
        found = await asyncio.gather(*(self._check_one(name) for name in streams))
        return [name for name, revived in zip(streams, found, strict=True) if revived]

    async def _check_one(self, name: str) -> bool:
        if time.monotonic() - self.revived.get(name, float("-inf")) < COOLDOWN:
            return False
        try:
            reply = await self.nc.request(
                f"{self.api}.STREAM.INFO.{name}", b"", timeout=PROBE_TIMEOUT * 2
            )
            info = orjson.loads(reply.data)
        except Exception:  # electing, unreachable: next pass
            return False
        stalled = stalled_sources(info)
        alive = [k for k in stalled if await origin_answers(self.nc, k)]
        if not alive:
            return False  # the link is still down (or nothing stalled): nothing to do yet
        self.revived[name] = time.monotonic()
        try:
            await resubscribe(self.js, name, alive)
        except Exception as exc:
            log.warning("stream %s: could not revive its sources %s: %s", name, alive, exc)
            return False
        self.revivals += 1
        log.info("stream %s: sources %s stalled while their origin answers: revived", name, alive)
        return True
