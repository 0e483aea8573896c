"""Where records come from and where they go: sources and sinks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, model_validator

from spanflow.errors import SpecError
from spanflow.spec.avro import field_names as avro_field_names
from spanflow.spec.avro import fields_of as avro_fields
from spanflow.spec.connectors import Connector, ConnectorOptions, NoOptions, Role, lookup
from spanflow.spec.durations import Duration
from spanflow.spec.schema import Schema, StreamFormat
from spanflow.spec.steps.base import StepBase, StreamFacts, derived_id

PUBLISHED = "_published"
"""The broker's own timestamp of a record (JetStream's store time, Kafka's record
timestamp): a source may take it as its event time."""


DEFAULT_CONNECTOR = "jetstream"
"""What a source reads and a sink writes unless it names another connector."""


def _typed_options(role: Role, data: Any) -> Any:
    """Before validation: the step's ``options`` as its connector's typed model."""
    if not isinstance(data, dict):
        return data
    name = data.get("connector", DEFAULT_CONNECTOR)
    if not isinstance(name, str):
        return data  # the field's own validation says what is wrong
    try:
        connector = lookup(role, name)
    except SpecError as exc:
        raise ValueError(str(exc)) from None
    return {**data, "options": connector.parse(data.get("options"))}


class ProtobufFormat(BaseModel):
    """A Protobuf message type: its full name and a serialized ``FileDescriptorSet``
    (``protoc --include_imports --descriptor_set_out=x.desc``) that defines it, base64
    in the spec (the YAML front end reads a ``.desc`` path)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message: str = Field(pattern=r"^[A-Za-z_][\w.]*$", description="e.g. plant.Reading")
    descriptors: str = Field(min_length=4, description="base64 of a FileDescriptorSet")
    framing: Literal["plain", "confluent"] = Field(
        default="plain",
        description="'confluent': Confluent's wire format (a zero byte, a 4-byte schema "
        "id and the message-index list before the message).",
    )


def _schema_from_avro(data: Any) -> bool:
    """An Avro source without a schema of its own takes the Avro record's fields."""
    return (
        isinstance(data, dict)
        and data.get("format") == "avro"
        and not data.get("schema")
        and not data.get("schema_of")
        and isinstance(data.get("avro_schema"), dict)
    )


