"""MongoDB collections, written through pymongo from the driver: each micro-batch is
one unordered bulk of upserts by a deterministic ``_id``, so writing a replayed batch
again changes nothing."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from spanflow.spec.connectors.base import (
    Connector,
    ConnectorOptions,
    KeyFields,
    register,
    url_check,
)

MongoUri = Annotated[
    str, url_check("mongodb://", "mongodb+srv://", what="MongoDB URI", passwords=False)
]


class MongoSinkOptions(ConnectorOptions):
    uri: MongoUri = Field(
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


SINK = register(
    Connector(
        name="mongodb",
        role="sink",
        options=MongoSinkOptions,
        exactly_once="each row is an upsert by a deterministic _id (the key's values, or the "
        "batch and the row's content): a replayed batch rewrites the same documents",
        standby="both replicas upsert the same documents under the same _id",
        external=True,
        address_option="uri",
        extra="mongodb",
        module="pymongo",
    )
)
