"""Every name spanflow gives a JetStream stream, key-value bucket or subject of its own,
in one place: what a process reads here another writes, so both take the name from
this module. (Streams users name — sources, sinks, dead letters — come from pipeline
files; the default dead-letter stream is ``SPANFLOW_DLQ``.)

Names only: no I/O, importable from every layer above ``spec``.
"""

from __future__ import annotations

# -- the control plane (coordinators write; agents read) -----------------------------------
WAL_STREAM = "SPANFLOW_WAL"
WAL_PREFIX = "spanflow.wal"
"""Control decisions, ``spanflow.wal.<kind>``; bounded by snapshots (control/snapshots.py)."""
SNAPSHOTS_BUCKET = "SPANFLOW_SNAPSHOTS"
"""Object store of control-state snapshots the log is truncated behind."""
NODES_BUCKET = "spanflow_nodes"
PIPELINES_BUCKET = "spanflow_pipelines"
ASSIGNMENTS_BUCKET = "spanflow_assignments"
"""Keys ``<node>.<fragment id>``: a node agent watches ``<node>.>``."""
META_BUCKET = "spanflow_meta"
"""``topology`` (sites and links)."""
LEADER_BUCKET = "spanflow_leader"
"""``leader``: the coordinator holding the lease (it expires unless renewed)."""
FENCES_BUCKET = "spanflow_fences"
"""A fragment's epoch: who may write its outputs (spanflow.nats.fences)."""

# -- what agents report (agents write; coordinators read) ----------------------------------
HEARTBEAT_PREFIX = "spanflow.heartbeat"
"""Core NATS (not stored): ``spanflow.heartbeat.<node>``."""
ACTIVITY_STREAM = "SPANFLOW_ACTIVITY"
ACTIVITY_PREFIX = "spanflow.activity"
"""Node reports, ``spanflow.activity.<node>.<fragment id>.<event>``."""
LAST_ASSIGNMENTS_BUCKET = "spanflow_last_assignments"
"""On a site's own server: the assignments its nodes last knew (they run them while the
control plane is out of reach)."""

# -- data paths ---------------------------------------------------------------------------
CUT_SUBJECT_PREFIX = "spanflow.cut"
"""Where a fragment hands its output to the next (``spanflow.cut.<pipeline>.<cut>``)."""
DLQ_SUBJECT_PREFIX = "spanflow.dlq"
"""Dead letters: ``spanflow.dlq.<pipeline>.<reason>`` in the pipeline's dead-letter stream."""
EDGE_ONLY_SUBJECTS = (f"{CUT_SUBJECT_PREFIX}.>", f"{DLQ_SUBJECT_PREFIX}.>")
"""Subjects a site with its own server keeps to itself (``deny_exports`` on its leaf
link): fragment outputs that cross sites travel by stream sourcing, not by subject
interest, and dead letters stay where they happened."""

# -- registries ---------------------------------------------------------------------------
MODEL_MANIFESTS_BUCKET = "SPANFLOW_MODEL_INDEX"
MODEL_FILES_BUCKET = "SPANFLOW_MODELS"
MODEL_PINS_BUCKET = "SPANFLOW_MODEL_PINS"
PUBLISH_REQUESTS_BUCKET = "SPANFLOW_PUBLISH_REQUESTS"
"""KV: per ``publish_as`` name, the latest "publish now" request (its revision counts)."""
RULE_MANIFESTS_BUCKET = "SPANFLOW_RULES"
RULE_PINS_BUCKET = "SPANFLOW_RULE_PINS"

# -- what locked NATS servers keep agents from rewriting (spanflow.security) --------------
CONTROL_SUBJECTS = (f"{WAL_PREFIX}.>",)
"""The control log's subjects: the coordinators' alone."""
PROJECTION_BUCKETS = (NODES_BUCKET, PIPELINES_BUCKET, ASSIGNMENTS_BUCKET, META_BUCKET)
"""The control state's copy agents read (control/log.py projects it): coordinators write."""
CONTROL_STREAMS = (
    WAL_STREAM,
    f"KV_{LEADER_BUCKET}",
    *(f"KV_{bucket}" for bucket in PROJECTION_BUCKETS),
)
"""Streams an agent may read but must never rewrite, purge or delete."""


def token(value: object) -> str:
    """``value`` as one subject or KV-key token: letters, digits, '-' and '_' kept,
    anything else '_' (dots would split it)."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in str(value)) or "_"
