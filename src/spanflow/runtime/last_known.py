"""What a node remembers so that an edge node can restart alone.

An edge node may reboot while its uplink is down: the coordinator is out of reach,
but the node's site server, its streams and its fragments' checkpoints are local.
The agent remembers its last registration on its own disk (:class:`RegistrationCache`:
which NATS server and JetStream domains it uses, its site's stream limits), and its
site's server keeps a copy of its assignments (:class:`LastKnownAssignments`, in
:data:`LAST_ASSIGNMENTS_BUCKET`). With both it runs its local fragments again and
reconciles with the control plane when it returns.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from spanflow.protocol.names import LAST_ASSIGNMENTS_BUCKET as LAST_ASSIGNMENTS_BUCKET
from spanflow.protocol.rest import Registered
from spanflow.security.signing import Unsigned
from spanflow.spec.cluster import Assignment
from spanflow.spec.pipeline import format_validation_error

log = logging.getLogger(__name__)


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


class LastKnownAssignments:
    """This node's assignments as its site's server last saw them (``<node>.<fragment>``
    keys); ``kv`` is None when the node's site has no server of its own (nothing to
    keep: the control plane's bucket is as near)."""

    def __init__(
        self, node: str, kv: KeyValue | None, parse: Callable[[str, bytes], Assignment]
    ) -> None:
        self.kv = kv
        self._prefix = f"{node}."
        self._parse = parse
        """An assignment value as this node may run it (raises Unsigned or ValueError)."""

    async def load(self) -> dict[str, Assignment]:
        """Fragment id → assignment, the unreadable ones left out (and logged)."""
        kv = self.kv
        assert kv is not None
        out: dict[str, Assignment] = {}
        for key in await self._keys():
            try:
                entry = await kv.get(key)
                if entry.value:
                    out[key.partition(".")[2]] = self._parse(key, entry.value)
            except (KeyNotFoundError, ValueError, Unsigned) as exc:
                log.error("unreadable last-known assignment %s: %s", key, exc)
        return out

    async def _keys(self) -> list[str]:
        assert self.kv is not None
        try:
            return [k for k in await self.kv.keys() if k.startswith(self._prefix)]
        except NoKeysError:
            return []

    async def remember(self, key: str, value: bytes | None) -> None:
        """Keep the site's copy current (None: the assignment was removed)."""
        kv = self.kv
        if kv is None:
            return
        try:
            if value is None:
                await kv.delete(key)
            else:
                await kv.put(key, value)
        except Exception as exc:
            log.warning("last-known assignment %s not kept: %s", key, exc)

    async def forget_others(self, current: set[str]) -> None:
        """After the control plane's current assignments arrived: the site's copies of
        any others are stale (removed while this node was away)."""
        if self.kv is None:
            return
        for key in set(await self._keys()) - current:
            await self.remember(key, None)
