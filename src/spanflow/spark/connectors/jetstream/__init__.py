"""JetStream, spanflow's own broker, as a Spark connector like the others: a reader
(:mod:`.source`, a Python data source), a micro-batch writer (:mod:`.sink`, publishing
from the driver's JVM), Real-Time Mode (:mod:`.realtime`, the JVM source and
``ForeachWriter``) and the jar they run in (:mod:`.jvm_jar`, ``jvm/``).

Its options are fields of the source and sink steps (``stream``, ``subjects``,
``subject``...; :mod:`spanflow.spec.steps.io`), because the planner rewrites them
when it cuts a pipeline into fragments that meet over JetStream streams.

Nothing is imported here: Spark's Python workers import :mod:`.source` through this
package. The registry imports every module (:func:`spanflow.plugins.import_all`).
"""