class SourceStep(StepBase):
    """Reads records from a connector (a JetStream stream by default) and decodes each
    message into one record."""

    arity: ClassVar[tuple[int, int | None]] = (0, 0)

    type: Literal["source"] = "source"
    connector: str = Field(
        default=DEFAULT_CONNECTOR,
        description="Where records come from: jetstream (default), kafka, ... "
        "(docs/connectors.md).",
    )
    options: SerializeAsAny[ConnectorOptions] = Field(
        default_factory=NoOptions, description="The connector's own options."
    )
    external: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="The topology's external system this source reads (default: the one "
        "its options point at, if declared): the planner reads it where it is reachable.",
    )
    stream: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="JetStream stream name (jetstream sources).",
    )
    subjects: tuple[str, ...] | None = Field(
        default=None, description="Subjects the stream captures (created if the stream is missing)."
    )
    format: StreamFormat = Field(default=StreamFormat.JSON, description="Message encoding.")
    schema_: Schema = Field(
        default_factory=dict, alias="schema", description="Field name → type; 'type?' is optional."
    )
    key: str | None = Field(default=None, description="Field that identifies the device/entity.")
    event_time: str | None = Field(default=None, description="Timestamp field for event time.")
    max_out_of_orderness: Duration = Field(
        default=0.0, le=86400, description="How late an event may arrive (the watermark delay)."
    )
    start: Literal["earliest", "latest"] = Field(
        default="earliest", description="Where a new pipeline starts reading the stream."
    )
    max_rows_per_batch: int = Field(
        default=200_000, ge=1, le=10_000_000, description="Admission control per micro-batch."
    )
    partitions: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Read tasks per micro-batch. 1 keeps per-key order for stateless pipelines.",
    )
    csv_delimiter: str = Field(default=",", min_length=1, max_length=1)
    avro_schema: dict[str, Any] | None = Field(
        default=None,
        description="format avro: the writer's Avro record schema (in YAML also a path to "
        "an .avsc file, relative to the pipeline file).",
    )
    protobuf: ProtobufFormat | None = Field(
        default=None,
        description="format protobuf: the message type and the descriptors that define it.",
    )
    avro_framing: Literal["plain", "confluent"] = Field(
        default="plain",
        description="format avro: 'plain' Avro binary, or Confluent's wire format (a zero "
        "byte and a 4-byte schema id before it).",
    )
    scalar_field: str | None = Field(
        default=None,
        description='JSON/YAML messages that are a bare value (42, "on") are read as a '
        "record with this one field set; default: such messages are dead-lettered.",
    )
    filter_subjects: tuple[str, ...] = Field(
        default=(), description="Read only messages on these subjects (default: all)."
    )
    schema_of: str | None = Field(
        default=None,
        description="Set by the planner: records are the output of this step of the "
        "pipeline, so their schema is that step's (the schema field stays empty).",
    )
    source_domain: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="Set by the planner: the stream is written in this JetStream domain "
        "(another site's server); a reader elsewhere sources it into its own domain.",
    )

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _options(cls, data: Any) -> Any:
        data = _typed_options("source", data)
        if _schema_from_avro(data):
            data = {**data, "schema": avro_fields(data["avro_schema"])}
        return data

    @property
    def connector_info(self) -> Connector:
        return lookup("source", self.connector)

    @property
    def stream_name(self) -> str:
        """The JetStream stream a jetstream source reads (a ValueError for others)."""
        if self.stream is None:
            raise ValueError(f"source {self.id!r} reads {self.connector}, not a JetStream stream")
        return self.stream

    @model_validator(mode="after")
    def _fields_exist(self) -> SourceStep:
        if self.connector == "jetstream" and not self.stream:
            raise ValueError("a jetstream source needs 'stream'")
        if self.connector != "jetstream":
            given = [
                name
                for name in ("stream", "subjects", "filter_subjects", "source_domain")
                if getattr(self, name)
            ]
            if given:
                raise ValueError(f"{', '.join(given)}: JetStream settings, not {self.connector}'s")
        if (self.format == StreamFormat.AVRO) != (self.avro_schema is not None):
            raise ValueError("format avro and avro_schema go together")
        if (self.format == StreamFormat.PROTOBUF) != (self.protobuf is not None):
            raise ValueError("format protobuf and protobuf (message, descriptors) go together")
        if self.avro_schema is not None:
            known = avro_field_names(self.avro_schema)
            absent = [f for f in self.schema_ if f not in known]
            if absent and self.schema_of is None:
                raise ValueError(f"schema fields {absent} are not fields of the avro_schema")
        if self.schema_of is not None:
            return self
        if self.format != StreamFormat.RAW and not self.schema_:
            raise ValueError(f"format {self.format.value} needs a schema (field: type)")
        roles = (
            (self.key, "key"),
            (self.event_time, "event_time"),
            (self.scalar_field, "scalar_field"),
        )
        for name, role in roles:
            if name == PUBLISHED and role == "event_time":
                continue
            if name is not None and self.format != StreamFormat.RAW and name not in self.schema_:
                raise ValueError(f"{role} {name!r} is not a field of the schema")
        if self.event_time and self.schema_.get(self.event_time, "timestamp").rstrip("?") != (
            "timestamp"
        ):
            raise ValueError(
                f"event_time {self.event_time!r} must be a timestamp field "
                "(ISO-8601 text or epoch seconds/milliseconds in the message)"
            )
        return self

    def realtime_problem(self) -> str | None:
        if not self.connector_info.realtime:
            return f"a {self.connector} source runs on micro-batches"
        if self.format != StreamFormat.JSON:
            return f"the real-time source reads JSON; this stream is {self.format.value}"
        return None

    def facts(self, inputs: Sequence[StreamFacts]) -> StreamFacts:
        return StreamFacts(
            key=(self.key,) if self.key else (),
            entity=frozenset({self.key}) if self.key else frozenset(),
            event_time=(self.event_time, self.max_out_of_orderness) if self.event_time else None,
        )


