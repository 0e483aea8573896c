"""Rising signals by name: each raise gets a higher number (a key-value revision),
so a reader that remembers the last number it acted on sees every new one. Used for
"publish your models now" requests to online-learning steps."""

from __future__ import annotations

import time
from dataclasses import dataclass

from nats.js.errors import KeyNotFoundError

from spanflow.nats.cluster import ensure_kv
from spanflow.store.session import JetStream


@dataclass(frozen=True)
class Signals:
    js: JetStream
    bucket: str

    async def raise_signal(self, name: str) -> int:
        """Raise ``name``'s signal; its new number."""
        kv = await ensure_kv(self.js, self.bucket)
        return int(await kv.put(name, str(time.time()).encode()))

    async def latest(self, name: str) -> int:
        """The number of ``name``'s latest signal (0: never raised)."""
        kv = await ensure_kv(self.js, self.bucket)
        try:
            entry = await kv.get(name)
        except KeyNotFoundError:
            return 0
        return entry.revision or 0
