"""JetStream, spanflow's own broker: every site's server buffers what devices publish.

Its settings are fields of the source and sink steps themselves (``stream``,
``subjects``, ``subject``...), because the planner rewrites them when it cuts a
pipeline into fragments that meet over JetStream streams.
"""

from __future__ import annotations

from spanflow.spec.connectors.base import Connector, NoOptions, register

SOURCE = register(
    Connector(
        name="jetstream",
        role="source",
        options=NoOptions,
        exactly_once="offsets are stream sequence numbers kept in Spark's checkpoint; a "
        "replayed batch re-reads the same sequence range",
        realtime=True,
    )
)
SINK = register(
    Connector(
        name="jetstream",
        role="sink",
        options=NoOptions,
        exactly_once="each record's Nats-Msg-Id is derived from (pipeline, sink, batch, "
        "content): JetStream drops a replayed batch's copies within the duplicate window",
        realtime=True,
    )
)
