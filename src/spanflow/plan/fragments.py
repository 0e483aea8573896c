"""Compile a pipeline into fragments.

For now a pipeline is a single fragment: all of its queries run on one node. The
geo-aware planner replaces this with local groups per site and global groups.
"""

from __future__ import annotations

from spanflow.spec.cluster import Fragment
from spanflow.spec.pipeline import PipelineSpec


def fragments_of(spec: PipelineSpec) -> list[Fragment]:
    """
    >>> from spanflow.spec import PipelineSpec
    >>> spec = PipelineSpec.model_validate({"name": "p", "steps": [
    ...   {"id": "in", "type": "source", "stream": "S", "schema": {"x": "long"}},
    ...   {"id": "out", "type": "sink", "kind": "console", "inputs": ["in"]}]})
    >>> [(f.id, f.input_streams) for f in fragments_of(spec)]
    [('p.f0', ('S',))]
    """
    streams = tuple(dict.fromkeys(s.stream for s in spec.sources()))
    return [
        Fragment(
            id=Fragment.make_id(spec.name, 0), pipeline=spec.name, spec=spec, input_streams=streams
        )
    ]
