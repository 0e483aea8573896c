"""The locked parts of a nats-server configuration: TLS on every listener, a user per
role with permissions on subjects, authenticated leaf links and cluster routes, and two
NATS accounts.

Why two accounts: NATS checks what a client may publish, but not the reply subject it
names, and JetStream answers with the server's own rights: a device publishing a
reading with reply-to ``spanflow.wal.x`` had its publish ack stored in the control log,
and a stored message fetched by DIRECT.GET, a stream info request, a push consumer can
all be aimed the same way. No permission stops the server from publishing on a
subject of the account the request came from. So the control plane's state — the
control log, its snapshots, the leader lease — lives in an account of its own
(:data:`CONTROL_ACCOUNT`) that only the ``control`` user (coordinators) enters and that
imports and exports nothing: whatever an application identity makes the server publish
stays in :data:`APP_ACCOUNT`, where every other user, the leaf links and MQTT live.

Pure text: :class:`~spanflow.nats.server.EmbeddedNats` splices these blocks into the
configuration file it writes (owner-only, since it holds the role passwords).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from spanflow.protocol.names import (
    ACTIVITY_PREFIX,
    CONTROL_STREAMS,
    CONTROL_SUBJECTS,
    HEARTBEAT_PREFIX,
    LEADER_BUCKET,
    PROJECTION_BUCKETS,
)
from spanflow.security.credentials import NODE_INBOXES, node_user
from spanflow.security.revocations import REVOCATIONS_BUCKET
from spanflow.security.secrets import (
    CONTROL_ROLE,
    COORDINATOR_INBOX,
    DEVICE_INBOXES,
    LINK_ROLES,
    READER_INBOX,
    SITE_INBOX,
    Credentials,
    Device,
    Secrets,
    cert_user,
    inbox_prefix,
)

APP_ACCOUNT = "SPANFLOW"
"""Devices, agents, readers, the coordinators' data-plane connection, leaf links, MQTT."""
CONTROL_ACCOUNT = "SPANFLOW_CONTROL"
"""The control log, its snapshots and the leader lease: the ``control`` user only."""

STREAM_ADMIN = ("DELETE", "PURGE", "UPDATE", "MSG.DELETE", "CREATE")
AGENTS_NEVER = ("DELETE", "MSG.DELETE")
"""Stream administration no agent does on any stream (it creates and updates the
streams its fragments use, and purges its checkpoint and model stores' old files)."""
SYSTEM_SUBJECTS = ("$SYS.>",)
READER_PUBLISH = (
    "$JS.API.INFO",
    "$JS.API.STREAM.INFO.>",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.MSG.GET.>",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.CREATE.*",
    "$JS.API.CONSUMER.INFO.>",
    "$JS.API.CONSUMER.NAMES.>",
    "$JS.API.CONSUMER.LIST.>",
    "$JS.API.CONSUMER.MSG.NEXT.>",
    "$JS.ACK.>",
    "$JS.FC.>",
)
"""What a read-only client (dashboards, `spanflow tail`) needs: stream info and
consumers of its own — unnamed ones (``CONSUMER.CREATE.<stream>``), so it can neither
delete nor redefine another client's consumer — nothing that writes a stream."""
OTHERS_INBOXES = (
    "_INBOX.>",
    f"{DEVICE_INBOXES}.>",
    f"{COORDINATOR_INBOX}.>",
    f"{SITE_INBOX}.>",
    f"{NODE_INBOXES}.>",
)
"""Replies to other clients: a reader reads its own (``_INBOX_READER``) only."""
NOT_AGENTS_INBOXES = (
    f"{COORDINATOR_INBOX}.>",
    f"{READER_INBOX}.>",
    f"{DEVICE_INBOXES}.>",
    f"{SITE_INBOX}.>",
)
"""Replies to coordinators, readers, devices and site servers: an agent may neither
read nor answer them. The shared ``agent`` user (full directories, bundles made before
nodes had users of their own) replies on ``_INBOX``, and is denied every node's own;
a node's user is denied ``_INBOX`` and every other node's (:func:`node_permissions`)."""
REVOCATIONS_STREAM = f"KV_{REVOCATIONS_BUCKET}"
SITE_WATCH_PUBLISH = (
    f"$JS.*.API.STREAM.INFO.{REVOCATIONS_STREAM}",
    f"$JS.*.API.DIRECT.GET.{REVOCATIONS_STREAM}.>",
    f"$JS.*.API.STREAM.MSG.GET.{REVOCATIONS_STREAM}",
)
"""What a site server's own client asks the hub (its JetStream domain): the revocation
list, read only."""


def _q(value: str) -> str:
    return json.dumps(value)


