"""The queue of rumours waiting to be piggybacked: each sent a bounded number of times.

memberlist's ``TransmitLimitedQueue``: a newer rumour about a member replaces any older
one (only the latest verdict matters), rumours sent fewest times go first (new news
spreads before old), and a rumour is dropped after ``limit`` transmissions. A heap with
lazy deletion keeps taking O(k log q) — a member of a 1,000-member group may hold a
rumour about every other one after a mass join.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from spanflow.runtime.membership.messages import Rumour, encoded_size


@dataclass(slots=True)
class _Queued:
    sent: int
    rumour: Rumour
    size: int
    live: bool = True


class BroadcastQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, _Queued]] = []
        """(times sent, -order, entry): least sent first, then newest."""
        self._by_node: dict[str, _Queued] = {}
        self._order = 0

    def __len__(self) -> int:
        return len(self._by_node)

    def push(self, rumour: Rumour) -> None:
        """Queue ``rumour``, replacing what was queued about the same member."""
        old = self._by_node.get(rumour.node)
        if old is not None:
            old.live = False
        self._order += 1
        queued = _Queued(0, rumour, encoded_size(rumour))
        self._by_node[rumour.node] = queued
        heapq.heappush(self._heap, (0, -self._order, queued))

    def take(self, budget: int, limit: int) -> list[Rumour]:
        """Rumours fitting ``budget`` bytes, least-sent and newest first; each taken one
        counts a transmission and is dropped once sent ``limit`` times."""
        chosen: list[tuple[int, int, _Queued]] = []
        skipped: list[tuple[int, int, _Queued]] = []
        while self._heap and budget >= 24:
            entry = heapq.heappop(self._heap)
            queued = entry[2]
            if not queued.live:
                continue
            if queued.size > budget:
                skipped.append(entry)
                continue
            budget -= queued.size
            chosen.append(entry)
        for _, order, queued in chosen:
            queued.sent += 1
            if queued.sent >= limit:
                queued.live = False
                del self._by_node[queued.rumour.node]
            else:
                heapq.heappush(self._heap, (queued.sent, order, queued))
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return [entry[2].rumour for entry in chosen]
