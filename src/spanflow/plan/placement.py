"""Where fragments run: the interface the coordinator calls (:class:`Placer`) and the
view of the cluster it decides on (:class:`ClusterView`). The geo-aware planner
(:class:`spanflow.plan.planner.GeoPlacer`) implements it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from spanflow.spec.cluster import Fragment, NodeRecord, NodeState, PipelineRecord
from spanflow.spec.topology import Topology


class PlacementError(Exception):
    """No node can take a fragment; the message says which constraint failed."""


@dataclass
class ClusterView:
    """What a placer may look at: the topology, node states and current load."""

    topology: Topology
    nodes: Mapping[str, NodeRecord]
    used_slots: dict[str, int] = field(default_factory=dict)
    cpu_percent: Mapping[str, float] = field(default_factory=dict)
    used_realtime: dict[str, int] = field(default_factory=dict)
    """Real-Time Mode task slots held by the fragments placed on each node."""
    replicas_at: dict[str, set[str]] = field(default_factory=dict)
    """A fragment's base id → the nodes its replicas are counted on (hot standby)."""

    def partners(self, fragment: Fragment) -> set[str]:
        """Nodes that hold another replica of ``fragment``: never its node too."""
        return set(self.replicas_at.get(fragment.base_id, ()))

    def slots(self, node: str) -> int:
        return self.nodes[node].spec.capabilities.fragment_slots

    def free_realtime(self, node: str) -> int:
        return self.nodes[node].spec.capabilities.realtime_slots - self.used_realtime.get(node, 0)

    def realtime_fits(self, fragment: Fragment, node: str) -> bool:
        """Has the node the Real-Time Mode task slots the fragment's real-time sinks hold?"""
        return realtime_need(fragment) <= self.free_realtime(node)

    def need(self, fragment: Fragment, node: str) -> int:
        """Fragment slots ``fragment`` takes on ``node`` (Python stateful steps count)."""
        return fragment.slots_on(self.nodes[node].spec.capabilities)

    def fits(self, fragment: Fragment, node: str) -> bool:
        """Has the node the fragment slots and the real-time task slots it takes?"""
        return self.need(fragment, node) <= self.free_slots(node) and self.realtime_fits(
            fragment, node
        )

    def release(self, fragment: Fragment, node: str) -> None:
        """Uncount the fragment on ``node`` (to place it again)."""
        need = self.need(fragment, node)
        self.used_slots[node] = self.used_slots.get(node, need) - need
        self.replicas_at.get(fragment.base_id, set()).discard(node)
        realtime = realtime_need(fragment)
        if realtime:
            self.used_realtime[node] = self.used_realtime.get(node, realtime) - realtime

    def take(self, fragment: Fragment, node: str) -> None:
        """Count the fragment's slots (and real-time task slots) on ``node``."""
        self.used_slots[node] = self.used_slots.get(node, 0) + self.need(fragment, node)
        self.replicas_at.setdefault(fragment.base_id, set()).add(node)
        realtime = realtime_need(fragment)
        if realtime:
            self.used_realtime[node] = self.used_realtime.get(node, 0) + realtime

    def free_slots(self, node: str) -> int:
        return self.slots(node) - self.used_slots.get(node, 0)

    def load(self, node: str) -> float:
        slots = self.slots(node)
        return self.used_slots.get(node, 0) / slots if slots else 1.0

    def schedulable(self, exclude: Iterable[str] = ()) -> list[NodeRecord]:
        skip = set(exclude)
        return [n for n in self.nodes.values() if n.state == NodeState.ALIVE and n.name not in skip]


def slot_need(fragment: Fragment) -> int:
    """Fragment slots a fragment asks for: one, plus one per Python stateful step."""
    return fragment.spec.fragment_slots()


def realtime_need(fragment: Fragment) -> int:
    """Spark task slots a fragment's Real-Time Mode queries hold for their whole batches."""
    return fragment.spec.realtime_slots()


class Placer(Protocol):
    def place(
        self,
        pipeline: PipelineRecord,
        fragments: list[Fragment],
        view: ClusterView,
        *,
        exclude: Iterable[str] = (),
    ) -> dict[str, str]:
        """fragment id → node name for every fragment, or :class:`PlacementError`.

        ``view.used_slots`` is updated for the slots the returned placement takes."""
        ...
