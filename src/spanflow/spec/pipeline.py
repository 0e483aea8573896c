"""A pipeline: a named DAG of steps, validated as a whole.

The spec is plain data: it round-trips through JSON (``to_json``/``from_json``) with
no loss, so the same object can come from Python, YAML or an HTTP body.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spanflow.errors import SpecError
from spanflow.spec.durations import Duration
from spanflow.spec.steps import Step, StepBase, StreamFacts
from spanflow.spec.steps.base import Placement
from spanflow.spec.steps.io import SinkStep, SourceStep

PIPELINE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


class PipelineSpec(BaseModel):
    """A validated pipeline.

    >>> from spanflow.spec import PipelineSpec
    >>> spec = PipelineSpec.model_validate({"name": "p", "steps": [
    ...   {"id": "in", "type": "source", "stream": "S", "schema": {"x": "long"}},
    ...   {"id": "out", "type": "sink", "connector": "console", "inputs": ["in"]}]})
    >>> [s.id for s in spec.topological()]
    ['in', 'out']
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=PIPELINE_NAME, max_length=64)
    steps: tuple[Step, ...] = Field(min_length=2)
    trigger: Duration = Field(
        default=0.5, le=3600, description="Micro-batch interval; 0 = start the next at once."
    )
    mode: Literal["microbatch", "realtime"] = Field(
        default="microbatch",
        description="How sinks run unless they say: 'realtime' runs them in Spark's "
        "Real-Time Mode (milliseconds; SQL steps only, see docs/realtime.md).",
    )
    dead_letter_stream: str = Field(default="SPANFLOW_DLQ", pattern=r"^[A-Za-z0-9_-]+$")
    dead_letter_retention: Duration = Field(
        default=7 * 86400.0,
        gt=0,
        description="How long dead letters are kept when spanflow creates the stream.",
    )
    standby: int = Field(
        default=0,
        ge=0,
        le=1,
        description="Hot standby replicas of each fragment: 1 runs every fragment on two "
        "nodes at once (never the same one), so a node's death does not stall the output "
        "(docs/cluster.md#hot-standby).",
    )
    fragment: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        max_length=80,
        description="Set by the planner on a fragment's spec: which part of the pipeline "
        "this is (its checkpoints and message ids are kept apart from the other parts).",
    )

    @model_validator(mode="after")
    def _graph(self) -> PipelineSpec:
        ids: dict[str, Any] = {}
        for step in self.steps:
            if step.id in ids:
                raise StepInputError(step.id, f"step id {step.id!r} is used twice")
            ids[step.id] = step
        consumers: dict[str, list[str]] = {s.id: [] for s in self.steps}
        for step in self.steps:
            _check_arity(step)
            for upstream in step.inputs:
                if upstream not in ids:
                    raise StepInputError(
                        step.id, f"step {step.id!r} reads from unknown step {upstream!r}"
                    )
                if isinstance(ids[upstream], SinkStep):
                    raise StepInputError(step.id, f"step {step.id!r} reads from sink {upstream!r}")
                consumers[upstream].append(step.id)
        if not any(isinstance(s, SinkStep) for s in self.steps):
            raise ValueError("a pipeline needs at least one sink")
        for step in self.steps:
            if not isinstance(step, SinkStep) and not consumers[step.id]:
                raise StepInputError(
                    step.id, f"the output of step {step.id!r} goes nowhere (add a sink)"
                )
        self._check_acyclic()
        self.facts()  # each step checks what its inputs carry (e.g. a key)
        self._check_realtime()
        self._check_standby()
        return self

    def _check_standby(self) -> None:
        """Hot standby replicas both read and write every connector: each must keep one
        copy of the output under two writers (``Connector.standby``); the error names
        the first step whose connector cannot."""
        if not self.standby:
            return
        for step in self.steps:
            if isinstance(step, SourceStep | SinkStep) and step.connector_info.standby is None:
                role = "source" if isinstance(step, SourceStep) else "sink"
                raise StepInputError(
                    step.id,
                    f"standby: {self.standby} runs every fragment twice, but {role} "
                    f"{step.id!r} ({step.connector}) cannot keep one copy of its "
                    f"{'batches' if role == 'source' else 'output'} under two replicas "
                    "(docs/cluster.md#hot-standby lists the connectors that can)",
                )

    def _check_realtime(self) -> None:
        """Every step on a real-time sink's path must be able to run in Real-Time Mode;
        the error names the first that cannot, and why."""
        core = self.expanded()
        for sink in core.sinks():
            if self.mode_of(sink) != "realtime":
                continue
            for step in core.path_to(sink.id):
                problem = step.realtime_problem()
                if problem is not None:
                    raise StepInputError(
                        step.id,
                        f"sink {sink.id!r} runs in real time, but step {step.id!r} cannot: "
                        f"{problem} (or set mode: microbatch on the sink)",
                    )

    def all_realtime(self) -> bool:
        """Whether every sink runs in Real-Time Mode (no micro-batch pace on any path)."""
        return all(self.mode_of(s) == "realtime" for s in self.sinks())

    def realtime_slots(self) -> int:
        """Task slots this pipeline's real-time queries hold for their whole batches: one
        for the source's read task (which also writes a stateless query's output), and
        one more for a query with keyed state (its shuffle partition)."""
        core = self.expanded()
        slots = 0
        for sink in core.sinks():
            if self.mode_of(sink) == "realtime":
                keyed = any(s.placement == Placement.KEYED for s in core.path_to(sink.id))
                slots += 2 if keyed else 1
        return slots

    def fragment_slots(self) -> int:
        """Fragment slots this pipeline (or fragment) takes on a node: one for its Spark
        query, and one more for each step that keeps state in Python (keyed processors,
        detection, learning, patterns, ...). Those run in Spark's Python workers beside
        the JVM and take about twice a JVM step's CPU per event (docs/benchmarks.md), so a
        node full of them must count them as such (``Capabilities.slots_for`` caps it)."""
        return 1 + sum(1 for s in self.expanded().steps if s.keeps_python_state())

    def mode_of(self, sink: SinkStep) -> str:
        """'realtime' or 'microbatch': the sink's own mode, else the pipeline's."""
        return sink.mode or self.mode

    def path_to(self, step_id: str) -> list[Step]:
        """``step_id`` and every step it reads from, inputs first."""
        wanted: set[str] = set()
        pending = [step_id]
        by_id = {s.id: s for s in self.steps}
        while pending:
            sid = pending.pop()
            if sid not in wanted:
                wanted.add(sid)
                pending.extend(by_id[sid].inputs)
        return [s for s in self.topological() if s.id in wanted]

    def _check_acyclic(self) -> None:
        state: dict[str, int] = {}
        by_id = {s.id: s for s in self.steps}

        def visit(sid: str, path: list[str]) -> None:
            if state.get(sid) == 2:
                return
            if state.get(sid) == 1:
                raise ValueError("steps form a cycle: " + " → ".join([*path, sid]))
            state[sid] = 1
            for up in by_id[sid].inputs:
                visit(up, [*path, sid])
            state[sid] = 2

        for s in self.steps:
            visit(s.id, [])

    @property
    def instance(self) -> str:
        """The name this spec runs under: the pipeline's, plus the fragment for a part of
        it. Checkpoints, query names, message ids and dead-letter subjects use it."""
        return self.name if self.fragment is None else f"{self.name}--{self.fragment}"

    def expanded(self) -> PipelineSpec:
        """The pipeline in core steps: every convenience step (``count``, ``average``,
        ...) replaced by the steps it stands for. What the planner and compilers read."""
        steps = tuple(part for step in self.steps for part in step.expand())
        if steps == self.steps:
            return self
        return self.model_copy(update={"steps": steps})

    def facts(self) -> dict[str, StreamFacts]:
        """What is known about each step's output (key, event time, ...), by step id,
        for the core steps of :meth:`expanded`. Raises :class:`StepInputError` when a
        step cannot take what its inputs carry."""
        out: dict[str, StreamFacts] = {}
        for step in self.expanded().topological():
            inputs = [out[i] for i in step.inputs]
            try:
                step.check_inputs(inputs)
            except StepInputError:
                raise
            except ValueError as exc:
                raise StepInputError(step.id, str(exc)) from None
            out[step.id] = step.facts(inputs)
        return out

    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    def sources(self) -> list[SourceStep]:
        return [s for s in self.steps if isinstance(s, SourceStep)]

    def sinks(self) -> list[SinkStep]:
        return [s for s in self.steps if isinstance(s, SinkStep)]

    def secret_free(self) -> dict[str, Any]:
        """The spec as the API shows it: every connector's options with secrets masked
        (specs submitted before secrets were refused may still hold some)."""
        shown = self.model_dump(mode="json", by_alias=True)
        ends: list[SourceStep | SinkStep] = [*self.sources(), *self.sinks()]
        masked = {s.id: s.options.secret_free() for s in ends}
        for step in shown["steps"]:
            if step.get("id") in masked and "options" in step:
                step["options"] = masked[step["id"]]
        return shown

    def inline_secrets(self) -> list[str]:
        """Every connector option that holds a secret's value (``step id: option``);
        a submission with any is refused (the control plane stores and shows specs)."""
        ends: list[SourceStep | SinkStep] = [*self.sources(), *self.sinks()]
        return [f"{step.id}: {found}" for step in ends for found in step.options.inline_secrets()]

    def trigger_of(self, sink: SinkStep) -> float:
        """The micro-batch interval of a sink's query: its own, else the pipeline's."""
        return self.trigger if sink.trigger is None else sink.trigger

    def topological(self) -> Iterator[Step]:
        """Steps with every step after its inputs (stable in declaration order)."""
        done: set[str] = set()
        pending = list(self.steps)
        while pending:
            for s in pending:
                if all(i in done for i in s.inputs):
                    done.add(s.id)
                    pending.remove(s)
                    yield s
                    break

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_defaults=False, indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> PipelineSpec:
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise SpecError(format_validation_error(exc)) from None


