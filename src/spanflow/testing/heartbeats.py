"""Stand-in agents for control-plane tests and benchmarks: real heartbeats over real
NATS for nodes registered without an agent process (no Spark), so the coordinator
keeps them alive."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from spanflow.nats.cluster import HEARTBEAT_PREFIX
from spanflow.nats.streams import connect
from spanflow.protocol.messages import Heartbeat
from spanflow.security.node_seal import seal_headers
from spanflow.security.secrets import node_token


class Heartbeats:
    """Publishes a heartbeat every ``period`` seconds for each node in ``agents``
    (node → agent id; add to it as nodes register), from a thread of its own."""

    def __init__(self, url: str, period: float = 0.5, key: str | None = None) -> None:
        self.url = url
        self.key = key
        """A locked cluster's node-token key: each beat is sealed as its node's."""
        self.period = period
        self.agents: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        nc = await connect(self.url)
        seq = 0
        while not self._stop.is_set():
            seq += 1
            for node, agent in list(self.agents.items()):
                hb = Heartbeat(node=node, agent_id=agent, seq=seq)
                subject, data = f"{HEARTBEAT_PREFIX}.{node}", hb.model_dump_json().encode()
                token = node_token(self.key, node) if self.key else None
                with contextlib.suppress(Exception):  # a NATS server may be down: go on
                    await nc.publish(subject, data, headers=seal_headers(token, subject, data))
            await asyncio.sleep(self.period)
        await nc.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
