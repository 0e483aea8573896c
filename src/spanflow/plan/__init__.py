"""Turn pipelines into fragments and decide which node runs each."""

from spanflow.plan.fragments import fragments_of
from spanflow.plan.placement import ClusterView, PlacementError, Placer

__all__ = ["ClusterView", "PlacementError", "Placer", "fragments_of"]
