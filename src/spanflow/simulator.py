"""Realistic sensor readings for demos, tests and benchmarks.

Each device has its own baseline and a slow daily-like drift. Event times carry
jitter; a fraction of readings is held back and published late (out of order);
occasional anomalies (temperature and vibration spikes) and malformed messages
(broken JSON, missing fields, wrong types) are injected so that alerting and
dead-lettering have something to do.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from nats.aio.client import Client

SENSOR_SCHEMA = {
    "device": "string",
    "site": "string",
    "ts": "timestamp",
    "temperature": "double",
    "vibration": "double",
    "humidity": "double?",
}


@dataclass(frozen=True)
class SimulatorConfig:
    devices: int = 10
    rate: float = 200.0  # messages per second, all devices together
    site: str = "site-a"
    subject_prefix: str = "sensors"
    jitter: float = 0.5  # seconds of event-time noise
    out_of_order: float = 0.05  # fraction of readings published late
    max_delay: float = 3.0  # seconds a late reading is held back
    anomaly_rate: float = 0.01
    malformed_rate: float = 0.005
    seed: int | None = None


@dataclass
class SimulatorStats:
    sent: int = 0
    anomalies: int = 0
    malformed: int = 0
    late: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        return self.sent / max(1e-9, time.monotonic() - self.started)


class SensorSimulator:
    """Generates readings; ``publish`` sends them to NATS at the configured rate."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config or SimulatorConfig()
        self.rng = random.Random(self.config.seed)
        self.stats = SimulatorStats()
        self._baseline = {
            self.device(i): (self.rng.uniform(18, 28), self.rng.uniform(0.2, 0.8))
            for i in range(self.config.devices)
        }
        self._held: list[tuple[float, int, str, bytes]] = []
        self._n = 0

    def device(self, i: int) -> str:
        return f"dev-{i:03d}"

    def reading(self, now: float) -> tuple[str, bytes]:
        """One message (subject, payload) for the current wall-clock time."""
        cfg = self.config
        dev = self.device(self.rng.randrange(cfg.devices))
        base_t, base_v = self._baseline[dev]
        ts = now - abs(self.rng.gauss(0, cfg.jitter))
        temperature = base_t + 3 * math.sin(ts / 600) + self.rng.gauss(0, 0.5)
        vibration = max(0.0, base_v + self.rng.gauss(0, 0.1))
        if self.rng.random() < cfg.anomaly_rate:
            temperature += self.rng.uniform(25, 40)
            vibration *= self.rng.uniform(5, 8)
            self.stats.anomalies += 1
        record: dict[str, Any] = {
            "device": dev,
            "site": cfg.site,
            "ts": datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds"),
            "temperature": round(temperature, 3),
            "vibration": round(vibration, 4),
            "humidity": round(self.rng.uniform(30, 60), 1),
        }
        subject = f"{cfg.subject_prefix}.{cfg.site}.{dev}"
        if self.rng.random() < cfg.malformed_rate:
            self.stats.malformed += 1
            kind = self.rng.randrange(3)
            if kind == 0:
                return subject, b'{"device": "' + dev.encode() + b'", "temperature": '  # truncated
            if kind == 1:
                record.pop("temperature")
            else:
                record["temperature"] = "hot"
        return subject, orjson.dumps(record)

    def due(self, now: float, count: int) -> list[tuple[str, bytes]]:
        """``count`` new readings plus held-back ones whose delay is over."""
        out = []
        for _ in range(count):
            subject, payload = self.reading(now)
            if self.rng.random() < self.config.out_of_order:
                self._n += 1
                delay = self.rng.uniform(0.5, self.config.max_delay)
                heapq.heappush(self._held, (now + delay, self._n, subject, payload))
                self.stats.late += 1
            else:
                out.append((subject, payload))
        while self._held and self._held[0][0] <= now:
            _, _, subject, payload = heapq.heappop(self._held)
            out.append((subject, payload))
        return out

    async def publish(
        self,
        nc: Client,
        *,
        duration: float | None = None,
        count: int | None = None,
        stop: asyncio.Event | None = None,
    ) -> SimulatorStats:
        """Publish at ``rate`` until ``duration``/``count`` is reached or ``stop`` is set."""
        js = nc.jetstream()
        self.stats = SimulatorStats()
        start = time.monotonic()
        generated = 0
        tick = 0.02
        while True:
            if stop is not None and stop.is_set():
                break
            elapsed = time.monotonic() - start
            if duration is not None and elapsed >= duration:
                break
            if count is not None and generated >= count:
                break
            target = int(elapsed * self.config.rate) + 1
            if count is not None:
                target = min(target, count)
            batch = self.due(time.time(), max(0, target - generated))
            generated = max(generated, target)
            futures = [await js.publish_async(s, p) for s, p in batch]
            if futures:
                await asyncio.wait_for(asyncio.gather(*futures), 30)
            self.stats.sent += len(futures)
            await asyncio.sleep(tick)
        # Release whatever is still held back, so nothing generated is lost.
        rest = [(s, p) for _, _, s, p in sorted(self._held)]
        self._held.clear()
        futures = [await js.publish_async(s, p) for s, p in rest]
        if futures:
            await asyncio.wait_for(asyncio.gather(*futures), 30)
        self.stats.sent += len(futures)
        return self.stats
