"""S3 and S3-compatible object stores, written from the driver with boto3.

Each micro-batch becomes objects with deterministic names —
``<prefix>/<col>=<value>/.../batch=<id>/part-<n>.<ext>`` — so a replayed batch writes
the same objects again, and then a manifest ``<prefix>/_manifests/batch=<id>.json``
listing them with their row counts. Readers trust the manifests: an object no
manifest lists belongs to a batch that had not finished.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from spanflow.spec.connectors.base import Connector, ConnectorOptions, register

ENV = r"^[A-Za-z_][A-Za-z0-9_]*$"


class S3SinkOptions(ConnectorOptions):
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", description="The bucket.")
    prefix: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9!_.*'()/=-]*$",
        description="Key prefix of every object (default: <pipeline>/<sink>).",
    )
    endpoint: str | None = Field(
        default=None, description="The S3 endpoint URL of a non-AWS store (http://host:port)."
    )
    region: str | None = Field(default=None, description="The bucket's region (AWS).")
    access_key_env: str = Field(
        default="AWS_ACCESS_KEY_ID",
        pattern=ENV,
        description="Environment variable holding the access key id.",
    )
    secret_key_env: str = Field(
        default="AWS_SECRET_ACCESS_KEY",
        pattern=ENV,
        description="Environment variable holding the secret access key.",
    )
    format: Literal["parquet", "jsonl"] = Field(default="parquet", description="Object format.")
    partition_by: tuple[str, ...] = Field(
        default=(), description="Columns whose values name folders (col=value/), Hive-style."
    )
    max_rows_per_object: int = Field(default=1_000_000, ge=1, le=100_000_000)


SINK = register(
    Connector(
        name="s3",
        role="sink",
        options=S3SinkOptions,
        exactly_once="deterministic object names per batch and partition, so a replayed "
        "batch overwrites the same objects; a manifest per batch, written last, lists what "
        "readers may trust",
        standby="both replicas write the same objects under the same names",
        external=True,
        address_option="endpoint",
        extra="s3",
        module="boto3",
    )
)
