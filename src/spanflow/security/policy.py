"""Rules every door follows, in one place."""

from __future__ import annotations

import ipaddress

from spanflow.errors import SecurityError


def is_loopback(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only.

    >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: assume it resolves beyond this machine


def require_token(door: str, host: str, token: str | None, hint: str) -> None:
    """A listener beyond loopback takes requests from the network: it must have a token.

    >>> require_token("REST API", "127.0.0.1", None, "--token")  # loopback: fine
    """
    if not token and not is_loopback(host):
        raise SecurityError(
            f"the {door} on {host} would answer anyone on the network: "
            f"give a token ({hint}) or listen on 127.0.0.1"
        )
