"""Webhooks on Spark: each record of a micro-batch POSTed from the driver (see
:mod:`spanflow.spec.connectors.webhook`)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import orjson
from pyspark.sql import DataFrame

from spanflow.spark.connectors import BatchWriter, SinkContext, content_ids, writes
from spanflow.spark.deadletter import DeadLetter, send_dead_letters
from spanflow.spec.connectors.webhook import WebhookSinkOptions

log = logging.getLogger(__name__)

IDEMPOTENCY_HEADER = "Idempotency-Key"
RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
"""Statuses worth another try; any other 4xx is the receiver refusing the record."""


@writes("webhook")
class WebhookWriter(BatchWriter):
    def __init__(self, ctx: SinkContext, sink_id: str, options: WebhookSinkOptions) -> None:
        self.ctx = ctx
        self.sink_id = sink_id
        self.options = options
        self.sent = 0
        self.dead = 0

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self.options.headers}
        for name, env in self.options.headers_env.items():
            headers[name] = os.environ.get(env, "")
        return headers

    def write(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.toArrow().to_pylist()
        if not rows:
            return
        self.ctx.check_fence()
        option = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z
        payloads = [
            orjson.dumps({k: v for k, v in r.items() if not k.startswith("_")}, option=option)
            for r in rows
        ]
        keys = content_ids(f"{self.ctx.pipeline}:{self.sink_id}:{batch_id}", payloads)
        failures = asyncio.run(self._post_all(payloads, keys))
        self.sent += len(payloads) - len(failures)
        if failures:
            self.dead += len(failures)
            letters = [
                DeadLetter(msg_id=f"webhook:{key}", data=payloads[i], reason=reason,
                           stream=f"webhook:{self.options.url}", subject=self.sink_id)
                for i, key, reason in failures
            ]  # fmt: skip
            send_dead_letters(
                self.ctx.nats_url, self.ctx.pipeline, self.sink_id, letters, epoch=self.ctx.epoch
            )

    async def _post_all(self, payloads: list[bytes], keys: list[str]) -> list[tuple[int, str, str]]:
        """POST every payload, ``concurrency`` at a time; (index, key, reason) of the
        ones still refused after the last try."""
        import httpx

        gate = asyncio.Semaphore(self.options.concurrency)
        headers = self._headers()
        async with httpx.AsyncClient(timeout=self.options.timeout) as client:

            async def one(i: int) -> tuple[int, str, str] | None:
                async with gate:
                    reason = await self._post(client, headers, payloads[i], keys[i])
                return None if reason is None else (i, keys[i], reason)

            done = await asyncio.gather(*(one(i) for i in range(len(payloads))))
        return [d for d in done if d is not None]

    async def _post(
        self, client: Any, headers: dict[str, str], payload: bytes, key: str
    ) -> str | None:
        """None once delivered (2xx); else why the last try failed."""
        delay = self.options.backoff
        reason = ""
        for attempt in range(self.options.retries + 1):
            if attempt:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.options.max_backoff)
            try:
                answer = await client.post(
                    self.options.url, content=payload, headers={**headers, IDEMPOTENCY_HEADER: key}
                )
            except Exception as exc:  # unreachable, reset, timed out: try again
                reason = f"{type(exc).__name__}: {exc}"[:300]
                continue
            if answer.status_code < 300:
                return None
            reason = f"HTTP {answer.status_code}: {answer.text[:200]}"
            if answer.status_code not in RETRYABLE:
                break
        return f"webhook {self.options.url} after {attempt + 1} tries: {reason}"
