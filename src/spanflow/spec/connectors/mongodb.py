"""MongoDB collections, written through pymongo from the driver: each micro-batch is
one unordered bulk of upserts by a deterministic ``_id``, so writing a replayed batch
again changes nothing."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from spanflow.spec.connectors.base import Connector, ConnectorOptions, KeyFields, register


class MongoSinkOptions(ConnectorOptions):
    uri: str = Field(
        description="'mongodb://host:27017[,host2...]/?replicaSet=...'; no password in it: "
        "use username and password_env."
    )
    username: str | None = Field(default=None)
    password_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the password.",
    )
    database: str = Field(pattern=r"^[^/\\. \"$]{1,63}$")
    collection: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,119}$")
    key: KeyFields = Field(
        default=(),
        description="Fields whose values make each document's _id (a later row of the same "
        "key replaces the document); without a key the _id is derived from the batch and "
        "the row, so each row is one document.",
    )
    timeout: float = Field(default=10.0, gt=0, le=300, description="Server selection, seconds.")

    @field_validator("uri")
    @classmethod
    def _no_password(cls, value: str) -> str:
        if not value.startswith(("mongodb://", "mongodb+srv://")):
            raise ValueError("a MongoDB URI starts with mongodb:// or mongodb+srv://")
        if re.search(r"://[^/@:]+:[^/@]+@", value):
            raise ValueError("put no password in the URI: name an environment variable with "
                             "password_env")  # fmt: skip
        return value


SINK = register(
    Connector(
        name="mongodb",
        role="sink",
        options=MongoSinkOptions,
        exactly_once="each row is an upsert by a deterministic _id (the key's values, or the "
        "batch and the row's content): a replayed batch rewrites the same documents",
        external=True,
        extra="mongodb",
        module="pymongo",
    )
)
