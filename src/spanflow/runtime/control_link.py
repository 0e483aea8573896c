"""The node's line to the coordinators: register, rejoin after a cut, ask to shed.

Every request goes through :class:`~spanflow.protocol.client.CoordinatorClient`, which
knows there may be several coordinators (a standby redirects writes to the leader, an
unreachable one is skipped). The agent never gives up registering (:class:`Backoff`:
retries forever with capped exponential delays); a node that registered before
starts from its saved registration once no coordinator has answered for
``offline_after`` seconds, and keeps registering in the background.

>>> b = Backoff(initial=1.0, cap=8.0, jitter=0.0)
>>> [b.next() for _ in range(6)]
[1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
>>> b.reset(); b.next()
1.0
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from spanflow.clock import Clock
from spanflow.errors import SpanflowError
from spanflow.protocol.client import CoordinatorClient, CoordinatorUnreachable
from spanflow.protocol.messages import ScaleReport, ShedRequest
from spanflow.protocol.rest import Registered
from spanflow.runtime.agent_settings import AgentSettings
from spanflow.runtime.last_known import RegistrationCache
from spanflow.security.https import client_context

log = logging.getLogger(__name__)


class AgentError(SpanflowError):
    code = "agent_error"


@dataclass
class Backoff:
    """Delays between attempts: ``initial``, doubling up to ``cap``, each spread by
    ±``jitter`` so that the nodes of a site that lost the coordinator together do not
    all retry at the same instant."""

    initial: float = 0.5
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    _delay: float = field(default=0.0, init=False)

    def next(self) -> float:
        """The delay before the next attempt."""
        delay = self._delay = (
            self.initial if self._delay == 0.0 else min(self.cap, self._delay * self.factor)
        )
        return delay * (1 + self.jitter * (2 * self.rng.random() - 1))

    def reset(self) -> None:
        """After a success: the next failure starts from ``initial`` again."""
        self._delay = 0.0


class ControlLink:
    def __init__(self, settings: AgentSettings, cache: RegistrationCache, clock: Clock) -> None:
        self.settings = settings
        self.cache = cache
        self.clock = clock
        self.offline = False
        """Started from the saved registration; not registered with a coordinator yet."""
        self.sleep: Callable[[float], None] = time.sleep
        """How the back-off waits (a test passes time on its clock instead)."""
        timings, tls = settings.timings, client_context()  # made once, not per attempt
        self._registrar = CoordinatorClient(
            settings.coordinator_url, settings.token, timeout=timings.register_timeout, verify=tls
        )
        self._shedding = CoordinatorClient(
            settings.coordinator_url, settings.token, timeout=timings.shed_timeout, verify=tls
        )

    def register(self, body: dict[str, Any], *, once: bool = False) -> Registered | None:
        """Register, retrying with back-off for as long as it takes (4xx answers are
        final: :class:`AgentError`). After ``offline_after`` seconds without an answer a
        node with a saved registration gets that (``offline`` is then set). ``once``: one
        round of the coordinators, None when none answered."""
        backoff = Backoff()
        offline_at = self.clock.monotonic() + self.settings.offline_after
        while True:
            r, problem = self._attempt(body, offline_at)
            if r is not None and not problem:
                break
            if once:
                return None
            saved = self.cache.load()
            if saved is not None and self.clock.monotonic() >= offline_at:
                log.warning(
                    "coordinators %s unreachable (%s): starting from the registration saved "
                    "in %s; registering again in the background",
                    self.settings.coordinator_url,
                    problem,
                    self.cache.path,
                )
                self.offline = True
                return saved
            delay = backoff.next()
            if saved is not None:  # the saved registration is taken when due, not later
                delay = min(delay, max(0.0, offline_at - self.clock.monotonic()))
            log.warning(
                "coordinators %s unreachable (%s); retrying in %.1f s",
                self.settings.coordinator_url,
                problem,
                delay,
            )
            self.sleep(delay)
        if r.status_code >= 400:
            raise AgentError(f"registration refused ({r.status_code}): {detail(r)}")
        answer = Registered.model_validate_json(r.content)
        self.cache.save(answer)
        self.offline = False
        return answer

    def _attempt(
        self, body: dict[str, Any], offline_at: float
    ) -> tuple[httpx.Response | None, str]:
        """One round of the coordinators: the answer, and what was wrong ('' if nothing).
        With a saved registration a request waits no longer than until it is due."""
        patience = self.settings.timings.register_timeout
        if self.cache.path.exists():
            left = offline_at - self.clock.monotonic()
            patience = min(patience, max(1.0, left))
        self._registrar.timeout = patience
        try:
            r = self._registrar.request("POST", "/api/v1/nodes", body)
        except CoordinatorUnreachable as exc:
            return None, str(exc)
        if r.status_code >= 500:  # broken, not refusing: the next one may answer
            self._registrar.skip()
            return r, f"answered {r.status_code}"
        return r, ""

    def rejoin(
        self,
        stop: threading.Event,
        register_once: Callable[[], object],
        reach_control: Callable[[], bool],
    ) -> None:
        """In the background, with back-off: register with a coordinator (while
        ``offline``) and reach the control plane's assignments (``reach_control``, True
        once reached); the main loop then reconciles with them."""
        backoff = Backoff(initial=1.0, cap=self.settings.timings.rejoin_every)
        while not stop.is_set():
            if self.offline:
                try:
                    register_once()
                except AgentError as exc:
                    log.error("registration refused: %s", exc)
            if reach_control() and not self.offline:
                log.info("node %s registered", self.settings.name)
                return
            stop.wait(backoff.next())

    def ask_to_shed(self, request: ShedRequest) -> httpx.Response:
        """Ask the coordinators to move a fragment of this node to a peer (blocking;
        :class:`CoordinatorUnreachable` when none answered)."""
        path = f"/api/v1/nodes/{self.settings.name}/shed"
        return self._shedding.request("POST", path, request.model_dump())

    def report_scaled(self, report: ScaleReport) -> httpx.Response:
        """Tell the coordinators this node's new executor allocation (blocking;
        :class:`CoordinatorUnreachable` when none answered)."""
        path = f"/api/v1/nodes/{self.settings.name}/scaled"
        return self._shedding.request("POST", path, report.model_dump())


def detail(r: httpx.Response) -> str:
    """What a coordinator said with an error."""
    try:
        said = r.json().get("detail")
    except ValueError:
        return r.text[:300]
    return str(said)
