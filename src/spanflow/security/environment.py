"""This process's secrets and NATS identity, from the environment
(``SPANFLOW_SECRETS`` and ``SPANFLOW_ROLE``, which the commands set and Spark's workers
inherit): open mode when unset."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from spanflow.errors import SecurityError
from spanflow.security.secrets import (
    CONTROL_ROLE,
    ROLE_ENV,
    SECRETS_ENV,
    NatsIdentity,
    Secrets,
)
from spanflow.security.signing import Signer, Verifier


def secrets_from_env() -> Secrets | None:
    root = os.environ.get(SECRETS_ENV)
    return Secrets(root) if root else None


def identity_from_env() -> NatsIdentity | None:
    """This process's NATS identity (``SPANFLOW_SECRETS`` + ``SPANFLOW_ROLE``), or None
    in open mode."""
    found = secrets_from_env()
    if found is None:
        return None
    return found.identity(os.environ.get(ROLE_ENV, "agent"))


def control_identity_from_env() -> NatsIdentity | None:
    """The control account's identity for this coordinator, or None in open mode (one
    account for everything: the control plane connects as the data plane does)."""
    found = secrets_from_env()
    return None if found is None else found.identity(CONTROL_ROLE)


def adopt(secrets: Secrets, role: str) -> None:
    """Make this process (and every child it starts, Spark's workers included) use
    ``secrets`` as ``role``."""
    os.environ[SECRETS_ENV] = str(secrets.root.resolve())
    os.environ[ROLE_ENV] = role


def assignment_signer() -> Signer | None:
    """This coordinator's signer for assignments (locked), or None (open mode)."""
    found = secrets_from_env()
    if found is None:
        return None
    signer = found.signer()
    if signer is None:
        raise SecurityError(
            f"{found.control_key} is missing: coordinators sign assignments with it "
            "(run `spanflow secrets init` on the issuing host; export --role coordinator)"
        )
    return signer


def assignment_verifier() -> Verifier | None:
    """This agent's check of assignments' signatures (locked), or None (open mode)."""
    found = secrets_from_env()
    if found is None:
        return None
    verifier = found.verifier()
    if verifier is None:
        raise SecurityError(
            f"{found.control_pub} is missing: agents check assignments with it "
            "(export the node's bundle again)"
        )
    return verifier


def own_node_token(node: str) -> str | None:
    """This agent's node token (locked), or None (open mode)."""
    found = secrets_from_env()
    return None if found is None else found.credentials().node_token_for(node)


def revoked_nodes_from_env() -> Callable[[str], bool]:
    """Whether a node was revoked, by this coordinator's secrets directory's revocation
    list as it is now (re-read when the file changes: no restart), or never (open mode)."""
    found = secrets_from_env()
    if found is None:
        return lambda _node: False
    seen: dict[str, Any] = {"stamp": None, "answers": {}}

    def revoked(node: str) -> bool:
        try:
            stamp = found.revocations_file.stat().st_mtime_ns
        except OSError:
            return False
        if stamp != seen["stamp"]:
            seen.update(stamp=stamp, answers={})
        answers: dict[str, bool] = seen["answers"]
        if node not in answers:
            answers[node] = found.node_revoked(node)
        return answers[node]

    return revoked
