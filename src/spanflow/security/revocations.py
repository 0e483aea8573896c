"""The device revocation list: how a revocation reaches sites whose bundle is older.

A site's server admits the devices its bundle names (``spanflow secrets export site``).
A device revoked afterwards (``spanflow secrets device NAME --revoke``) is gone from the
operator's secrets, but not from bundles already on site hosts: without more, it would
keep logging in at every site whose bundle was made before.

So revoking also writes a list, signed with the coordinators' key (``control.key``,
never on a site), of revoked *credentials*: a device's name with a fingerprint of its
password, so a device re-added under the same name with a new password is not
revoked again, and the old password stays revoked. ``spanflow secrets revocations
--push`` stores the list in the hub's ``spanflow_revocations`` bucket; each site server
reads it over its leaf link (:mod:`spanflow.doors.revocation_watch`), checks the
signature with ``control.pub``, keeps it only if its serial is higher than the one it
holds, and reloads: the revoked devices' connections are closed and their logins
refused, at its NATS server and its MQTT gateway alike.

Nothing here can revoke less: a forged list fails the signature, an older genuine one
(a replay) the serial, and a list removed from the bucket leaves each site with the
last one it stored.

>>> listed = Revocations().adding(credential_id("press-7", "old"))
>>> listed.serial, listed.revokes("press-7", "old"), listed.revokes("press-7", "new")
(1, True, False)
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, ValidationError

from spanflow.errors import SecurityError
from spanflow.security.signing import Signer, Unsigned, Verifier, unwrap

REVOCATIONS_FILE = "revocations.json"
"""In a secrets directory or bundle: the signed list, as last written or stored."""
REVOCATIONS_BUCKET = "spanflow_revocations"
"""The hub's bucket the list is pushed to (key :data:`REVOCATIONS_KEY`)."""
REVOCATIONS_KEY = "devices"


def credential_id(device: str, password: str) -> str:
    """``<device>:<fingerprint>``: one credential of a device. The fingerprint (16 hex
    digits of SHA-256) names the password without revealing it."""
    digest = hashlib.sha256(f"{device}\0{password}".encode()).hexdigest()[:16]
    return f"{device}:{digest}"


class Revocations(BaseModel):
    """Revoked device credentials; ``serial`` grows with each revocation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    serial: int = 0
    credentials: tuple[str, ...] = ()

    def adding(self, credential: str) -> Revocations:
        """This list with one more revoked credential (and the next serial)."""
        kept = tuple(sorted({*self.credentials, credential}))
        return Revocations(serial=self.serial + 1, credentials=kept)

    def revokes(self, device: str, password: str) -> bool:
        return credential_id(device, password) in self.credentials

    def supersedes(self, other: Revocations | None) -> bool:
        """Whether this list replaces ``other`` (the one held): a higher serial."""
        return other is None or self.serial > other.serial


def sign(revocations: Revocations, signer: Signer) -> bytes:
    """The list as a signed envelope (what the bucket and the file hold)."""
    return signer.envelope(revocations.model_dump_json().encode())


def open_signed(value: bytes, verifier: Verifier) -> Revocations:
    """The list a signed envelope holds; :class:`~spanflow.security.signing.Unsigned`
    when it is not the coordinators' or not a revocation list."""
    data = verifier.open(value)
    try:
        return Revocations.model_validate_json(data)
    except ValidationError as exc:
        raise Unsigned(f"signed, but not a revocation list: {exc.error_count()} errors") from None


def read_file(value: bytes, verifier: Verifier | None) -> Revocations:
    """The list a secrets directory holds: checked when the directory has
    ``control.pub``; SecurityError when it cannot be read (a damaged file must not
    silently re-admit every revoked device)."""
    try:
        if verifier is not None:
            return open_signed(value, verifier)
        return Revocations.model_validate_json(unwrap(value)[0])
    except (Unsigned, ValidationError, ValueError) as exc:
        raise SecurityError(f"revocation list {REVOCATIONS_FILE} unreadable: {exc}") from None
