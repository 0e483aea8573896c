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
        standby="the replicas agree each micro-batch's sequence range (the first to plan "
        "it records it, the other takes it), so both run the same batches",
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
        standby="both replicas publish the same agreed batches under the same message ids: "
        "JetStream keeps the first copy (a replica further behind than the stream's "
        "duplicate window, 15 minutes by default, would add copies)",
        realtime=True,
    )
)
