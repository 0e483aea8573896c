"""Realistic sensor readings for demos, tests and benchmarks.

Each device has its own baseline and a slow daily-like cycle (a period of about an
hour, so that a demo sees it). Event times carry jitter; a fraction of readings is
held back and published late (out of order); malformed messages (broken JSON,
missing fields, wrong types) are injected so that dead-lettering has something to do.

Anomalies come in episodes of five kinds, and every reading says whether it is part
of one (``anomaly``: the kind, or null) so that detectors can be scored:

* ``spike``: one reading far off (temperature +25 to +40, vibration 5 to 8 times);
* ``level_shift``: 20 to 40 readings of the device shifted by 4 to 6 degrees;
* ``drift``: 40 to 80 readings drifting away, up to 6 to 8 degrees;
* ``stuck``: 20 to 40 readings repeating the values of the first;
* ``broken_season``: 40 to 80 readings without the daily cycle.

``anomaly_rate`` is the share of readings inside an episode, on average.

With ``overheat_rate`` (off by default), devices also fail the way a seizing bearing
does, which the cluster demo's event pattern looks for: an ``overheat`` episode of 40
to 80 readings whose temperature climbs by 32 to 40 degrees over its first 60 %, and
whose last 20 % vibrate harder, by 3 to 5 (mm/s) above normal.
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
    "anomaly": "string?",
}
ANOMALY_KINDS = ("spike", "level_shift", "drift", "stuck", "broken_season")
_LENGTHS = {"spike": (1, 1), "level_shift": (20, 40), "drift": (40, 80), "stuck": (20, 40)}
_LENGTHS["broken_season"] = (40, 80)
_MEAN_LENGTH = sum((lo + hi) / 2 for lo, hi in _LENGTHS.values()) / len(_LENGTHS)
_OVERHEAT_LENGTH = (40, 80)


@dataclass
class InjectedEpisode:
    """An anomaly episode the simulator injected: the truth detections are scored
    against (event times in seconds)."""

    site: str
    device: str
    kind: str
    start: float
    end: float


@dataclass
class _Episode:
    """An anomaly under way on one device."""

    kind: str
    length: int
    done: int = 0
    size: float = 0.0
    frozen: tuple[float, float] | None = None
    record: InjectedEpisode | None = None


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
    overheat_rate: float = 0.0
    """Share of readings inside an ``overheat`` episode, on average (0: none, and the
    random stream is the one it always was for a seed)."""
    seed: int | None = None


@dataclass
class SimulatorStats:
    sent: int = 0
    anomalies: int = 0
    malformed: int = 0
    late: int = 0
    started: float = field(default_factory=time.monotonic)
    injected: list[InjectedEpisode] = field(default_factory=list)

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
        self._episodes: dict[str, _Episode] = {}

    def device(self, i: int) -> str:
        return f"dev-{i:03d}"

    def reading(self, now: float) -> tuple[str, bytes]:
        """One message (subject, payload) for the current wall-clock time."""
        cfg = self.config
        dev = self.device(self.rng.randrange(cfg.devices))
        base_t, base_v = self._baseline[dev]
        ts = now - abs(self.rng.gauss(0, cfg.jitter))
        cycle = 3 * math.sin(ts / 600)
        temperature = base_t + cycle + self.rng.gauss(0, 0.5)
        vibration = max(0.0, base_v + self.rng.gauss(0, 0.1))
        episode = self._episode(dev)
        if episode is not None:
            temperature, vibration = self._apply(episode, temperature, vibration, cycle)
            self.stats.anomalies += 1
            self._log(episode, dev, ts)
        record: dict[str, Any] = {
            "device": dev,
            "site": cfg.site,
            "ts": datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds"),
            "temperature": round(temperature, 3),
            "vibration": round(vibration, 4),
            "humidity": round(self.rng.uniform(30, 60), 1),
            "anomaly": episode.kind if episode is not None else None,
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

    def _log(self, episode: _Episode, dev: str, ts: float) -> None:
        """Keep the injected episode's span of event time in ``stats.injected``."""
        if episode.record is None:
            episode.record = InjectedEpisode(self.config.site, dev, episode.kind, ts, ts)
            self.stats.injected.append(episode.record)
        episode.record.start = min(episode.record.start, ts)
        episode.record.end = max(episode.record.end, ts)

    def _episode(self, dev: str) -> _Episode | None:
        """The device's anomaly episode for this reading: one under way, or a new one
        (started so that ``anomaly_rate`` of readings are anomalous on average)."""
        episode = self._episodes.get(dev)
        if episode is None and self.config.overheat_rate > 0:
            episode = self._overheat(dev)
        if episode is None:
            if self.rng.random() >= self.config.anomaly_rate / _MEAN_LENGTH:
                return None
            kind = self.rng.choice(ANOMALY_KINDS)
            lo, hi = _LENGTHS[kind]
            sign = self.rng.choice((-1.0, 1.0))
            size = sign * (
                self.rng.uniform(4, 6) if kind == "level_shift" else self.rng.uniform(6, 8)
            )
            episode = self._episodes[dev] = _Episode(kind, self.rng.randint(lo, hi), size=size)
        episode.done += 1
        if episode.done >= episode.length:
            del self._episodes[dev]
        return episode

    def _overheat(self, dev: str) -> _Episode | None:
        lo, hi = _OVERHEAT_LENGTH
        if self.rng.random() >= self.config.overheat_rate / ((lo + hi) / 2):
            return None
        size = self.rng.uniform(32, 40)
        return self._episodes.setdefault(
            dev, _Episode("overheat", self.rng.randint(lo, hi), size=size)
        )

    def _apply(
        self, episode: _Episode, temperature: float, vibration: float, cycle: float
    ) -> tuple[float, float]:
        if episode.kind == "overheat":
            progress = episode.done / episode.length
            temperature += episode.size * min(1.0, progress / 0.6)
            if progress > 0.8:
                vibration += self.rng.uniform(3, 5)
            return temperature, vibration
        if episode.kind == "spike":
            return temperature + self.rng.uniform(25, 40), vibration * self.rng.uniform(5, 8)
        if episode.kind == "level_shift":
            return temperature + episode.size, vibration
        if episode.kind == "drift":
            return temperature + episode.size * episode.done / episode.length, vibration
        if episode.kind == "stuck":
            if episode.frozen is None:
                episode.frozen = (temperature, vibration)
            return episode.frozen
        return temperature - cycle, vibration  # broken_season: no daily cycle

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


