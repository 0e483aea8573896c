"""Compile a pipeline into fragments.

For now a pipeline is a single fragment: all of its queries run on one node. The
geo-aware planner replaces this with local groups per site and global groups.
"""

from __future__ import annotations

from spanflow.spec.cluster import Fragment
from spanflow.spec.operators import SourceStep
from spanflow.spec.pipeline import PipelineSpec


def fragments_of(spec: PipelineSpec, parallelism: int = 1) -> list[Fragment]:
    """The fragments of a pipeline. ``parallelism`` > 1 reads each source with at least
    that many tasks per micro-batch (per-key order across tasks is then not kept).

    >>> from spanflow.spec import PipelineSpec
    >>> spec = PipelineSpec.model_validate({"name": "p", "steps": [
    ...   {"id": "in", "type": "source", "stream": "S", "schema": {"x": "long"}},
    ...   {"id": "out", "type": "sink", "kind": "console", "inputs": ["in"]}]})
    >>> [(f.id, f.input_streams) for f in fragments_of(spec)]
    [('p.f0', ('S',))]
    >>> fragments_of(spec, parallelism=4)[0].spec.sources()[0].partitions
    4
    """
    if parallelism > 1:
        steps = [
            s.model_copy(update={"partitions": min(64, max(s.partitions, parallelism))})
            if isinstance(s, SourceStep)
            else s
            for s in spec.steps
        ]
        spec = spec.model_copy(update={"steps": tuple(steps)})
    streams = tuple(dict.fromkeys(s.stream for s in spec.sources()))
    return [
        Fragment(
            id=Fragment.make_id(spec.name, 0), pipeline=spec.name, spec=spec, input_streams=streams
        )
    ]
