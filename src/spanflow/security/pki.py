"""A small certificate authority: the CA, server and client certificates spanflow's
doors require (NATS, MQTT, the JVM real-time client).

Deliberately minimal: ECDSA P-256 keys, one self-signed CA per deployment, leaf
certificates signed by it with the names and addresses a client will dial. An operator
with a corporate PKI can drop their own PEM files in the same places instead
(docs/security.md).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from spanflow.errors import SecurityError

CA_DAYS = 3650
LEAF_DAYS = 825
"""Leaf certificates live a little over two years (the CA/Browser limit); rotate them
with ``spanflow secrets init --renew`` (docs/security.md)."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "spanflow"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def create_ca(common_name: str = "spanflow CA", days: int = CA_DAYS) -> Issued:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = _key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _alt_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue(
    ca: Issued,
    common_name: str,
    *,
    hosts: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
    days: int = LEAF_DAYS,
    not_before: dt.datetime | None = None,
) -> Issued:
    """A leaf certificate signed by ``ca``. A server certificate names every host and
    address a client will dial (``hosts``); a client certificate names its role."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise SecurityError("the CA key is not an EC key spanflow made")
    key = _key()
    start = not_before or (_now() - dt.timedelta(minutes=5))
    usages = [
        u
        for u, on in (
            (ExtendedKeyUsageOID.SERVER_AUTH, server),
            (ExtendedKeyUsageOID.CLIENT_AUTH, client),
        )
        if on
    ]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(_alt_names(hosts)), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


@dataclass(frozen=True)
class CertInfo:
    """What an operator may see of a certificate (never its key)."""

    subject: str
    not_after: dt.datetime
    fingerprint: str
    hosts: tuple[str, ...]

    def expired(self, now: dt.datetime | None = None) -> bool:
        return (now or _now()) >= self.not_after


def describe(cert_path: Path) -> CertInfo:
    """Subject, expiry, SHA-256 fingerprint and names of a PEM certificate."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read certificate {cert_path}: {exc}") from exc
    hosts: tuple[str, ...] = ()
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = tuple(str(v) for v in san.get_values_for_type(x509.DNSName)) + tuple(
            str(v) for v in san.get_values_for_type(x509.IPAddress)
        )
    except x509.ExtensionNotFound:
        pass
    return CertInfo(
        subject=cert.subject.rfc4514_string(),
        not_after=cert.not_valid_after_utc,
        fingerprint=cert.fingerprint(hashes.SHA256()).hex(":"),
        hosts=hosts,
    )
