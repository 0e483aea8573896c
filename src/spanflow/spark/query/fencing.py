"""A runner's fence: the fragment's epoch it writes under (cluster nodes). Claimed
before any query runs, checked before each micro-batch publishes (the sinks call
:meth:`RunnerFence.check`), and watched every second while real-time queries run,
whose batches publish for minutes. Once a newer epoch holds the fence the runner
writes nothing more (:mod:`spanflow.nats.fences`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from nats.js.kv import KeyValue

from spanflow.nats.fences import Fence, Fenced, check, claim, fences
from spanflow.nats.streams import SyncNats
from spanflow.security.environment import assignment_verifier
from spanflow.spark.query.supervised import Supervised

log = logging.getLogger(__name__)

REALTIME_FENCE_CHECK = 1.0
"""Seconds between fence checks while real-time queries run."""


class RunnerFence:
    """The fence of one runner (``fence`` None: a runner that writes unfenced)."""

    def __init__(
        self,
        fence: Fence | None,
        *,
        pipeline: str,
        replicas: int | None,
        client: Callable[[], SyncNats | None],
    ) -> None:
        self.fence = fence
        self.pipeline = pipeline
        self.replicas = replicas
        self._client = client
        self._verifier = assignment_verifier() if fence and fence.proof else None
        """Locked: tells the coordinators' proofs in fence values from forged ones."""
        self.fenced: str | None = None
        """Why the fence stopped this runner's writes, once it has."""
        self._bucket: KeyValue | None = None
        self._next_check = 0.0

    def bucket(self) -> KeyValue:
        """The fences bucket (opened on first use)."""
        c = self._client()
        assert c is not None, "start() first"
        if self._bucket is None:
            self._bucket = c.run(lambda: fences(c.js, self.replicas))
        return self._bucket

    def claim(self) -> None:
        """Hold this fragment's fence before any query runs (raises Fenced if a newer
        epoch holds it: the fragment was moved on)."""
        c, fence = self._client(), self.fence
        if fence is None or c is None:
            return
        kv = self.bucket()
        c.run(lambda: claim(kv, fence, self._verifier))

    def check(self) -> None:
        """Raise Fenced (and remember why) once a newer epoch holds the fence."""
        c, fence, kv = self._client(), self.fence, self._bucket
        if fence is None or c is None or kv is None:
            return
        try:
            c.run_patiently(
                lambda: check(kv, fence, self._verifier),
                f"{self.pipeline}: fence check",
                permanent=(Fenced,),
            )
        except Fenced as exc:
            self.fenced = str(exc)
            log.warning("%s: not writing: %s", self.pipeline, exc)
            raise

    def watch_realtime(self, live: Iterable[Supervised]) -> None:
        """A micro-batch checks the fence before each publish; a real-time batch
        publishes for minutes, so its fence is checked here instead, at most once per
        :data:`REALTIME_FENCE_CHECK` seconds (``live``: the real-time queries running).
        Fenced, they stop before their batch commits: what they published since the
        newer epoch claimed is re-published by the new owner from the same checkpoint
        with the same message ids, and JetStream keeps one copy."""
        running = list(live)
        now = time.monotonic()
        if self.fence is None or self.fenced or not running or now < self._next_check:
            return
        self._next_check = now + REALTIME_FENCE_CHECK
        try:
            self.check()
        except Fenced:
            for sup in running:
                assert sup.query is not None
                with contextlib.suppress(Exception):
                    sup.query.stop()
                sup.error = self.fenced
        except Exception as exc:  # the server is out of reach: keep going, check again
            log.warning("%s: fence not checked: %s", self.pipeline, exc)
