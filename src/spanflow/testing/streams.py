"""Looking into streams from tests and benchmarks."""

from __future__ import annotations

import asyncio

from spanflow.nats.streams import connect


def stored(url: str, stream: str) -> int:
    """Messages ``stream`` holds (0 when it does not exist yet or cannot be asked)."""

    async def go() -> int:
        nc = await connect(url)
        try:
            return int((await nc.jetstream().stream_info(stream)).state.messages)
        except Exception:
            return 0
        finally:
            await nc.close()

    return asyncio.run(go())
