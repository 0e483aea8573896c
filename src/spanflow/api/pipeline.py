"""The fluent Python front end: build a pipeline spec the way PySpark builds a plan.

Every call returns a new, immutable object; nothing runs until the spec is handed to
a runner. Options are keyword-only; every step gets a readable id (``filter_2``)
unless you pass ``id=``.

>>> import spanflow as sf
>>> p = sf.Pipeline("alerts")
>>> flow = (p.source("SENSORS", schema={"device": "string", "temp": "double",
...                                      "ts": "timestamp"}, event_time="ts")
...          .filter("temp > -50")
...          .key_by("device")
...          .window(tumbling="10s")
...          .aggregate(n="count", avg_temp="avg(temp)")
...          .sink_console())
>>> [s.type for s in flow.spec().steps]
['source', 'filter', 'key_by', 'window', 'sink']
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from spanflow.api.patterns import Pattern
from spanflow.api.processor import KeyedProcessor
from spanflow.api.yaml_loader import read_avro_schema
from spanflow.errors import SpecError
from spanflow.spec import (
    AggregateStep,
    AverageStep,
    CountStep,
    CountWindowStep,
    DeduplicateStep,
    EnrichStep,
    EventTimeStep,
    FilterStep,
    FlatMapStep,
    ForwardStep,
    JoinStep,
    KeyByStep,
    MapStep,
    PipelineSpec,
    ProcessStep,
    SelectStep,
    SinkStep,
    SourceStep,
    Step,
    SumStep,
    UnionStep,
    WindowStep,
    format_validation_error,
)
from spanflow.spec.patterns import RuleSpec
from spanflow.spec.steps.alarms import SuppressStep
from spanflow.spec.steps.models import DetectAnomaliesStep, LearnStep, ScoreStep
from spanflow.spec.steps.patterns import PatternStep

UserFunction = Callable[..., Any]


def function_ref(fn: UserFunction, step_id: str) -> tuple[str, bool]:
    """(reference text, importable?) for a Python function.

    Module-level functions are referenced as ``module:qualname`` and can be imported
    wherever the spec travels. Lambdas, nested functions and functions of ``__main__``
    are kept in-process only (``__local__:<step>``); a spec that names them runs in
    this process but not from JSON elsewhere.
    """
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<" not in qualname:
        return f"{module}:{qualname}", True
    return f"__local__:{step_id}", False


class Pipeline:
    """A named pipeline under construction: the starting point of the fluent API."""

    def __init__(
        self,
        name: str,
        *,
        trigger: str | float = "500ms",
        dead_letter_stream: str = "SPANFLOW_DLQ",
        dead_letter_retention: str | float = "7d",
        mode: str = "microbatch",
        standby: int = 0,
    ) -> None:
        """``mode="realtime"`` runs every sink in Spark's Real-Time Mode (SQL steps only;
        see docs/realtime.md); :meth:`Stream.realtime` does it for one sink.
        ``standby=1`` runs each fragment on two nodes at once (docs/cluster.md#hot-standby)."""
        self.name = name
        self.mode = mode
        self.standby = standby
        self.trigger = trigger
        self.dead_letter_stream = dead_letter_stream
        self.dead_letter_retention = dead_letter_retention
        self._ids = itertools.count(1)

    def _next_id(self, kind: str) -> str:
        return f"{kind}_{next(self._ids)}"

    def source(
        self,
        stream: str,
        *,
        schema: Mapping[str, str] | None = None,
        subjects: list[str] | None = None,
        format: str | None = None,
        key: str | None = None,
        event_time: str | None = None,
        max_out_of_orderness: str | float | None = None,
        start: str | None = None,
        max_rows_per_batch: int | None = None,
        partitions: int | None = None,
        id: str | None = None,
    ) -> Stream:
        """Read a JetStream stream; each message is decoded into one record. An option
        left None takes the source step's default (docs/pipelines.md)."""
        return self._source(
            id or stream.lower().replace("-", "_"),
            dict(stream=stream, subjects=subjects, partitions=partitions),
            schema=dict(schema or {}),
            format=format,
            key=key,
            event_time=event_time,
            max_out_of_orderness=max_out_of_orderness,
            start=start,
            max_rows_per_batch=max_rows_per_batch,
        )

    def _source(self, id: str, own: dict[str, Any], **common: Any) -> Stream:
        """A source step; options given as None are left to the step's defaults (each
        written once, on the step)."""
        given = {k: v for k, v in {**own, **common}.items() if v is not None}
        step = _build(SourceStep, id=id, **given)
        return Stream(self, (step,), {}, step.id)

    def source_kafka(
        self,
        topic: str,
        *,
        bootstrap: str,
        schema: Mapping[str, str] | None = None,
        format: str | None = None,
        key: str | None = None,
        event_time: str | None = None,
        max_out_of_orderness: str | float | None = None,
        start: str | None = None,
        start_time: str | None = None,
        max_rows_per_batch: int | None = None,
        config: Mapping[str, str] | None = None,
        config_env: Mapping[str, str] | None = None,
        avro_schema: Mapping[str, Any] | str | None = None,
        avro_framing: str | None = None,
        reader: str | None = None,
        id: str | None = None,
    ) -> Stream:
        """Read a Kafka topic (``reader="python"``, the default: spanflow's reader on
        confluent-kafka, which takes librdkafka ``config``; ``"spark"``: Spark's own
        Kafka connector); each record's value is decoded into one record, with its
        key, partition, offset, timestamp and headers as ``_key``, ``_partition``,
        ``_seq``, ``_published`` and ``_headers``. ``event_time="_published"`` takes
        the Kafka timestamp as event time. ``format="avro"`` with ``avro_schema`` (a
        mapping or an .avsc path; ``avro_framing="confluent"`` for Confluent's wire
        format) reads Avro records; without ``schema`` their fields are the Avro
        record's. Secret settings (``sasl.password``...) go in ``config_env``: setting →
        environment variable. See docs/connectors.md."""
        options: dict[str, Any] = {"topic": topic, "bootstrap": bootstrap}
        if start_time is not None:
            options["start_time"] = start_time
        if config:
            options["config"] = dict(config)
        if config_env:
            options["config_env"] = dict(config_env)
        if reader is not None:
            options["reader"] = reader
        avro: dict[str, Any] = {}
        if avro_schema is not None:
            avro["avro_schema"] = (
                read_avro_schema(avro_schema, ".")
                if isinstance(avro_schema, str)
                else dict(avro_schema)
            )
            avro["avro_framing"] = avro_framing
        return self._source(
            id or re.sub(r"[^A-Za-z0-9_]", "_", topic.lower()),
            dict(connector="kafka", options=options, **avro),
            schema=dict(schema or {}),
            format=format,
            key=key,
            event_time=event_time,
            max_out_of_orderness=max_out_of_orderness,
            start=start,
            max_rows_per_batch=max_rows_per_batch,
        )


class Stream:
    """An immutable handle on the output of one step."""

    def __init__(
        self,
        pipeline: Pipeline,
        steps: tuple[Step, ...],
        functions: Mapping[str, UserFunction],
        head: str,
    ) -> None:
        self._pipeline = pipeline
        self._steps = steps
        self._functions = dict(functions)
        self.head = head
        self._sink_mode: dict[str, Any] = {}

    def realtime(self, *, batch: str | float | None = None) -> Stream:
        """The sink that follows runs in Spark's Real-Time Mode: each record reaches it in
        milliseconds instead of at the next micro-batch. Every step before it must be SQL
        (validation names the one that is not). ``batch``: how long each of Real-Time
        Mode's long batches runs (default 5 minutes)."""
        out = Stream(self._pipeline, self._steps, self._functions, self.head)
        out._sink_mode = {"mode": "realtime"}
        if batch is not None:
            out._sink_mode["realtime_batch"] = batch
        return out

    def _then(self, cls: type[Step], prefix: str, id: str | None, /, **params: Any) -> Stream:
        step = _build(cls, id=id or self._pipeline._next_id(prefix), inputs=(self.head,), **params)
        return Stream(self._pipeline, (*self._steps, step), self._functions, step.id)

    def _with_fn(
        self,
        cls: type[Step],
        prefix: str,
        id: str | None,
        fn: UserFunction,
        field: str,
        /,
        **params: Any,
    ) -> Stream:
        step_id = id or self._pipeline._next_id(prefix)
        ref, _ = function_ref(fn, step_id)
        out = self._then(cls, prefix, step_id, **{field: ref}, **params)
        out._functions[ref] = fn
        return out

    # -- stateless -------------------------------------------------------------------
    def filter(self, where: str | UserFunction, *, id: str | None = None) -> Stream:
        """Keep records where a Spark SQL predicate (or a Python ``dict → bool``) holds."""
        if callable(where):
            return self._with_fn(FilterStep, "filter", id, where, "function")
        return self._then(FilterStep, "filter", id, where=where)

    def select(self, *columns: str, id: str | None = None) -> Stream:
        """Project with Spark SQL expressions: ``select("device", "temp * 1.8 + 32 AS f")``."""
        return self._then(SelectStep, "select", id, columns=columns)

    def map(
        self,
        fn: UserFunction | None = None,
        *,
        schema: Mapping[str, str] | None = None,
        id: str | None = None,
        **columns: str,
    ) -> Stream:
        """Add/replace columns with SQL (``map(f="temp * 1.8 + 32")``) or map with Python."""
        if fn is not None:
            if columns:
                raise SpecError("map(): give a function or column expressions, not both")
            return self._with_fn(
                MapStep, "map", id, fn, "function", schema=dict(schema) if schema else None
            )
        return self._then(MapStep, "map", id, columns=columns)

    def flat_map(
        self, fn: UserFunction, *, schema: Mapping[str, str] | None = None, id: str | None = None
    ) -> Stream:
        """Map each record to a list of records with a Python function."""
        return self._with_fn(
            FlatMapStep, "flat_map", id, fn, "function", schema=dict(schema) if schema else None
        )

    def forward(self, *, id: str | None = None) -> Stream:
        return self._then(ForwardStep, "forward", id)

    def add(
        self, field: str, value: float, *, output: str | None = None, id: str | None = None
    ) -> Stream:
        """Add a constant to a numeric field (the classic 'sum' processor)."""
        return self._then(SumStep, "sum", id, field=field, value=value, output=output)

    # -- keys, time, state -----------------------------------------------------------
    def key_by(self, *fields: str, id: str | None = None) -> Stream:
        return self._then(KeyByStep, "key_by", id, key=fields)

    def with_event_time(
        self, field: str, max_out_of_orderness: str | float = 0, *, id: str | None = None
    ) -> Stream:
        return self._then(
            EventTimeStep, "event_time", id, field=field, max_out_of_orderness=max_out_of_orderness
        )

    def window(
        self,
        *,
        tumbling: str | float | None = None,
        sliding: str | float | None = None,
        slide: str | float | int | None = None,
        session: str | float | None = None,
        count: int | None = None,
        allowed_lateness: str | float | None = None,
    ) -> WindowedStream:
        """Start a window: ``tumbling=``, ``sliding=`` (with ``slide=``) or ``session=``
        for event-time windows; ``count=`` (with an optional ``slide=`` in records) for
        windows of a number of records per key. ``allowed_lateness``: how much longer
        an event-time window waits for late records (they go to the dead letters after)."""
        given = [
            k
            for k, v in (
                ("tumbling", tumbling),
                ("sliding", sliding),
                ("session", session),
                ("count", count),
            )
            if v
        ]
        if len(given) != 1:
            raise SpecError("window(): give exactly one of tumbling=, sliding=, session= or count=")
        if given[0] == "tumbling":
            shape: dict[str, Any] = {"kind": "tumbling", "size": tumbling}
        elif given[0] == "sliding":
            shape = {"kind": "sliding", "size": sliding, "slide": slide}
        elif given[0] == "session":
            shape = {"kind": "session", "gap": session}
        else:
            if allowed_lateness is not None:
                raise SpecError("window(): allowed_lateness is for event-time windows")
            shape = {"size": count, "slide": slide}
            return WindowedStream(self, shape, CountWindowStep)
        if allowed_lateness is not None:
            shape["allowed_lateness"] = allowed_lateness
        return WindowedStream(self, shape, WindowStep)

    def deduplicate(self, *key: str, within: str | float, id: str | None = None) -> Stream:
        """Drop records whose key was already seen within ``within`` of event time."""
        return self._then(DeduplicateStep, "deduplicate", id, key=key, within=within)

    def suppress(
        self, once_per: str | float, *, until: str = "period", id: str | None = None
    ) -> Stream:
        """One record per key per ``once_per`` (``until="period"``) or per incident
        (``until="quiet"``: the next after ``once_per`` of silence), each counting the
        held-back ones in ``suppressed``: an alert or pattern flood made actionable."""
        return self._then(SuppressStep, "suppress", id, once_per=once_per, until=until)

    def aggregate(self, *, id: str | None = None, **aggregates: str) -> Stream:
        """Running aggregates per key over the whole stream (no window), emitted as
        updates after every micro-batch: ``key_by("device").aggregate(n="count",
        hi="max(temp)")``."""
        if not aggregates:
            raise SpecError("aggregate(): name at least one aggregate, e.g. n='count'")
        return self._then(AggregateStep, "aggregate", id, aggregates=aggregates)

    def process(
        self,
        processor: type[KeyedProcessor],
        *,
        output_schema: Mapping[str, str],
        timers: str | None = None,
        output_event_time: str | None = None,
        params: Mapping[str, Any] | None = None,
        id: str | None = None,
    ) -> Stream:
        """Run a :class:`spanflow.KeyedProcessor` per key, with its own state and timers.

        ``output_schema`` declares the rows it emits; ``timers`` is ``"event_time"``
        (the default with event time) or ``"processing_time"``; ``params`` are keyword
        arguments of the processor's constructor. See docs/pipelines.md.
        """
        if not (isinstance(processor, type) and issubclass(processor, KeyedProcessor)):
            raise SpecError(
                f"process(): give a class derived from spanflow.KeyedProcessor, got {processor!r}"
            )
        return self._with_fn(
            ProcessStep,
            "process",
            id,
            processor,
            "processor",
            output_schema=dict(output_schema),
            timers=timers,
            output_event_time=output_event_time,
            params=dict(params or {}),
        )

    def detect_anomalies(
        self,
        fields: str | Sequence[str],
        *,
        method: str | None = None,
        threshold: float | str | None = None,
        warmup: int | None = None,
        emit: str = "all",
        seasonality: str | None = None,
        params: Mapping[str, Any] | None = None,
        quiet: int | str | None = None,
        range: tuple[float, float] | Mapping[str, tuple[float, float]] | None = None,
        id: str | None = None,
    ) -> Stream:
        """Score each record for how anomalous it is — per key after ``key_by``, over
        the whole stream without — adding ``anomaly_score`` (0 to 1), ``is_anomaly`` and
        ``anomaly_field``.

        ``method`` (default: ``"multivariate"`` over two or more fields — each field's
        normal learned from the key's warm-up, a fault flagged until it is undone —;
        over one, ``"cad"`` when its ``range`` is declared, else ``"likelihood"``),
        or ``"mewma"``, ``"robust"``, ``"hst"``, ``"river:<module>.<Class>"``;
        ``range``: ``(low, high)`` for every field or ``{field: (low, high)}``, the
        sensors' range; ``threshold``: a score (default 0.5; 0.75 for cad, hst and
        river:), ``"quantile(0.99)"`` or ``"adaptive"``; the first ``warmup`` records of
        a key are never anomalies (default 300 for multivariate, cad and likelihood, 200
        for mewma, 100 for the others); ``seasonality``: a period such as ``"1d"``,
        ``"none"``, or found in the data (likelihood, robust); ``emit="anomalies"`` keeps
        only anomalies, ``emit="episodes"`` gives a row when an episode of anomalies
        starts and one when it ends, after ``quiet`` readings (default 100) or a
        ``quiet`` duration without an anomaly. See docs/ml.md.
        """
        ranges: Any = range
        if isinstance(range, Mapping):
            ranges = {name: tuple(bounds) for name, bounds in range.items()}
        return self._then(
            DetectAnomaliesStep,
            "detect_anomalies",
            id,
            fields=(fields,) if isinstance(fields, str) else tuple(fields),
            method=method,
            threshold=threshold,
            warmup=warmup,
            emit=emit,
            seasonality=seasonality,
            params=dict(params or {}),
            quiet=quiet,
            range=ranges,
        )

    def learn(
        self,
        model: str,
        *,
        features: str | Sequence[str],
        target: str,
        params: Mapping[str, Any] | None = None,
        scale: str = "standard",
        publish_as: str | None = None,
        publish_every: str | float | None = "10m",
        id: str | None = None,
    ) -> Stream:
        """Online learning with a River model — per key after ``key_by``, one model
        without: each record is predicted, then learnt from when ``target`` is set.
        Adds ``prediction``, ``probability`` (classifiers), running metrics and
        ``learned``: ``learn("river:linear_model.LogisticRegression",
        features=["t", "v"], target="failed")``. ``publish_as="name"`` pushes the
        learnt model to the registry every ``publish_every`` (None: never by time) and
        when asked (``spanflow model publish name``). See docs/ml.md."""
        return self._then(
            LearnStep,
            "learn",
            id,
            model=model,
            features=(features,) if isinstance(features, str) else tuple(features),
            target=target,
            params=dict(params or {}),
            scale=scale,
            publish_as=publish_as,
            publish_every=publish_every,
        )

    def score(
        self,
        model: str,
        *,
        stage: str = "production",
        prediction_type: str = "double",
        shadow: bool = False,
        canary: float | None = None,
        canary_key: str | None = None,
        id: str | None = None,
    ) -> Stream:
        """Score each record with the registry's ``model`` at ``stage``, hot-swapped at a
        batch boundary when the registry's pointer moves; adds ``prediction``,
        ``probability`` and ``model_version`` (and ``shadow_*`` with ``shadow=True``).
        ``canary=0.1`` sends a tenth of the keys to the staging version. See docs/ml.md."""
        return self._then(
            ScoreStep,
            "score",
            id,
            model=model,
            stage=stage,
            prediction_type=prediction_type,
            shadow=shadow,
            canary=canary,
            canary_key=canary_key,
        )

    def match(
        self,
        pattern: Pattern | None = None,
        *,
        select: Mapping[str, str] | None = None,
        timeouts: bool = False,
        rule: str | None = None,
        rules: Sequence[RuleSpec] | None = None,
        rule_set: str | None = None,
        id: str | None = None,
    ) -> Stream:
        """One row per match of an event pattern in each key's events (FlinkCEP
        semantics, in event-time order): the key, ``rule``, ``match_start``,
        ``match_end``, ``timed_out`` and the ``select`` fields (SQL over the match:
        ``{"peak": "max(hot.temperature)"}``). ``timeouts=True`` adds partial matches
        that ran out of ``within``. Several patterns: ``rules=[p.rule("name", ...)]``;
        rules that change while running: ``rule_set="name"`` (``spanflow rules push``).
        See docs/patterns.md."""
        if pattern is not None and not isinstance(pattern, Pattern):
            raise SpecError(f"match(): expected a spanflow.Pattern, got {type(pattern).__name__}")
        params: dict[str, Any] = {"select": dict(select or {}), "timeouts": timeouts, "rule": rule}
        if pattern is not None:
            params["pattern"] = pattern.spec()
        if rules:
            params["rules"] = tuple(rules)
        if rule_set is not None:
            params["rule_set"] = rule_set
        return self._then(PatternStep, "match", id, **params)

    def count(
        self,
        *,
        key: str | None = None,
        emit: Literal["updates", "records"] = "updates",
        output: str = "count",
        id: str | None = None,
    ) -> Stream:
        """Count per key (the classic 'count' processor): each changed key's count after
        every micro-batch, or (``emit="records"``) every record with its key's count so
        far in ``output``."""
        return self._then(CountStep, "count", id, key=key, emit=emit, output=output)

    def average(
        self,
        field: str,
        *,
        window: str | float,
        key: str | None = None,
        output: str = "average",
        time: str | None = None,
        lateness: str | float = 0.0,
        id: str | None = None,
    ) -> Stream:
        """Average of ``field`` per key and tumbling window (the classic 'average'
        processor); ``time``/``lateness`` set the event time here, for an input without."""
        return self._then(
            AverageStep,
            "average",
            id,
            field=field,
            window=window,
            key=key,
            output=output,
            time=time,
            lateness=lateness,
        )

    def union(self, *others: Stream, allow_missing: bool = False, id: str | None = None) -> Stream:
        """Records of this stream and the others in one stream: same columns, or with
        ``allow_missing`` a column some streams lack is null in their records."""
        if not others:
            raise SpecError("union(): give at least one other stream")
        return self._combine("union", others, UnionStep, id, allow_missing=allow_missing)

    def join(
        self,
        other: Stream,
        *,
        on: str | Sequence[str],
        within: tuple[str | float, str | float] | str | float,
        how: str = "inner",
        suffix: str = "_right",
        id: str | None = None,
    ) -> Stream:
        """Interval join on event time: each record of this stream with the records of
        ``other`` with the same ``on`` fields whose time is within ``(lower, upper)`` of
        its own, e.g. ``within=("-5s", "+5s")``. ``how`` is ``inner`` or ``left``."""
        on_fields = (on,) if isinstance(on, str) else tuple(on)
        return self._combine(
            "join", (other,), JoinStep, id, on=on_fields, within=within, how=how, suffix=suffix
        )

    def enrich(
        self,
        table: str,
        *,
        on: str,
        schema: Mapping[str, str],
        how: str = "left",
        suffix: str = "_table",
        postgres: Mapping[str, Any] | None = None,
        id: str | None = None,
    ) -> Stream:
        """Add a table's fields to each record whose ``on`` field matches a row's key:
        ``table="kv:DEVICES"`` (a live key-value bucket), ``"file:devices.csv"`` or
        ``"postgres:devices"`` with ``postgres={"dsn": ..., "password_env": ...,
        "refresh": "1m", "notify": "devices"}`` (mirrored live)."""
        extra = {"postgres": dict(postgres)} if postgres is not None else {}
        return self._then(
            EnrichStep,
            "enrich",
            id,
            table=table,
            on=on,
            schema=dict(schema),
            how=how,
            suffix=suffix,
            **extra,
        )

    def _combine(
        self, prefix: str, others: Sequence[Stream], cls: type[Step], id: str | None, **params: Any
    ) -> Stream:
        steps: dict[str, Step] = {s.id: s for s in self._steps}
        functions = dict(self._functions)
        for other in others:
            if other._pipeline is not self._pipeline:
                raise SpecError(f"{prefix}(): the streams belong to different pipelines")
            for s in other._steps:
                steps.setdefault(s.id, s)
            functions.update(other._functions)
        heads = (self.head, *(o.head for o in others))
        step = _build(cls, id=id or self._pipeline._next_id(prefix), inputs=heads, **params)
        return Stream(self._pipeline, (*steps.values(), step), functions, step.id)

    # -- placement pins ----------------------------------------------------------------
    def at_edge(self) -> Stream:
        """Run the last step at every site that hosts its input, on that site's data
        (e.g. a window keyed by something only you know is per site)."""
        return self._pin(at="edge")

    def in_cloud(self) -> Stream:
        """Run the last step, and everything after it, on a cloud node."""
        return self._pin(at="cloud")

    def on(
        self,
        *,
        tags: Sequence[str] = (),
        accelerators: Sequence[str] = (),
        cores: int | None = None,
        memory: str | int | None = None,
    ) -> Stream:
        """Run the last step on a node that has all of ``tags`` (e.g. ``["line-a"]``) and
        all of ``accelerators`` (e.g. ``["gpu"]``), and offers at least ``cores`` cores
        and ``memory`` (``"8g"``, or MiB), as the topology declares them.

        >>> p = Pipeline("p")
        >>> s = p.source("S", schema={"x": "double"}).map(y="x * 2").on(memory="8g")
        >>> s.spec_step().node_memory_mb
        8192
        """
        if isinstance(tags, str):
            tags = [tags]
        if isinstance(accelerators, str):
            accelerators = [accelerators]
        if not tags and not accelerators and cores is None and memory is None:
            raise SpecError("on(): name at least one tag, accelerator, cores or memory")
        step = self.spec_step()
        update: dict[str, Any] = {
            "node_tags": tuple(dict.fromkeys((*step.node_tags, *tags))),
            "node_accelerators": tuple(dict.fromkeys((*step.node_accelerators, *accelerators))),
        }
        if cores is not None:
            update["node_cores"] = cores
        if memory is not None:
            update["node_memory_mb"] = memory
        try:
            return self._pin(**update)
        except ValidationError as exc:
            raise SpecError(f"on(): {exc.errors()[0]['msg']}") from None

    def spec_step(self) -> Step:
        """The spec of the last step (what ``on()``, ``at_edge()``... pin)."""
        return next(s for s in self._steps if s.id == self.head)

    def _pin(self, **update: Any) -> Stream:
        steps = tuple(
            type(s).model_validate({**s.model_dump(by_alias=True), **update})
            if s.id == self.head
            else s
            for s in self._steps
        )
        return Stream(self._pipeline, steps, self._functions, self.head)

    # -- sinks -----------------------------------------------------------------------
    def sink_jetstream(
        self,
        stream: str,
        *,
        subject: str,
        order_by: str | None = None,
        trigger: str | float | None = None,
        id: str | None = None,
        feed: str | None = None,
    ) -> Flow:
        """``trigger`` overrides the pipeline's micro-batch interval for this sink's query;
        ``feed`` (anomaly, pattern, alert, none) shows its records in the dashboard's
        event feed (default: anomaly after detection, pattern after a pattern step)."""
        params: dict[str, Any] = {"stream": stream, "subject": subject, "order_by": order_by}
        if feed is not None:
            params["feed"] = feed
        return self._sink(id, trigger, connector="jetstream", **params)

    def sink_kafka(
        self,
        topic: str,
        *,
        bootstrap: str,
        key: str | None = None,
        headers: Sequence[str] = (),
        config: Mapping[str, str] | None = None,
        config_env: Mapping[str, str] | None = None,
        trigger: str | float | None = None,
        id: str | None = None,
    ) -> Flow:
        """Write each record as JSON to a Kafka topic, one transaction per micro-batch
        (exactly once for read_committed consumers). ``key``: the column whose value is
        the Kafka key; ``headers``: columns also sent as headers; secret settings in
        ``config_env`` (setting → environment variable)."""
        options: dict[str, Any] = {"topic": topic, "bootstrap": bootstrap, "key": key}
        options |= {"headers": tuple(headers), "config": dict(config or {})}
        options |= {"config_env": dict(config_env or {})}
        return self._sink(id, trigger, connector="kafka", options=options)

    def sink_postgres(
        self,
        table: str,
        *,
        dsn: str,
        key: str | Sequence[str] = (),
        password_env: str | None = None,
        create: bool = True,
        trigger: str | float | None = None,
        id: str | None = None,
    ) -> Flow:
        """Upsert each record into a PostgreSQL table by ``key`` (insert without one),
        one transaction per micro-batch with the batch id recorded in it: exactly once.
        The password comes from the environment variable ``password_env``."""
        options: dict[str, Any] = {"table": table, "dsn": dsn, "key": key, "create": create}
        if password_env is not None:
            options["password_env"] = password_env
        return self._sink(id, trigger, connector="postgres", options=options)

    def sink_s3(
        self,
        bucket: str,
        *,
        prefix: str | None = None,
        endpoint: str | None = None,
        format: str = "parquet",
        partition_by: Sequence[str] = (),
        trigger: str | float | None = None,
        id: str | None = None,
        **options: Any,
    ) -> Flow:
        """Write each micro-batch as Parquet (or JSON Lines) objects with deterministic
        names, plus a manifest per batch; credentials from AWS_ACCESS_KEY_ID and
        AWS_SECRET_ACCESS_KEY (or the variables ``access_key_env``/``secret_key_env``
        name). See docs/connectors.md."""
        given: dict[str, Any] = {"bucket": bucket, "prefix": prefix, "endpoint": endpoint}
        given["format"] = format
        given |= {"partition_by": tuple(partition_by), **options}
        return self._sink(id, trigger, connector="s3", options=given)

    def sink_mongodb(
        self,
        collection: str,
        *,
        uri: str,
        database: str,
        key: str | Sequence[str] = (),
        trigger: str | float | None = None,
        id: str | None = None,
        **options: Any,
    ) -> Flow:
        """Upsert each record as a document by a deterministic ``_id`` (the key's
        values, or the batch and the row without a key). See docs/connectors.md."""
        given = {"collection": collection, "uri": uri, "database": database, "key": key}
        return self._sink(id, trigger, connector="mongodb", options={**given, **options})

    def sink_webhook(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        headers_env: Mapping[str, str] | None = None,
        trigger: str | float | None = None,
        id: str | None = None,
        **options: Any,
    ) -> Flow:
        """POST each record as JSON to ``url`` with an ``Idempotency-Key`` header,
        retrying with back-off; refused after the last try: dead-lettered.
        ``headers_env`` maps header names to environment variables (secrets)."""
        given = {"url": url, "headers": dict(headers or {}), "headers_env": dict(headers_env or {})}
        return self._sink(id, trigger, connector="webhook", options={**given, **options})

    def sink_parquet(
        self, path: str, *, trigger: str | float | None = None, id: str | None = None
    ) -> Flow:
        return self._sink(id, trigger, connector="parquet", path=path)

    def sink_console(self, *, trigger: str | float | None = None, id: str | None = None) -> Flow:
        return self._sink(id, trigger, connector="console")

    def _sink(self, id: str | None, trigger: str | float | None, **params: Any) -> Flow:
        if trigger is not None:
            params["trigger"] = trigger
        out = self._then(SinkStep, "sink", id, **params, **self._sink_mode)
        return Flow(self._pipeline, out._steps, out._functions)


class WindowedStream:
    """A stream with a window shape chosen; ``aggregate`` or ``reduce`` completes it."""

    def __init__(
        self, stream: Stream, shape: dict[str, Any], step: type[Step] = WindowStep
    ) -> None:
        self._stream = stream
        self._shape = shape
        self._step = step

    def _emit(self, emit: str) -> dict[str, Any]:
        if self._step is CountWindowStep:
            if emit != "final":
                raise SpecError("a count window emits each window once, when it fills")
            return {}
        return {"emit": emit}

    def aggregate(self, *, emit: str = "final", id: str | None = None, **aggregates: str) -> Stream:
        """Named aggregates: ``aggregate(n="count", avg_t="avg(temp)", hi="max(temp)")``."""
        if not aggregates:
            raise SpecError("aggregate(): name at least one aggregate, e.g. n='count'")
        return self._stream._then(
            self._step, "window", id, aggregates=aggregates, **self._emit(emit), **self._shape
        )

    def reduce(self, fn: UserFunction, *, emit: str = "final", id: str | None = None) -> Stream:
        """Fold each window's records with a Python ``(acc: dict, record: dict) → dict``."""
        return self._stream._with_fn(
            self._step, "window", id, fn, "reduce", **self._emit(emit), **self._shape
        )


class Flow:
    """A finished pipeline (or branch): one or more sinks and everything upstream."""

    def __init__(
        self, pipeline: Pipeline, steps: tuple[Step, ...], functions: Mapping[str, UserFunction]
    ) -> None:
        self._pipeline = pipeline
        self._steps = steps
        self.functions: dict[str, UserFunction] = dict(functions)

    def merge(self, *others: Flow) -> Flow:
        """One pipeline with the sinks of all flows (shared upstream steps kept once)."""
        steps: dict[str, Step] = {s.id: s for s in self._steps}
        functions = dict(self.functions)
        for other in others:
            for s in other._steps:
                if s.id in steps and steps[s.id] != s:
                    raise SpecError(f"two different steps share the id {s.id!r}")
                steps.setdefault(s.id, s)
            functions.update(other.functions)
        return Flow(self._pipeline, tuple(steps.values()), functions)

    def spec(self) -> PipelineSpec:
        p = self._pipeline
        try:
            return PipelineSpec(
                name=p.name,
                steps=self._steps,
                trigger=p.trigger,  # type: ignore[arg-type]
                mode=p.mode,  # type: ignore[arg-type]
                dead_letter_stream=p.dead_letter_stream,
                dead_letter_retention=p.dead_letter_retention,  # type: ignore[arg-type]
                standby=p.standby,
            )
        except ValidationError as exc:
            raise SpecError(format_validation_error(exc)) from None


def _build(cls: type[Step], **params: Any) -> Step:
    try:
        return cls.model_validate(params)
    except ValidationError as exc:
        where = params.get("id", cls.__name__)
        raise SpecError(f"step '{where}': {format_validation_error(exc)}") from None