class StepInputError(ValueError):
    """A step does not fit the graph around it (its inputs, its id); names the step so
    front ends can point at it (YAML: its line)."""

    def __init__(self, step_id: str, message: str) -> None:
        self.step_id = step_id
        super().__init__(message)


_COUNT_WORDS = {0: "no", 1: "one", 2: "two", 3: "three"}


def _check_arity(step: StepBase) -> None:
    fewest, most = type(step).arity
    n = len(step.inputs)
    if most == 0:
        if n:
            raise StepInputError(step.id, f"{step.type_name} {step.id!r} cannot have inputs")
        return
    if most is None:
        if n < fewest or len(set(step.inputs)) != n:
            words = _COUNT_WORDS.get(fewest, str(fewest))
            raise StepInputError(
                step.id, f"{step.type_name} {step.id!r} needs {words} or more different inputs"
            )
        return
    if not fewest <= n <= most:
        words = _COUNT_WORDS.get(most, str(most))
        what = "step" if most == 1 else step.type_name
        plural = "input" if most == 1 else "inputs"
        raise StepInputError(step.id, f"{what} {step.id!r} needs exactly {words} {plural}, has {n}")


def format_validation_error(exc: ValidationError) -> str:
    """One readable line per problem: 'steps[2].where: Field required'."""
    lines = []
    for err in exc.errors():
        path = ""
        for part in err["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {msg}" if path else msg)
    return "\n".join(lines)
