"""The locked parts of a nats-server configuration: TLS on every listener, a user per
role with permissions on subjects, authenticated leaf links and cluster routes.

Pure text: :class:`~spanflow.nats.server.EmbeddedNats` splices these blocks into the
configuration file it writes (owner-only, since it holds the role passwords).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from spanflow.protocol.names import CONTROL_STREAMS, CONTROL_SUBJECTS
from spanflow.security.secrets import Credentials, Secrets

STREAM_ADMIN = ("DELETE", "PURGE", "UPDATE", "MSG.DELETE", "CREATE")
SYSTEM_SUBJECTS = ("$SYS.>",)
READER_PUBLISH = (
    "$JS.API.INFO",
    "$JS.API.STREAM.INFO.>",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.MSG.GET.>",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.>",
    "$JS.ACK.>",
    "$JS.FC.>",
)
"""What a read-only client (dashboards, `spanflow tail`) needs: stream info and
consumers, nothing that writes a stream."""


def _q(value: str) -> str:
    return json.dumps(value)


def tls_block(secrets: Secrets, *, verify: bool = True, indent: str = "  ") -> str:
    """``tls { ... }``: the server certificate; with ``verify`` a client must present a
    certificate from the deployment's CA."""
    lines = [
        f"cert_file: {_q(str(secrets.server_cert))}",
        f"key_file: {_q(str(secrets.server_key))}",
        f"ca_file: {_q(str(secrets.ca_cert))}",
        f"verify: {'true' if verify else 'false'}",
        "timeout: 5",
    ]
    inner = indent + "  "
    return "tls {\n" + "".join(f"{inner}{line}\n" for line in lines) + indent + "}"


def _agent_deny() -> list[str]:
    deny = list(CONTROL_SUBJECTS) + list(SYSTEM_SUBJECTS) + ["$KV.spanflow_leader.>"]
    for stream in CONTROL_STREAMS:
        for action in STREAM_ADMIN:
            deny.append(f"$JS.API.STREAM.{action}.{stream}")
            deny.append(f"$JS.*.API.STREAM.{action}.{stream}")
    return deny


def role_permissions(role: str) -> dict[str, Any] | None:
    """Subject permissions of a role's NATS user (None: everything)."""
    if role in ("coordinator", "leaf"):
        return None
    if role == "agent":
        return {"publish": {"deny": _agent_deny()}}
    if role == "reader":
        return {
            "publish": {"allow": list(READER_PUBLISH)},
            "subscribe": {"allow": [">"], "deny": list(SYSTEM_SUBJECTS)},
        }
    if role == "device":
        return {
            "publish": {
                "allow": [">"],
                "deny": ["spanflow.>", "$JS.>", "$KV.>", "$O.>", *SYSTEM_SUBJECTS],
            },
            "subscribe": {"allow": ["_INBOX.>"]},
        }
    raise ValueError(f"no permissions for role {role!r}")


def users(creds: Credentials) -> list[dict[str, Any]]:
    """Every NATS user: one per client role, one per device."""
    out: list[dict[str, Any]] = []
    for role, password in creds.passwords.items():
        if role == "route":
            continue  # routes authenticate in the cluster block
        user: dict[str, Any] = {"user": role, "password": password}
        permissions = role_permissions(role)
        if permissions is not None:
            user["permissions"] = permissions
        out.append(user)
    for name, device in sorted(creds.devices.items()):
        out.append(
            {
                "user": name,
                "password": device.password,
                "permissions": {
                    "publish": {"allow": list(device.publish)},
                    "subscribe": {"allow": ["_INBOX.>"]},
                },
            }
        )
    return out


def authorization_block(creds: Credentials) -> str:
    return "authorization {\n  users: " + json.dumps(users(creds), indent=2) + "\n}"


def with_userinfo(url: str, user: str, password: str) -> str:
    """``nats-leaf://host:port`` → ``nats-leaf://user:password@host:port``.

    >>> with_userinfo("nats-leaf://hub:7422", "leaf", "p/w")
    'nats-leaf://leaf:p%2Fw@hub:7422'
    """
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


def redact_url(url: str) -> str:
    """A URL fit for logs: any password replaced.

    >>> redact_url("nats-leaf://leaf:secret@hub:7422,nats://h:4222")
    'nats-leaf://leaf:***@hub:7422,nats://h:4222'
    """
    out = []
    for one in url.split(","):
        parts = urlsplit(one)
        if parts.password:
            user, _, host = parts.netloc.rpartition("@")
            name = user.partition(":")[0]
            one = urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))
        out.append(one)
    return ",".join(out)