def tls_block(
    secrets: Secrets, *, verify: bool = True, map_users: bool = False, indent: str = "  "
) -> str:
    """``tls { ... }``: the server certificate; with ``verify`` a client must present a
    certificate from the deployment's CA; with ``map_users`` (the client port) that
    certificate names the user the client logs in as (``verify_and_map``): a device's
    certificate cannot log in as an agent, whatever password its client sends."""
    check = "verify_and_map: true" if map_users else f"verify: {'true' if verify else 'false'}"
    lines = [
        f"cert_file: {_q(str(secrets.server_cert))}",
        f"key_file: {_q(str(secrets.server_key))}",
        f"ca_file: {_q(str(secrets.ca_cert))}",
        check,
        "timeout: 5",
    ]
    inner = indent + "  "
    return "tls {\n" + "".join(f"{inner}{line}\n" for line in lines) + indent + "}"


def _agent_deny() -> list[str]:
    deny = [*CONTROL_SUBJECTS, *SYSTEM_SUBJECTS, f"$KV.{LEADER_BUCKET}.>"]
    deny.append(f"$KV.{REVOCATIONS_BUCKET}.>")  # signed anyway: no wipe, no noise
    deny += [f"$KV.{bucket}.>" for bucket in PROJECTION_BUCKETS]  # puts and deletes alike
    for stream in (*CONTROL_STREAMS, REVOCATIONS_STREAM):
        for action in STREAM_ADMIN:
            deny.append(f"$JS.API.STREAM.{action}.{stream}")
            deny.append(f"$JS.*.API.STREAM.{action}.{stream}")
    for action in AGENTS_NEVER:  # any stream: devices' readings, other pipelines' output
        deny += [f"$JS.API.STREAM.{action}.>", f"$JS.*.API.STREAM.{action}.>"]
    return deny


def role_permissions(role: str) -> dict[str, Any] | None:
    """Subject permissions of a role's NATS user (None: everything in its account)."""
    if role in ("coordinator", CONTROL_ROLE):
        return None
    if role == "agent":
        inboxes = [*NOT_AGENTS_INBOXES, f"{NODE_INBOXES}.>"]
        return {
            "publish": {"deny": [*_agent_deny(), *inboxes]},
            "subscribe": {"deny": [*inboxes, *SYSTEM_SUBJECTS]},
        }
    if role == "reader":
        return {
            "publish": {"allow": list(READER_PUBLISH)},
            "subscribe": {"allow": [">"], "deny": [*OTHERS_INBOXES, *SYSTEM_SUBJECTS]},
        }
    if role == "device":
        return {
            "publish": {
                "allow": [">"],
                "deny": [
                    *("spanflow.>", "$JS.>", "$KV.>", "$O.>"),
                    *OTHERS_INBOXES,  # no forged answers to another client's request
                    *SYSTEM_SUBJECTS,
                ],
            },
            "subscribe": {"allow": [f"{inbox_prefix(role, role)}.>"]},
        }
    raise ValueError(f"no permissions for role {role!r}")


LEAF_STREAM_ADMIN = (*STREAM_ADMIN, "SNAPSHOT", "RESTORE", "PEER", "LEADER")
LEAF_DENY = (
    *CONTROL_SUBJECTS,
    *SYSTEM_SUBJECTS,
    "$JS.API.>",  # a leaf without JetStream of its own would reach the hub's API as is
    *(f"$JS.*.API.STREAM.{action}.>" for action in LEAF_STREAM_ADMIN),
    "$JS.*.API.CONSUMER.LEADER.>",
    *(f"$JS.*.API.{area}.>" for area in ("ACCOUNT", "META", "SERVER")),
    "$KV.>",  # no put, delete or purge of any hub bucket: assignments, fences, registries
    "$O.>",
)
"""What a site's server may not send across its leaf link into the hub: the hub's
JetStream administration in any domain (a site creates, purges and deletes streams in
its own, on its own server), the hub's own-domain API, and any write into the hub's
buckets. Requests that read (stream info, consumers, direct gets), reports, replies
and data pass. Enforced by the hub whatever server the site runs."""

CLIENT_PORT = ["STANDARD"]
"""Users named by a certificate log in on the client port only (never over MQTT)."""
MQTT_ONLY = ["MQTT"]
"""A device's password login on the server's MQTT listener: nowhere else."""


LEAF_LINK = ["LEAFNODE"]
"""The leaf user logs in on the leaf listener only (never as a client)."""


