"""Signed assignments: the coordinators sign what tells a node to run code.

An assignment names a pipeline's steps — Python functions and classes imported and
called where it runs — so it is code-equivalent input, and the agents read it from a
KV bucket of the application account, where an identity that can make the server
publish (a reply subject, a DIRECT.GET aimed at ``$KV.spanflow_assignments.<node>.…``)
could store a value of its choosing. Coordinators hold an Ed25519 key
(``control.key``, never in an agent's or site's bundle) and sign every assignment
value they project; agents hold the public key (``control.pub``) and run nothing
whose signature does not verify.

The stored value is an envelope, ``{"signed": "<the assignment's JSON>", "sig":
"<base64 Ed25519 signature of those bytes>"}``: the signed bytes travel as they were
signed, so no canonical form is needed. Ed25519 signatures are deterministic: the
same state projects to the same bytes, which the projection repair compares.
"""

from __future__ import annotations

import base64

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from spanflow.errors import SecurityError


class Unsigned(SecurityError):
    """A value that should carry the coordinators' signature does not, or it is wrong."""

    code = "unsigned"


def new_key_pair() -> tuple[bytes, bytes]:
    """(private PEM, public PEM) of a new Ed25519 key."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


class Signer:
    """Signs with the coordinators' private key."""

    def __init__(self, private_pem: bytes) -> None:
        key = serialization.load_pem_private_key(private_pem, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise SecurityError("control.key is not an Ed25519 private key")
        self._key = key

    def envelope(self, data: bytes) -> bytes:
        sig = base64.b64encode(self._key.sign(data)).decode()
        return orjson.dumps({"signed": data.decode(), "sig": sig})


class Verifier:
    """Checks the coordinators' signature with their public key."""

    def __init__(self, public_pem: bytes) -> None:
        key = serialization.load_pem_public_key(public_pem)
        if not isinstance(key, Ed25519PublicKey):
            raise SecurityError("control.pub is not an Ed25519 public key")
        self._key = key

    def open(self, value: bytes) -> bytes:
        """The signed bytes of an envelope; :class:`Unsigned` for anything else."""
        data, sig = unwrap(value)
        if sig is None:
            raise Unsigned("not signed by the coordinators")
        try:
            self._key.verify(base64.b64decode(sig), data)
        except (InvalidSignature, ValueError):
            raise Unsigned("its signature does not verify") from None
        return data


def unwrap(value: bytes) -> tuple[bytes, str | None]:
    """(the signed bytes, the signature) of an envelope; (value, None) for a plain value
    (open mode writes plain values)."""
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value, None
    if isinstance(raw, dict) and set(raw) == {"signed", "sig"} and isinstance(raw["signed"], str):
        return raw["signed"].encode(), str(raw["sig"])
    return value, None


def read_signed(value: bytes, verifier: Verifier | None) -> bytes:
    """What a node may act on: with a verifier (locked), only what the coordinators
    signed; without (open mode), the value itself or an envelope's content."""
    if verifier is not None:
        return verifier.open(value)
    return unwrap(value)[0]
