"""What a node measures of its fragments and streams, as heartbeats, the REST API and
/metrics carry it: latency histograms, a query's figures, a fragment's runtime, how full
a stream is. Plain JSON (pydantic), never pickled."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

LATENCY_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Upper bounds (seconds) of every latency and duration histogram spanflow reports."""


class Histogram(BaseModel):
    """Observations counted into :data:`LATENCY_BUCKETS` (the last count: above them),
    with their sum: a Prometheus histogram before it is made cumulative."""

    counts: list[int] = Field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    sum: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, seconds: float, times: int = 1) -> None:
        i = next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), len(LATENCY_BUCKETS))
        self.counts[i] += times
        self.sum += seconds * times

    def merge(self, counts: list[int], total: float) -> None:
        """Add observations already counted per bucket (``counts``, as :attr:`counts`)
        whose sum is ``total``: a whole batch's at once."""
        for i, n in enumerate(counts):
            self.counts[i] += n
        self.sum += total

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations ≤ le) per bucket, ``+Inf`` last."""
        out, total = [], 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class QueryMetrics(BaseModel):
    """One sink's query of a fragment, since it started on this node (counters restart
    with the fragment: Prometheus's ``rate`` and ``increase`` take that in their stride)."""

    realtime: bool = False
    records_in: int = Field(default=0, description="Records its batches read.")
    records_out: int | None = Field(
        default=None,
        description="Records it wrote (JetStream sinks on micro-batches; None: not counted).",
    )
    batches: int = 0
    batch_seconds: Histogram = Field(
        default_factory=Histogram, description="Micro-batch durations (processing latency)."
    )
    latency_seconds: Histogram = Field(
        default_factory=Histogram,
        description="End to end: publish time of each output record minus that of its "
        "input record (records that keep their source's _published, and window results: "
        "from their newest record).",
    )
    checkpoint_seconds: Histogram = Field(
        default_factory=Histogram,
        description="Per batch: offset log write, commit log write and state store commits.",
    )
    state_rows: int = Field(default=0, description="Rows in its state stores (last batch).")
    state_bytes: int = Field(default=0, description="Memory its state stores use (last batch).")
    trigger_seconds: float = Field(default=0.0, description="Its micro-batch interval.")
    last_batch_seconds: float = 0.0


class FragmentRuntime(BaseModel):
    """What a node reports about one of its fragments."""

    fragment_id: str
    epoch: int
    status: Literal["starting", "running", "failing", "stopped", "failed", "finished", "fenced"]
    started_at: float | None = None
    queries: dict[str, str] = Field(default_factory=dict, description="sink → Spark run id")
    batches: int = 0
    rows_in: int = Field(
        default=0,
        description="Records it read, each once however many of its queries read it "
        "(queries that read the same sources count as one).",
    )
    source_rows_in: int = Field(
        default=0,
        description="The part of rows_in read from the pipeline's own sources (not from "
        "another fragment's output): what a pipeline's input sums.",
    )
    input_rows_per_s: float = Field(
        default=0.0,
        description="Input rate, each record once (real-time queries' live rate included).",
    )
    source_rows_per_s: float = Field(
        default=0.0, description="The part of input_rows_per_s from the pipeline's sources."
    )
    processed_rows_per_s: float = 0.0
    realtime_rows_per_s: float = Field(
        default=0.0,
        description="rows/s its real-time queries read, live (their batches last minutes); "
        "already part of input_rows_per_s",
    )
    last_batch_ms: int = 0
    lag: int = Field(default=0, description="Messages behind its inputs' ends (slowest query).")
    watermark: str | None = None
    restarts: int = 0
    dead_letters: int = 0
    late_records: int = Field(
        default=0, description="Of dead_letters, records too late for their windows (reason late)."
    )
    offsets: dict[str, Any] = Field(default_factory=dict, description="sink → committed offsets")
    error: str | None = None
    metrics: dict[str, QueryMetrics] = Field(
        default_factory=dict, description="sink → its query's counters and histograms"
    )


class StreamUsage(BaseModel):
    """How full a stream a node uses is, against its limits (spanflow.spec.retention).

    >>> u = StreamUsage(stream="SENSORS", messages=9, bytes=900, max_bytes=1000)
    >>> u.warning
    'stream SENSORS is 90 % full (900 B of 1000 B); when full it refuses new messages'
    """

    stream: str
    messages: int = 0
    bytes: int = 0
    max_bytes: int | None = None
    """None: no limit."""
    max_age: float | None = None
    discard: Literal["new", "old"] = "new"
    warn_at: float = 0.8

    @property
    def ratio(self) -> float | None:
        return self.bytes / self.max_bytes if self.max_bytes else None

    @property
    def warning(self) -> str | None:
        """What to tell an operator when the stream is near its limit (None: fine)."""
        ratio = self.ratio
        if ratio is None or ratio < self.warn_at:
            return None
        when_full = "refuses new messages" if self.discard == "new" else "drops the oldest"
        return (
            f"stream {self.stream} is {ratio:.0%} full ({_size(self.bytes)} of "
            f"{_size(self.max_bytes or 0)}); when full it {when_full}"
        ).replace("%", " %")


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"