def leaf_user(user: str, password: str) -> dict[str, Any]:
    """A user a site's leaf link logs in as at the hub, with :data:`LEAF_DENY`: the hub
    applies a leaf connection's user permissions to everything the link carries into it
    (what it may publish). No subscribe permission: the hub would also stop telling
    the site of its own clients' interest, and replies from the site's JetStream
    domain to a hub node would have nowhere to go."""
    return {
        "user": user,
        "password": password,
        "allowed_connection_types": LEAF_LINK,
        "permissions": {"publish": {"deny": list(LEAF_DENY)}},
    }


def certificate_user(name: str, password: str) -> dict[str, Any]:
    """A client-port user: the certificate's subject names it, its password is checked
    as well (both must match)."""
    return {"user": cert_user(name), "password": password, "allowed_connection_types": CLIENT_PORT}


def site_watch_user(password: str) -> dict[str, Any]:
    """An edge site server's own client (the leaf certificate, the site's leaf
    password): it reads the hub's revocation list and nothing else."""
    permissions = {
        "publish": {"allow": list(SITE_WATCH_PUBLISH)},
        "subscribe": {"allow": [f"{SITE_INBOX}.>"]},
    }
    return {**certificate_user("leaf", password), "permissions": permissions}


def node_permissions(node: str, nodes: list[str]) -> dict[str, Any]:
    """A node's own user: what an agent may do, less the shared ``_INBOX`` and every
    other node's inbox (read or answered), heartbeats and activity reports (which the
    coordinators would refuse anyway: they are sealed per node). ``nodes``: every node
    the server knows, so each is denied the others' by name (NATS denies win over
    allows, so "all but mine" is written as "each of theirs")."""
    others = [n for n in nodes if n != node]
    inboxes = [*NOT_AGENTS_INBOXES, "_INBOX.>", *(f"{NODE_INBOXES}.{n}.>" for n in others)]
    reports = [f"{HEARTBEAT_PREFIX}.{n}" for n in others]
    reports += [f"{ACTIVITY_PREFIX}.{n}.>" for n in others]
    return {
        "publish": {"deny": [*_agent_deny(), *inboxes, *reports]},
        "subscribe": {"deny": [*inboxes, *SYSTEM_SUBJECTS]},
    }


def node_users(creds: Credentials) -> list[dict[str, Any]]:
    """A user per node these secrets can admit (its password known or derivable), each
    named by its certificate (``agent.<node>``)."""
    known = sorted(creds.nodes)
    out = []
    for node in known:
        password = creds.node_password_for(node)
        if password is not None:
            user = certificate_user(node_user(node), password)
            out.append({**user, "permissions": node_permissions(node, known)})
    return out


def device_permissions(name: str, device: Device) -> dict[str, Any]:
    return {
        "publish": {"allow": list(device.publish)},
        "subscribe": {"allow": [f"{inbox_prefix(name, 'device')}.>", *device.subscribe]},
    }


def users(creds: Credentials, leaf_sites: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every user of the application account: one per client role, one per node and one
    per device, each named by its certificate; and per device a password user for the server's
    MQTT listener (MQTT clients present no certificate); and the leaf links' users, on
    the leaf listener only: one per site in ``leaf_sites`` (none given: the shared
    ``leaf`` login). Routes authenticate in their own block; the control user is
    in the control account alone."""
    out = [leaf_user(user, pw) for user, pw in creds.leaf_logins(leaf_sites).items()]
    if creds.site_leaf and not leaf_sites:  # an edge site's server: its revocation watch
        out.append(site_watch_user(creds.site_leaf))
    for role, password in creds.passwords.items():
        if role in LINK_ROLES or role == CONTROL_ROLE:
            continue
        user = certificate_user(role, password)
        permissions = role_permissions(role)
        if permissions is not None:
            user["permissions"] = permissions
        out.append(user)
    out += node_users(creds)
    for name, device in sorted(creds.devices.items()):
        permissions = device_permissions(name, device)
        out.append({**certificate_user(name, device.password), "permissions": permissions})
        mqtt = {"user": name, "password": device.password, "allowed_connection_types": MQTT_ONLY}
        out.append({**mqtt, "permissions": permissions})
    return out


def accounts_block(creds: Credentials, leaf_sites: tuple[str, ...] = ()) -> str:
    """``accounts { ... }``: the application account and the control account, each
    with JetStream, neither importing from nor exporting to the other. A site server's
    bundle has no control password: its server has no control account (the control
    plane lives on the hub's servers)."""
    app = {"jetstream": "enabled", "users": users(creds, leaf_sites)}
    accounts: dict[str, Any] = {APP_ACCOUNT: app}
    password = creds.passwords.get(CONTROL_ROLE)
    if password is not None:
        control = [certificate_user(CONTROL_ROLE, password)]
        accounts[CONTROL_ACCOUNT] = {"jetstream": "enabled", "users": control}
    return "accounts " + json.dumps(accounts, indent=2)


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