@dataclass(frozen=True)
class DetectedEpisode:
    """An anomaly episode a detector reported (event times in seconds)."""

    site: str
    device: str
    start: float
    end: float
    anomalies: int


@dataclass(frozen=True)
class EpisodeReport:
    """Detected episodes scored against the injected ones."""

    episodes: int  # detected
    true_episodes: int  # detected episodes that overlap an injected one
    flagged: int  # anomalous readings in the detected episodes
    flagged_inside: int  # of them, in episodes that overlap an injected one
    found: dict[str, tuple[int, int]]  # per kind: (injected episodes found, injected)

    @property
    def precision(self) -> float:
        """Share of flagged readings that fell in injected episodes."""
        return self.flagged_inside / self.flagged if self.flagged else 1.0

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {f}/{n}" for k, (f, n) in sorted(self.found.items()))
        return (
            f"{self.flagged_inside} of {self.flagged} flagged readings "
            f"({100 * self.precision:.0f} %) fell inside injected anomalies; "
            f"{self.true_episodes} of {self.episodes} detected episodes were injected ones; "
            f"injected episodes found: {kinds or 'none injected'}"
        )


def episode_report(
    detected: list[DetectedEpisode], injected: list[InjectedEpisode], grace: float = 2.0
) -> EpisodeReport:
    """Match detected episodes to injected ones of the same device: they match when
    their spans overlap, the injected one stretched by ``grace`` seconds at its end
    (the reading that shows an episode is over belongs to it).

    >>> truth = [InjectedEpisode("a", "d1", "spike", 10.0, 10.0),
    ...          InjectedEpisode("a", "d1", "drift", 50.0, 60.0)]
    >>> found = [DetectedEpisode("a", "d1", 10.0, 11.0, 2),
    ...          DetectedEpisode("a", "d1", 30.0, 30.0, 1)]
    >>> r = episode_report(found, truth)
    >>> r.flagged_inside, r.flagged, r.found
    (2, 3, {'spike': (1, 1), 'drift': (0, 1)})
    """
    hits: set[int] = set()
    flagged = inside = true_episodes = 0
    for d in detected:
        flagged += d.anomalies
        matched = [
            i
            for i, e in enumerate(injected)
            if (e.site, e.device) == (d.site, d.device)
            and d.start <= e.end + grace
            and d.end >= e.start - 0.001  # event times travel as milliseconds
        ]
        if matched:
            hits.update(matched)
            inside += d.anomalies
            true_episodes += 1
    found: dict[str, tuple[int, int]] = {}
    for i, e in enumerate(injected):
        got, total = found.get(e.kind, (0, 0))
        found[e.kind] = (got + (i in hits), total + 1)
    return EpisodeReport(len(detected), true_episodes, flagged, inside, found)
