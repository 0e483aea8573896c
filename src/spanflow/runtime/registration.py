"""How a node agent keeps trying to join its cluster, and what it remembers so that an
edge node can restart alone.

An edge node may reboot while its uplink is down: the coordinator is out of reach,
but the node's site server, its streams and its fragments' checkpoints are local.
The agent therefore never gives up registering (:class:`Backoff`, retries forever with
capped exponential delays), and remembers its last registration on its own disk
(:class:`RegistrationCache`): which NATS server and JetStream domains it uses, its
site's stream limits. With that and the last-known assignments its site's server
keeps (:data:`LAST_ASSIGNMENTS_BUCKET`), it runs its local fragments again and
reconciles with the control plane when it returns.

>>> b = Backoff(initial=1.0, cap=8.0, jitter=0.0)
>>> [b.next() for _ in range(6)]
[1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
>>> b.reset(); b.next()
1.0
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from spanflow.protocol.names import LAST_ASSIGNMENTS_BUCKET as LAST_ASSIGNMENTS_BUCKET
from spanflow.protocol.rest import Registered
from spanflow.spec.pipeline import format_validation_error

log = logging.getLogger(__name__)


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


class RegistrationCache:
    """The node's last registration answer, in ``<directory>/<node>.registration.json``
    (readable by its owner only: the NATS URL may carry credentials)."""

    def __init__(self, directory: Path, node: str) -> None:
        self.path = directory / f"{node}.registration.json"

    def save(self, answer: Registered) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(answer.model_dump_json(by_alias=True))
        os.replace(tmp, self.path)

    def load(self) -> Registered | None:
        """The saved answer, or None (never saved, or unreadable: then say so)."""
        try:
            return Registered.model_validate_json(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("ignoring the saved registration %s: %s", self.path, exc)
            return None
        except ValidationError as exc:
            log.warning(
                "ignoring the saved registration %s: not a registration (%s)",
                self.path,
                format_validation_error(exc),
            )
            return None
