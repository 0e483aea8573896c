"""PostgreSQL tables, written through psycopg 3 from the driver.

Each micro-batch is one transaction: the rows are copied into a temporary table and
upserted into the target by the sink's key (or inserted, without a key), and the
batch id is recorded in ``spanflow_sink_batches`` in the same transaction. A
replayed batch whose id is already recorded changes nothing: exactly once, whatever
the moment of a crash.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from spanflow.spec.connectors.base import Connector, ConnectorOptions, KeyFields, register

IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
TABLE = r"^([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$"


class PostgresSinkOptions(ConnectorOptions):
    dsn: str = Field(
        description="Where the database is: 'postgresql://user@host:5432/db' or "
        "'host=... dbname=...'. Put no password here: use password_env.",
    )
    password_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the password (read where the query runs).",
    )
    table: str = Field(pattern=TABLE, description="Target table, optionally 'schema.table'.")
    key: KeyFields = Field(
        default=(),
        description="Columns that identify a row: each row is upserted by them (a window's "
        "later update replaces its earlier one). Without a key rows are inserted.",
    )
    create: bool = Field(
        default=True,
        description="Create the table from the stream's columns when it is missing (with "
        "the key as primary key); false: a missing table is an error at start.",
    )
    connect_timeout: float = Field(default=10.0, gt=0, le=300)

    @field_validator("key")
    @classmethod
    def _identifiers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for column in value:
            if not re.match(IDENTIFIER, column):
                raise ValueError(f"key column {column!r} is not a plain identifier")
        return value

    @field_validator("dsn")
    @classmethod
    def _no_password(cls, value: str) -> str:
        if re.search(r"://[^/@:]+:[^/@]+@", value) or re.search(r"\bpassword\s*=", value):
            raise ValueError(
                "put no password in the pipeline (it would be logged and stored with the "
                "spec): name an environment variable with password_env"
            )
        return value


SINK = register(
    Connector(
        name="postgres",
        role="sink",
        options=PostgresSinkOptions,
        exactly_once="one transaction per micro-batch upserts the rows by their key and "
        "records the batch id in spanflow_sink_batches; a replayed batch already recorded "
        "changes nothing",
        standby="the replicas' transactions take the sink's lock in turn: the second to "
        "write a batch finds its batch id recorded and changes nothing",
        external=True,
        address_option="dsn",
        extra="postgres",
        module="psycopg",
    )
)
