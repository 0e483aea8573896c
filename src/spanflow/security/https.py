"""HTTPS for the REST API, the dashboard and HTTP ingest, with the deployment's CA.

A door that listens beyond loopback sends its bearer token over the network: locked
(a secrets directory), it serves HTTPS with the deployment's server certificate, and
without one it refuses to start (:func:`require_tls`). On loopback, plain HTTP stays
the default (nothing crosses a network), ``--tls`` turns HTTPS on there too.

Clients (the CLI, agents, the typed client) verify a coordinator's certificate against
the deployment's CA when their host has secrets (:func:`client_context`), and against
the system's CAs otherwise (a coordinator behind a public certificate).
"""

from __future__ import annotations

import ssl

from spanflow.errors import SecurityError
from spanflow.security.environment import secrets_from_env
from spanflow.security.policy import is_loopback
from spanflow.security.secrets import Secrets


def wants_tls(host: str, secrets: Secrets | None, forced: bool | None = None) -> bool:
    """Whether a door on ``host`` serves HTTPS: as asked (``forced``), else when it is
    locked and listens beyond loopback.

    >>> wants_tls("127.0.0.1", None), wants_tls("0.0.0.0", None)
    (False, False)
    """
    if forced is not None:
        return forced
    return secrets is not None and not is_loopback(host)


def require_tls(door: str, host: str, tls: bool) -> None:
    """Beyond loopback a token must not cross the network in clear."""
    if not tls and not is_loopback(host):
        raise SecurityError(
            f"the {door} on {host} would take its bearer token in clear over the network: "
            "run `spanflow secrets init` (HTTPS with the deployment's CA) or listen on "
            "127.0.0.1"
        )


def server_files(secrets: Secrets | None) -> tuple[str, str]:
    """(certificate, key) a door serves HTTPS with."""
    if secrets is None:
        raise SecurityError(
            "HTTPS needs the deployment's certificates: run `spanflow secrets init`"
        )
    return str(secrets.server_cert), str(secrets.server_key)


def client_context(secrets: Secrets | None = None) -> ssl.SSLContext | bool:
    """How an HTTPS client checks the server: the deployment's CA when this host has
    secrets, else the system's CAs (``True``, httpx's default)."""
    found = secrets or secrets_from_env()
    if found is None or not found.ca_cert.exists():
        return True
    return ssl.create_default_context(cafile=str(found.ca_cert))


def scheme(tls: bool) -> str:
    return "https" if tls else "http"
