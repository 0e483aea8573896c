"""Symmetric keys for gossip, as HashiCorp memberlist keeps them: a keyring whose first
key (the primary) seals every outgoing packet, while every key in the ring may open an
incoming one — so keys rotate without a flag day (install the new key everywhere, make
it primary everywhere, then remove the old one).

A sealed packet is ``version (1 byte) | nonce (12 bytes) | AES-GCM(sealed-at + data,
tag)`` with a label bound in as associated data, so a packet sealed for one cluster does
not open in another even under the same key. ``sealed-at`` (milliseconds since the
epoch, 8 bytes, inside the encryption) and the nonce let a receiver refuse a packet
recorded and sent again (:mod:`spanflow.security.replay`). A packet that no key opens —
forged, from another cluster, corrupted — raises :class:`SealError`; the caller drops
and counts it.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from spanflow.errors import SecurityError

VERSION = 2
NONCE_BYTES = 12
STAMP_BYTES = 8
OVERHEAD = 1 + NONCE_BYTES + STAMP_BYTES + 16
"""Bytes a sealed packet adds to the plain one."""
KEY_SIZES = (16, 24, 32)
"""AES-128, -192 or -256, as memberlist accepts."""


class SealError(ValueError):
    """A packet that no key of the ring opens."""


@dataclass(frozen=True)
class Opened:
    """An opened packet: its data, when it was sealed (wall-clock seconds) and its
    nonce (unique per packet)."""

    data: bytes
    sealed_at: float
    nonce: bytes


def new_key(size: int = 32) -> bytes:
    if size not in KEY_SIZES:
        raise SecurityError(f"a gossip key is 16, 24 or 32 bytes, not {size}")
    return os.urandom(size)


def encode_key(key: bytes) -> str:
    return base64.b64encode(key).decode()


def decode_key(text: str) -> bytes:
    """A base64 key; a clear error for anything that is not 16, 24 or 32 bytes."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SecurityError(f"a gossip key is base64 text: {exc}") from exc
    if len(key) not in KEY_SIZES:
        raise SecurityError(f"a gossip key is 16, 24 or 32 bytes, not {len(key)}")
    return key


@dataclass(frozen=True)
class Keyring:
    """Keys, primary first.

    >>> ring = Keyring((b"k" * 32,))
    >>> ring.open(ring.seal(b"ping"))
    b'ping'
    """

    keys: tuple[bytes, ...]
    label: bytes = b"spanflow-gossip"

    def __post_init__(self) -> None:
        if not self.keys:
            raise SecurityError("a gossip keyring holds at least one key")
        for key in self.keys:
            if len(key) not in KEY_SIZES:
                raise SecurityError(f"a gossip key is 16, 24 or 32 bytes, not {len(key)}")

    @property
    def primary(self) -> bytes:
        return self.keys[0]

    def seal(self, data: bytes, at: float | None = None) -> bytes:
        """``data`` sealed under the primary key, stamped with ``at`` (default now)."""
        nonce = os.urandom(NONCE_BYTES)
        stamp = int((time.time() if at is None else at) * 1000).to_bytes(STAMP_BYTES, "big")
        sealed = AESGCM(self.primary).encrypt(nonce, stamp + data, self.label)
        return bytes([VERSION]) + nonce + sealed

    def open(self, packet: bytes) -> bytes:
        return self.open_stamped(packet).data

    def open_stamped(self, packet: bytes) -> Opened:
        if len(packet) < OVERHEAD or packet[0] != VERSION:
            raise SealError("not a sealed gossip packet (plain text, or another version)")
        nonce, sealed = packet[1 : 1 + NONCE_BYTES], packet[1 + NONCE_BYTES :]
        for key in self.keys:
            try:
                plain = AESGCM(key).decrypt(nonce, sealed, self.label)
            except InvalidTag:
                continue
            at = int.from_bytes(plain[:STAMP_BYTES], "big") / 1000
            return Opened(plain[STAMP_BYTES:], at, nonce)
        raise SealError("no key of the keyring opens it (wrong key, or forged)")

    # ------------------------------------------------------------- rotation

    def install(self, key: bytes) -> Keyring:
        """The ring with ``key`` added (not yet primary): others may start sealing with it."""
        return self if key in self.keys else Keyring((*self.keys, key), self.label)

    def use(self, key: bytes) -> Keyring:
        """The ring with ``key`` made primary (installed if it was not)."""
        rest = tuple(k for k in self.keys if k != key)
        return Keyring((key, *rest), self.label)

    def remove(self, key: bytes) -> Keyring:
        """The ring without ``key``; the primary cannot be removed."""
        if key == self.primary:
            raise SecurityError("the primary gossip key cannot be removed: use another first")
        return Keyring(tuple(k for k in self.keys if k != key), self.label)

    # ------------------------------------------------------------- files

    def dumps(self) -> str:
        return "".join(encode_key(k) + "\n" for k in self.keys)

    @classmethod
    def loads(cls, text: str, *, source: str = "keyring") -> Keyring:
        keys = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                try:
                    keys.append(decode_key(line))
                except SecurityError as exc:
                    raise SecurityError(f"{source}, line {number}: {exc}") from None
        return cls(tuple(keys))

    @classmethod
    def load(cls, path: Path) -> Keyring:
        try:
            text = path.read_text()
        except OSError as exc:
            raise SecurityError(f"gossip keyring {path}: {exc.strerror or exc}") from exc
        return cls.loads(text, source=str(path))
