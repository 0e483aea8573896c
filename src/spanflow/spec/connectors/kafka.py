"""Kafka topics: read with spanflow's Python data source on confluent-kafka (the
default: ≈3-4x faster in benchmarks/connectors.py) or Spark's own Kafka connector
(``format("kafka")``); written through confluent-kafka.

Either source keeps ``{partition: next offset}`` in Spark's checkpoint, so a replayed
batch reads the same range (read_committed). The sink writes each micro-batch in one
Kafka transaction that also records the batch id, so a replayed batch is recognised
and skipped.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator, model_validator

from spanflow.spec.connectors.base import Connector, ConnectorOptions, register

TOPIC = r"^[A-Za-z0-9._-]{1,249}$"
_SECRET = re.compile(r"password|secret|token|credential|key\.pem|\.key$", re.IGNORECASE)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _bootstrap(value: str) -> str:
    servers = [s.strip() for s in value.split(",") if s.strip()]
    if not servers:
        raise ValueError("bootstrap needs at least one host:port")
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bootstrap server {server!r} is not host:port")
    return ",".join(servers)


class _KafkaOptions(ConnectorOptions):
    topic: str = Field(pattern=TOPIC, description="The Kafka topic.")
    bootstrap: str = Field(
        description="Brokers to bootstrap from, 'host:port[,host:port...]'.",
    )
    config: dict[str, str] = Field(
        default_factory=dict,
        description="More librdkafka settings (security.protocol, sasl.mechanism, "
        "sasl.username, ssl.*...). Settings named like passwords or secrets are refused "
        "in a submission: give them in config_env.",
    )
    config_env: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka settings whose values come from environment variables "
        "where the query runs, e.g. {sasl.password: KAFKA_PASSWORD}: secrets stay out of "
        "the pipeline, the control plane and Spark's plans.",
    )
    partitions: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Create the topic with this many partitions when it is missing "
        "(default: a missing topic is an error at start).",
    )

    _check_bootstrap = field_validator("bootstrap")(classmethod(lambda cls, v: _bootstrap(v)))

    @field_validator("config_env")
    @classmethod
    def _env_names(cls, config_env: dict[str, str]) -> dict[str, str]:
        for key, name in config_env.items():
            if not ENV_NAME.match(name):
                raise ValueError(f"config_env[{key!r}]: {name!r} is not an environment variable")
        return config_env

    def secret_free(self) -> dict[str, object]:
        shown = self.model_dump(mode="json")
        shown["config"] = {k: ("***" if _SECRET.search(k) else v) for k, v in self.config.items()}
        return shown

    def inline_secrets(self) -> list[str]:
        return [
            f"config.{key} (give it in config_env)" for key in self.config if _SECRET.search(key)
        ]


class KafkaSourceOptions(_KafkaOptions):
    reader: Literal["python", "spark"] = Field(
        default="python",
        description="'python': spanflow's data source on confluent-kafka (the faster one "
        "here), whose 'config' and 'config_env' take librdkafka settings (SASL, TLS); "
        "'spark': Spark's own Kafka connector (format('kafka'), Java client, jars from "
        "Maven Central). Both read read_committed.",
    )
    start_time: datetime | None = Field(
        default=None,
        description="A new pipeline starts at the first record of each partition at or "
        "after this time (overrides 'start').",
    )
    group: str | None = Field(
        default=None,
        description="Consumer group whose offsets are committed after each batch, for "
        "monitoring tools only (default spanflow.<pipeline>.<step>; reader 'python': "
        "Spark's connector commits none); Spark's checkpoint holds the offsets that count.",
    )
    read_timeout: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds a read task waits for the records of its planned range "
        "before it fails (Spark then retries it; reader 'python').",
    )

    @model_validator(mode="after")
    def _settings_need_the_python_reader(self) -> KafkaSourceOptions:
        if self.reader == "spark" and (self.config or self.config_env):
            raise ValueError(
                "config and config_env take librdkafka settings, which the Python reader "
                "uses, not Spark's connector: set reader: python to read with them"
            )
        return self


class KafkaSinkOptions(_KafkaOptions):
    key: str | None = Field(
        default=None,
        description="Column whose value is each record's Kafka key (records of a key "
        "keep their order in one partition).",
    )
    headers: tuple[str, ...] = Field(
        default=(), description="Columns sent as Kafka headers as well as in the value."
    )
    transactional_id: str | None = Field(
        default=None,
        description="The producer's transactional id (default spanflow.<pipeline>.<sink>). "
        "A restarted query with the same id fences the old producer.",
    )


SOURCE = register(
    Connector(
        name="kafka",
        role="source",
        options=KafkaSourceOptions,
        exactly_once="offsets {partition: next offset} are kept in Spark's checkpoint and a "
        "replayed batch re-reads exactly that range (read_committed; Spark's connector or "
        "assign + seek in the Python reader)",
        external=True,
        address_option="bootstrap",
        extra="kafka",
        module="confluent_kafka",
    )
)
SINK = register(
    Connector(
        name="kafka",
        role="sink",
        options=KafkaSinkOptions,
        exactly_once="one Kafka transaction per micro-batch, which also writes the batch id "
        "to a marker topic; a replayed batch whose id is already committed is skipped "
        "(consumers read with isolation.level=read_committed)",
        standby="the replicas' producers share the transactional id, so one writes and "
        "the fenced one waits for each batch's marker; it takes the writing over (fencing "
        "the writer, aborting its open transaction) when a batch is not committed within "
        "1 s",
        external=True,
        address_option="bootstrap",
        extra="kafka",
        module="confluent_kafka",
    )
)
