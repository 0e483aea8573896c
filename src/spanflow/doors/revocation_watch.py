"""Device revocations at the sites: pushed to the hub, read by each site server.

:func:`push_revocations` stores the operator's signed list
(:mod:`spanflow.security.revocations`) in the hub's bucket. :class:`RevocationWatch`
runs in each locked edge site server: it reads that bucket over the site's leaf link
(the hub's JetStream domain) every few seconds, logged in as the site server's own
client, which may read that bucket and nothing else; a list signed by the
coordinators and newer than the one the site holds is stored in the site's bundle and
the server reloads, closing the revoked devices' connections. A poll rather than a
watch: it needs no consumer at the hub, and a leaf link that was down is caught up
with at the next poll.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from spanflow.errors import SecurityError
from spanflow.nats.cluster import ensure_kv
from spanflow.nats.streams import connect
from spanflow.security.revocations import (
    REVOCATIONS_BUCKET,
    REVOCATIONS_KEY,
    Revocations,
    open_signed,
)
from spanflow.security.secrets import Secrets
from spanflow.security.signing import Unsigned

log = logging.getLogger(__name__)

POLL_INTERVAL = 5.0
"""Seconds between reads of the hub's list: a revoked device is cut off at every site
within about this long of the push (and of its site's leaf link coming back)."""
COMPLAINT_INTERVAL = 60.0
"""At most one warning this often about a list that fails its checks."""


async def push_revocations(url: str, secrets: Secrets) -> Revocations:
    """Store ``secrets``' signed list in the hub's bucket (as the coordinators'
    data-plane identity: the full secrets directory); the list pushed. SecurityError
    when the hub already holds a newer one (pushed from another copy of the secrets)."""
    value = secrets.revocations_file.read_bytes() if secrets.revocations_file.exists() else b""
    verifier = secrets.verifier()
    if not value or verifier is None:
        raise SecurityError(f"{secrets.root} has no signed revocation list to push")
    ours = open_signed(value, verifier)
    nc = await connect(url, identity=secrets.identity("coordinator"))
    try:
        kv = await ensure_kv(nc.jetstream(), REVOCATIONS_BUCKET)
        try:
            held = open_signed((await kv.get(REVOCATIONS_KEY)).value or b"", verifier)
        except (KeyNotFoundError, Unsigned):
            held = None
        if held is not None and held.serial > ours.serial:
            raise SecurityError(
                f"the hub holds a newer revocation list (serial {held.serial}, ours "
                f"{ours.serial}): revoke from the secrets directory that made it"
            )
        await kv.put(REVOCATIONS_KEY, value)
        return ours
    finally:
        await nc.close()


class RevocationWatch:
    """Reads the hub's revocation list for one site server, on a thread of its own;
    calls ``changed`` after storing a newer one (the server then reloads)."""

    def __init__(
        self,
        nats_url: str,
        secrets: Secrets,
        hub_domain: str,
        changed: Callable[[], None],
        *,
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.nats_url = nats_url
        self.secrets = secrets
        self.hub_domain = hub_domain
        self.changed = changed
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="revocation-watch", daemon=True)
        self._complained = float("-inf")
        self._kv: KeyValue | None = None
        """The hub's bucket, once found (looked up once, not at every poll)."""

    def start(self) -> RevocationWatch:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        asyncio.run(self._poll_until_stopped())

    async def _poll_until_stopped(self) -> None:
        nc = None
        try:
            while not self._stop.is_set():
                try:
                    if nc is None:
                        nc = await connect(self.nats_url, identity=self.secrets.site_identity())
                    await self.poll_once(nc)
                except (NatsError, TimeoutError, OSError) as exc:
                    log.debug("revocation list not read this time: %s", exc)
                except SecurityError as exc:
                    self._complain(f"revocation list refused: {exc}")
                await asyncio.to_thread(self._stop.wait, self.interval)
        finally:
            if nc is not None:
                await nc.close()

    async def poll_once(self, nc: Client) -> bool:
        """Read the hub's list once; whether a newer one was stored."""
        try:
            if self._kv is None:
                js = nc.jetstream(domain=self.hub_domain)
                self._kv = await js.key_value(REVOCATIONS_BUCKET)
            entry = await self._kv.get(REVOCATIONS_KEY)
        except (BucketNotFoundError, KeyNotFoundError):
            return False  # nothing revoked since the deployment began
        if not entry.value or not self.secrets.store_revocations(entry.value):
            return False
        log.warning(
            "device revocation list %d stored: reloading to cut off its devices",
            self.secrets.revocations().serial,
        )
        self.changed()
        return True

    def _complain(self, message: str) -> None:
        now = time.monotonic()
        if now - self._complained >= COMPLAINT_INTERVAL:
            self._complained = now
            log.warning("%s", message)
