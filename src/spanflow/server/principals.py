"""Who holds a REST token, and what each may do.

The operator's token (``credentials.json``'s ``rest_token``, or ``--token``) may do
everything. A node's token (:func:`spanflow.security.secrets.node_token`, in its
agent's bundle) may register that node, ask to shed one of its fragments and report
its executor allocation (a node scaling on a Spark cluster), and
nothing else: an edge host taken holds no token that submits pipelines, drains other
nodes or reads the cluster.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request

from spanflow.security.limits import token_matches
from spanflow.security.secrets import node_of_token

OPERATOR = "operator"
NODE_PREFIX = "node:"


def node_of(request: Request) -> str | None:
    """The node whose token authenticated this request (None: the operator's token)."""
    principal = getattr(request.state, "principal", None) or ""
    return principal.removeprefix(NODE_PREFIX) if principal.startswith(NODE_PREFIX) else None


def authenticator(
    token: str | None, node_key: str | None, revoked: Callable[[str], bool] = lambda _: False
) -> Callable[[str], str | None]:
    """The operator's token may do everything; a node's token (its agent's bundle) is
    that node's, unless the node was revoked (``revoked``)."""

    def authenticate(given: str) -> str | None:
        if token is None:
            return OPERATOR
        if token_matches(given, token):
            return OPERATOR
        node = node_of_token(node_key, given) if node_key else None
        return None if node is None or revoked(node) else NODE_PREFIX + node

    return authenticate


def permits(principal: str, method: str, path: str) -> bool:
    """A node may register, ask to shed a fragment and report its executor allocation,
    as itself, and nothing else."""
    if principal == OPERATOR:
        return True
    node = principal.removeprefix(NODE_PREFIX)
    return method == "POST" and path in (
        "/api/v1/nodes",
        f"/api/v1/nodes/{node}/shed",
        f"/api/v1/nodes/{node}/scaled",
    )
