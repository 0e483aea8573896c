"""Ingest tokens scoped to a device group: publish-only, on some subjects, at one site.

A site's ingest token (:func:`spanflow.security.secrets.ingest_token`) lets its holder
publish readings on any subject of that site. A group token narrows it to the subjects
one pattern covers (``plant.line-1.>``): ``ingestg.<pattern, base64url>.<HMAC of the
pattern under the site's token>``. The site's server checks it with the site token its
bundle already holds — no list to keep — and a group token's holder can derive neither
the site's token nor another group's.

Pure: strings in, strings out.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Callable

from spanflow.errors import SecurityError
from spanflow.security.credentials import mac_of
from spanflow.security.limits import token_matches

GROUP_PREFIX = "ingestg."
SITE_PRINCIPAL = "ingest"
GROUP_PRINCIPAL = "ingest:"
"""A group token's principal: ``ingest:<pattern>``."""


def _check_pattern(pattern: str) -> str:
    tokens = pattern.split(".")
    bad = [t for t in tokens if not t or (t not in ("*", ">") and not _plain(t))]
    if bad or ">" in tokens[:-1]:
        raise SecurityError(
            f"{pattern!r} is not a subject pattern (tokens of letters, digits, -_, "
            "'*' for one token, a final '>' for the rest)"
        )
    return pattern


def _plain(token: str) -> bool:
    return all(ch.isalnum() or ch in "-_" for ch in token)


def group_token(site_token: str, pattern: str) -> str:
    """The token for a device group publishing on ``pattern`` at the site whose ingest
    token is ``site_token``.

    >>> group_token("ingest.s1.k", "plant.line-1.>").startswith("ingestg.")
    True
    """
    encoded = base64.urlsafe_b64encode(_check_pattern(pattern).encode()).decode().rstrip("=")
    return f"{GROUP_PREFIX}{encoded}.{mac_of(site_token, 'group:' + pattern)}"


def pattern_of(site_token: str, given: str) -> str | None:
    """The pattern a group token covers, or None when it is not one of this site's.

    >>> t = group_token("ingest.s1.k", "plant.*.temp")
    >>> pattern_of("ingest.s1.k", t), pattern_of("ingest.s2.k", t)
    ('plant.*.temp', None)
    """
    if not given.startswith(GROUP_PREFIX):
        return None
    encoded, _, mac = given[len(GROUP_PREFIX) :].partition(".")
    try:
        pattern = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not hmac.compare_digest(mac, mac_of(site_token, "group:" + pattern)):
        return None
    return pattern


def ingest_authenticator(site_token: str | None) -> Callable[[str], str | None]:
    """Who holds a token at a site's ingest: the site's token (any readings subject), a
    group token of this site (``ingest:<pattern>``), or nobody (None). No site token:
    an open door."""

    def authenticate(given: str) -> str | None:
        if site_token is None or token_matches(given, site_token):
            return SITE_PRINCIPAL
        pattern = pattern_of(site_token, given)
        return None if pattern is None else GROUP_PRINCIPAL + pattern

    return authenticate


def group_pattern(principal: str | None) -> str | None:
    """The subjects a principal may publish on (None: any readings subject).

    >>> group_pattern("ingest:plant.line-1.>"), group_pattern("ingest")
    ('plant.line-1.>', None)
    """
    if principal is None or not principal.startswith(GROUP_PRINCIPAL):
        return None
    return principal[len(GROUP_PRINCIPAL) :]