class SinkStep(StepBase):
    """Writes records out through a connector: a JetStream stream (default), Kafka,
    Parquet files, the console, ..."""

    local_reason: ClassVar[str] = "writes where its input is computed"

    type: Literal["sink"] = "sink"
    connector: str = Field(
        default=DEFAULT_CONNECTOR,
        description="Where records go: jetstream (default), kafka, parquet, console, ... "
        "(docs/connectors.md; older specs say 'kind').",
    )
    options: SerializeAsAny[ConnectorOptions] = Field(
        default_factory=NoOptions, description="The connector's own options."
    )
    external: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="The topology's external system this sink writes (default: the one "
        "its options point at, if declared): the planner writes it where it is reachable.",
    )
    stream: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]+$")
    subject: str | None = None
    path: str | None = None
    feed: Literal["anomaly", "pattern", "alert", "none"] | None = Field(
        default=None,
        description="Show this sink's records in the dashboard's live event feed as this "
        "kind (JetStream sinks). Default: 'anomaly' downstream of detect_anomalies, "
        "'pattern' downstream of a pattern step, else not shown.",
    )
    order_by: str | None = Field(
        default=None, description="Field that orders records of one key within a batch."
    )
    once_per: Duration | None = Field(
        default=None,
        gt=0,
        le=30 * 86400,
        description="Write one record per key per this long, not one per reading: the "
        "alert and pattern sinks' flood guard (a suppress step in front of the sink; each "
        "written record counts the 'suppressed' ones).",
    )
    until: Literal["period", "quiet"] = Field(
        default="period",
        description="With once_per: 'period' writes a reminder every once_per while records "
        "keep coming; 'quiet' writes one per incident (the next after once_per of silence).",
    )
    trigger: Duration | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="Micro-batch interval of this sink's query; default: the pipeline's. "
        "A sink of 10 s windows needs no 2 s batches, and each batch costs a small node "
        "the same fixed planning and checkpointing work.",
    )

    mode: Literal["microbatch", "realtime"] | None = Field(
        default=None,
        description="'realtime' runs this sink's query in Spark's Real-Time Mode "
        "(milliseconds from input to output; SQL steps only); default: the pipeline's mode.",
    )
    realtime_batch: Duration = Field(
        default=300.0,
        ge=5,
        le=86400,
        description="Real-Time Mode only: how long each of its long batches runs. Progress "
        "is checkpointed at batch ends; records arriving then wait 0.2–1 s, so longer "
        "batches mean fewer such pauses and a longer replay after a crash.",
    )

    @model_validator(mode="before")
    @classmethod
    def _options(cls, data: Any) -> Any:
        # older specs (and stored control logs) say "kind"
        if isinstance(data, dict) and "kind" in data and "connector" not in data:
            data = {k: v for k, v in data.items() if k != "kind"} | {"connector": data["kind"]}
        return _typed_options("sink", data)

    def expand(self) -> tuple[StepBase, ...]:
        if self.once_per is None:
            return (self,)
        from spanflow.spec.steps.alarms import SuppressStep

        guard = SuppressStep(
            id=derived_id(self.id, "once"),
            inputs=self.inputs,
            once_per=self.once_per,
            until=self.until,
            **self.pins(),
        )
        return (guard, self.model_copy(update={"inputs": (guard.id,), "once_per": None}))

    @property
    def connector_info(self) -> Connector:
        return lookup("sink", self.connector)

    @property
    def nats_subject(self) -> str | None:
        """The NATS subject this sink publishes each record on (a JetStream sink's), so
        others can follow its output live; None for every other connector."""
        return self.subject if self.connector == "jetstream" and self.subject else None

    def realtime_problem(self) -> str | None:
        if not self.connector_info.realtime:
            return (
                f"a {self.connector} sink runs on micro-batches; real time publishes to JetStream"
            )
        if self.order_by:
            return "order_by sorts each micro-batch; real-time output leaves in arrival order"
        return None

    @model_validator(mode="after")
    def _target(self) -> SinkStep:
        if self.connector == "jetstream" and not (self.stream and self.subject):
            raise ValueError("a jetstream sink needs 'stream' and 'subject'")
        if self.connector == "parquet" and not self.path:
            raise ValueError("a parquet sink needs 'path'")
        return self
