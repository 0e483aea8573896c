"""How a node learns what to run: it watches its own keys (``<node>.>``) in the control
plane's assignments bucket, not the coordinator, so the coordinator may restart or be
unreachable for a while without any query stopping.

The watch runs on the NATS event-loop thread and queues each change; the agent's main
thread drains the queue into the assignments it wants (:meth:`AssignmentWatch.drain`).
Locked, a value runs only when the coordinators signed it.
"""

from __future__ import annotations

import asyncio
import logging
import queue

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from spanflow.nats.cluster import ASSIGNMENTS_BUCKET, ensure_kv
from spanflow.nats.streams import SyncNats
from spanflow.runtime.last_known import LastKnownAssignments
from spanflow.security.environment import assignment_verifier
from spanflow.security.signing import Unsigned, read_signed
from spanflow.spec.cluster import Assignment

log = logging.getLogger(__name__)


class AssignmentWatch:
    def __init__(self, node: str) -> None:
        self.node = node
        self.kv: KeyValue | None = None
        """The control plane's assignments bucket, once reached."""
        self.refused = 0
        """Assignment values whose signature did not verify (forged, not run)."""
        self._verifier = assignment_verifier()
        self.proofs: dict[tuple[str, int], bytes] = {}
        """(fragment id, epoch) → the signed value it was read from (locked): what its
        runner's fence value carries as proof (spanflow.nats.fences)."""
        self._changes: queue.Queue[tuple[str, Assignment | None]] = queue.Queue()
        self.last_known = LastKnownAssignments(node, None, self.parse)
        self._task: asyncio.Task[None] | None = None

    def parse(self, key: str, value: bytes) -> Assignment:
        """An assignment value as this node may run it: locked, only what the
        coordinators signed, found under the key they signed it for
        (:class:`Unsigned` otherwise: a genuine assignment of another node or fragment,
        copied onto this node's key by the server, must not run here)."""
        assignment = Assignment.model_validate_json(read_signed(value, self._verifier))
        if self._verifier is not None:
            if (assignment.node, assignment.key) != (self.node, key):
                raise Unsigned(f"signed for {assignment.key}, found under {key}")
            fid = assignment.fragment.id
            for old in [k for k in self.proofs if k[0] == fid]:
                del self.proofs[old]
            self.proofs[(fid, assignment.epoch)] = value
        return assignment

    def connect(self, client: SyncNats, control: JetStreamContext, patience: float) -> bool:
        """Open the assignments bucket and watch this node's keys; False when the
        control plane's JetStream cannot be reached (an edge site's uplink is down)."""
        try:
            self.kv = client.run(lambda: ensure_kv(control, ASSIGNMENTS_BUCKET), timeout=patience)
        except Exception as exc:
            log.warning("assignments unreachable: %s", exc or type(exc).__name__)
            return False
        client.run(self._start)
        return True

    async def _start(self) -> None:
        assert self.kv is not None
        watcher = await self.kv.watch(f"{self.node}.>")

        async def watch() -> None:
            current: set[str] | None = set()  # keys of the initial values, until they end
            async for entry in watcher:
                if entry is None:
                    if current is not None:
                        await self.last_known.forget_others(current)
                        current = None
                    continue
                if entry.operation in ("DEL", "PURGE") or not entry.value:
                    self._changes.put((entry.key, None))
                    await self.last_known.remember(entry.key, None)
                    continue
                if not self._queue(entry.key, entry.value):
                    continue
                await self.last_known.remember(entry.key, entry.value)
                if current is not None:
                    current.add(entry.key)

        self._task = asyncio.get_running_loop().create_task(watch())

    def _queue(self, key: str, value: bytes) -> bool:
        """Queue a readable, trusted assignment; False (and logged) otherwise."""
        try:
            self._changes.put((key, self.parse(key, value)))
        except Unsigned as exc:
            self.refused += 1
            log.error("assignment %s refused, not run: %s", key, exc)
            return False
        except ValueError as exc:
            log.error("unreadable assignment %s: %s", key, exc)
            return False
        return True

    def drain(self, desired: dict[str, Assignment], timeout: float) -> None:
        """Apply the queued changes to ``desired`` (fragment id → assignment), waiting
        up to ``timeout`` for the first."""
        try:
            key, value = self._changes.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            fid = key.partition(".")[2]
            if value is None:
                desired.pop(fid, None)
            else:
                desired[fid] = value
            try:
                key, value = self._changes.get_nowait()
            except queue.Empty:
                return
