"""Webhooks: each record POSTed as JSON to a URL (alerts to an incident tool, a chat
channel, a customer's endpoint), with retries and an idempotency key.

HTTP has no transactions, so delivery is at least once with an ``Idempotency-Key``
header that is the same whenever a record is sent again (a retry, or a replayed
micro-batch): a receiver that remembers keys sees each record once. A record still
refused after the last try goes to the dead-letter stream with the reason, and the
pipeline goes on.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field

from spanflow.spec.connectors.base import Connector, ConnectorOptions, register, url_check

HttpUrl = Annotated[str, url_check("http://", "https://", what="webhook url")]
SECRET_HEADER = re.compile(r"authorization|token|secret|api[-_]?key|password|cookie", re.I)


class WebhookSinkOptions(ConnectorOptions):
    url: HttpUrl = Field(description="Where each record is POSTed (http:// or https://).")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Headers sent with every request (no secrets)."
    )
    headers_env: dict[str, str] = Field(
        default_factory=dict,
        description="Headers whose values come from environment variables, e.g. "
        "{Authorization: ALERTS_WEBHOOK_AUTH}: secrets stay out of the pipeline.",
    )
    timeout: float = Field(default=10.0, gt=0, le=300, description="Seconds per request.")
    retries: int = Field(default=5, ge=0, le=20, description="Tries after the first one.")
    backoff: float = Field(
        default=0.5, ge=0, le=60, description="Seconds before the first retry; doubles each time."
    )
    max_backoff: float = Field(default=30.0, ge=0, le=600)
    concurrency: int = Field(default=16, ge=1, le=256, description="Requests in flight.")

    def secret_free(self) -> dict[str, Any]:
        shown = self.model_dump(mode="json")
        shown["headers"] = {
            k: ("***" if SECRET_HEADER.search(k) else v) for k, v in self.headers.items()
        }
        return shown

    def inline_secrets(self) -> list[str]:
        return [
            f"headers.{name} (give it in headers_env)"
            for name in self.headers
            if SECRET_HEADER.search(name)
        ]


SINK = register(
    Connector(
        name="webhook",
        role="sink",
        options=WebhookSinkOptions,
        address_option="url",
        exactly_once="at least once, with an Idempotency-Key header derived from (pipeline, "
        "sink, batch, record content) that repeats on every resend: receivers that remember "
        "keys see each record once; refused after the last try → dead letter",
        standby="both replicas post each record with the same Idempotency-Key: a receiver "
        "that remembers keys sees it once",
    )
)
