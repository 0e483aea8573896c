"""What ``credentials.json`` holds, and the tokens and passwords derived from the
node-token key (pure: no files; spanflow.security.secrets reads and writes them).

Every derived secret is an HMAC of a name under the key only the coordinators (and the
issuing host) hold, so a host's bundle carries its own and nothing lets it compute
another's: a node's REST token, a site's ingest token, route and leaf passwords.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from spanflow.errors import SecurityError

DEVICE_INBOXES = "_INBOX_DEV"
READER_INBOX = "_INBOX_READER"
COORDINATOR_INBOX = "_INBOX_COORD"
SITE_INBOX = "_INBOX_SITE"
"""Replies to a site server's own client (its revocation watch)."""
NODE_INBOXES = "_INBOX_NODE"
"""Replies to a node's agent (and its Spark workers) with an identity of its own:
``_INBOX_NODE.<node>``."""
NODE_USER_PREFIX = "agent."
"""A node's own NATS user (and its certificate's common name): ``agent.<node>``."""
CERT_ORGANIZATION = "spanflow"
"""The organisation every client certificate spanflow issues names (spanflow.security.pki)."""


def cert_user(common_name: str) -> str:
    """The NATS user a client certificate logs in as: locked servers map a certificate
    to the user named by its subject (``verify_and_map``), so a device's certificate
    logs in as that device whatever name and password its client sends. An operator's
    own PKI issues certificates with the same subject: ``O=spanflow, CN=<role or device>``.

    >>> cert_user("press-7")
    'CN=press-7,O=spanflow'
    """
    return f"CN={common_name},O={CERT_ORGANIZATION}"


def node_user(node: str) -> str:
    """A node's own NATS user, the common name of its certificate.

    >>> node_user("edge-1")
    'agent.edge-1'
    """
    return f"{NODE_USER_PREFIX}{node}"


def inbox_prefix(user: str, role: str) -> str | None:
    """Where a client's replies come back (``nats.connect(inbox_prefix=...)``): devices,
    readers and coordinators get inboxes of their own, so NATS can let each read its
    replies and nobody else's (the coordinators' replies carry pipeline specs and
    assignments), and keep the others from answering in their place. None: the
    default ``_INBOX`` (agents).

    >>> inbox_prefix("press-7", "device"), inbox_prefix("reader", "reader")
    ('_INBOX_DEV.press-7', '_INBOX_READER')
    >>> inbox_prefix("coordinator", "coordinator")
    '_INBOX_COORD'
    >>> inbox_prefix("edge-1", "node")
    '_INBOX_NODE.edge-1'
    """
    if role == "node":
        return f"{NODE_INBOXES}.{user}"
    if role == "device":
        return f"{DEVICE_INBOXES}.{user}"
    if role == "reader":
        return READER_INBOX
    if role == "coordinator":
        return COORDINATOR_INBOX
    return None


@dataclass(frozen=True)
class Device:
    """A device's NATS/MQTT user: it may publish on ``publish`` subjects only, and
    subscribe to ``subscribe`` (commands sent to it) and its own inbox."""

    password: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()
    site: str | None = None
    """The site whose server admits it: only that site's bundle carries its login
    (None: every site's, as devices added before sites were named)."""


@dataclass(frozen=True)
class Credentials:
    """What ``credentials.json`` holds. A full directory (the issuing host, the
    coordinators) has every role's password, the operator's REST token and the key node
    tokens derive from; a host's bundle (:meth:`Secrets.export`) only what its role
    needs: no ``rest_token``, no ``agent_key``, its own node token or ingest token."""

    passwords: dict[str, str]
    rest_token: str | None
    devices: dict[str, Device] = field(default_factory=dict)
    agent_key: str | None = None
    """Coordinators only: derives each node's REST token (:func:`node_token`)."""
    node_tokens: dict[str, str] = field(default_factory=dict)
    """An agent bundle: its node's REST token (register and shed as that node only)."""
    ingest_token: str | None = None
    """A site bundle: the token its HTTP ingest takes."""
    site_route: str | None = None
    """A site bundle: the password its clustered servers' routes take (that site's
    alone, so an edge host's bundle cannot route into the hub or another site)."""
    site_leaf: str | None = None
    """A site bundle: its leaf link's password at the hub (as user ``leaf-<site>``:
    that site's alone, so a stolen site host cannot leaf in as another site)."""
    nodes: dict[str, str | None] = field(default_factory=dict)
    """Every node given an identity of its own (``export --role agent``), and its site
    (None: any): the full directory's record, and a site bundle's copy (names are no
    secret: each node's user is denied every other node's inbox)."""
    node_passwords: dict[str, str] = field(default_factory=dict)
    """A site bundle: the NATS passwords of the nodes its server admits."""
    node: str | None = None
    """An agent bundle: the node it is (its NATS user is ``agent.<node>``)."""

    def to_json(self) -> str:
        raw: dict[str, Any] = {
            "nats": self.passwords,
            "rest_token": self.rest_token,
            "devices": {
                name: {
                    "password": d.password,
                    "publish": list(d.publish),
                    "subscribe": list(d.subscribe),
                    **({"site": d.site} if d.site else {}),
                }
                for name, d in sorted(self.devices.items())
            },
        }
        if self.agent_key:
            raw["agent_key"] = self.agent_key
        if self.node_tokens:
            raw["node_tokens"] = self.node_tokens
        if self.ingest_token:
            raw["ingest_token"] = self.ingest_token
        if self.site_route:
            raw["site_route"] = self.site_route
        if self.site_leaf:
            raw["site_leaf"] = self.site_leaf
        if self.nodes:
            raw["nodes"] = dict(sorted(self.nodes.items()))
        if self.node_passwords:
            raw["node_passwords"] = dict(sorted(self.node_passwords.items()))
        if self.node:
            raw["node"] = self.node
        return json.dumps(raw, indent=2)

    @classmethod
    def from_json(cls, text: str, source: str) -> Credentials:
        try:
            raw = json.loads(text)
            devices = {
                str(name): Device(
                    str(d["password"]),
                    tuple(str(s) for s in d["publish"]),
                    tuple(str(s) for s in d.get("subscribe") or ()),
                    str(d["site"]) if d.get("site") else None,
                )
                for name, d in (raw.get("devices") or {}).items()
            }
            token = raw.get("rest_token")
            return cls(
                {str(k): str(v) for k, v in raw["nats"].items()},
                None if token is None else str(token),
                devices,
                agent_key=raw.get("agent_key"),
                node_tokens={str(k): str(v) for k, v in (raw.get("node_tokens") or {}).items()},
                ingest_token=raw.get("ingest_token"),
                site_route=raw.get("site_route"),
                site_leaf=raw.get("site_leaf"),
                nodes={str(k): v and str(v) for k, v in (raw.get("nodes") or {}).items()},
                node_passwords={
                    str(k): str(v) for k, v in (raw.get("node_passwords") or {}).items()
                },
                node=raw.get("node"),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SecurityError(f"{source} is not a spanflow credentials file: {exc!r}") from exc

    def api_token(self, node: str | None = None) -> str | None:
        """The token this host calls the REST API with: the operator's, else its node's."""
        if self.rest_token:
            return self.rest_token
        if node is not None:
            return self.node_tokens.get(node)
        return next(iter(self.node_tokens.values()), None)

    def node_token_for(self, node: str) -> str | None:
        """The node's own token (its bundle's, or derived on a full directory): what
        its agent seals heartbeats and activity with (security/node_seal.py)."""
        found = self.node_tokens.get(node)
        if found is None and self.agent_key:
            found = node_token(self.agent_key, node)
        return found

    def node_password_for(self, node: str) -> str | None:
        """A node's own NATS password: a site bundle's copy, or derived on a full
        directory (None: neither, a node another site's server admits)."""
        found = self.node_passwords.get(node)
        if found is None and self.agent_key:
            found = node_password(self.agent_key, node)
        return found

    def route_password_for(self, site: str | None) -> str:
        """The password of the routes between a site's servers: the hub's (``site``
        None) is the ``route`` role's; an edge site's is its own, from its bundle or
        derived on a full directory. SecurityError when this directory has neither."""
        if site is None:
            found = self.passwords.get("route")
        else:
            derived = site_route_password(self.agent_key, site) if self.agent_key else None
            found = self.site_route or derived
        if found is None:
            which = "the hub's routes" if site is None else f"site {site}'s routes"
            raise SecurityError(
                f"these secrets have no password for {which}: export a site bundle for "
                "it (`spanflow secrets export --role site`) from the full secrets"
            )
        return found

    def leaf_login(self, site: str | None) -> tuple[str, str]:
        """The user and password a site's server leafs into the hub with: a site
        bundle's own (``leaf-<site>``), else the shared ``leaf`` login (a full directory,
        or a bundle made before sites had their own). SecurityError when neither."""
        if self.site_leaf and site:
            return leaf_user_of(site), self.site_leaf
        if "leaf" in self.passwords:
            return "leaf", self.passwords["leaf"]
        raise SecurityError("these secrets have no leaf login: export the site's bundle again")

    def leaf_logins(self, sites: tuple[str, ...]) -> dict[str, str]:
        """The hub's side: user → password of each listed site's leaf link (derived from
        the node-token key), or the shared ``leaf`` login when no site is listed."""
        if not sites:
            return {"leaf": self.passwords["leaf"]} if "leaf" in self.passwords else {}
        if not self.agent_key:
            raise SecurityError(
                "per-site leaf logins (--leaf-site) need the full or coordinator secrets "
                "(the node-token key derives them)"
            )
        return {leaf_user_of(s): site_leaf_password(self.agent_key, s) for s in sites}

    def ingest_token_for(self, site: str) -> str | None:
        """The token a site's HTTP ingest takes: a site bundle's own, else (on a full
        directory, the hub's) the site's own, derived — never the operator's REST
        token, which would hand every HTTP device the key to everything."""
        if self.ingest_token:
            return self.ingest_token
        return ingest_token(self.agent_key, site) if self.agent_key else None


NODE_TOKEN_PREFIX = "node."


def mac_of(key: str, what: str) -> str:
    """HMAC-SHA256 of ``what`` under ``key``, base64url without padding: a derived secret."""
    digest = hmac.new(key.encode(), what.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def node_token(agent_key: str, node: str) -> str:
    """A node's REST token: its name and a MAC the coordinators check with the key
    they alone hold — no list of tokens to keep, none to leak but the node's own.

    >>> node_token("k", "edge-1").startswith("node.edge-1.")
    True
    """
    return f"{NODE_TOKEN_PREFIX}{node}.{mac_of(agent_key, 'node:' + node)}"


def node_of_token(agent_key: str, token: str) -> str | None:
    """The node a token was issued to, or None for anything else (constant time).

    >>> node_of_token("k", node_token("k", "edge-1")), node_of_token("k", "node.edge-1.x")
    ('edge-1', None)
    """
    if not token.startswith(NODE_TOKEN_PREFIX):
        return None
    node, _, mac = token[len(NODE_TOKEN_PREFIX) :].rpartition(".")
    if not node or not hmac.compare_digest(mac, mac_of(agent_key, "node:" + node)):
        return None
    return node


def derived(agent_key: str, purpose: str, name: str) -> str:
    """A secret for one purpose and name, derived from the node-token key.

    >>> derived("k", "leaf", "edge-a").startswith("leaf.edge-a.")
    True
    """
    return f"{purpose}.{name}.{mac_of(agent_key, f'{purpose}:{name}')}"


def node_password(agent_key: str, node: str) -> str:
    """A node's own NATS password (user ``agent.<node>``)."""
    return derived(agent_key, "nats", node)


def site_nodes(nodes: dict[str, str | None], site: str) -> list[str]:
    """The nodes a site's server admits: its own and those of no site.

    >>> site_nodes({"a": "s1", "b": None, "c": "s2"}, "s1")
    ['a', 'b']
    """
    return sorted(name for name, at in nodes.items() if at in (None, site))


def ingest_token(agent_key: str, site: str) -> str:
    return derived(agent_key, "ingest", site)


def site_route_password(agent_key: str, site: str) -> str:
    return derived(agent_key, "route", site)


def site_leaf_password(agent_key: str, site: str) -> str:
    return derived(agent_key, "leaf", site)


def leaf_user_of(site: str) -> str:
    """The hub's user for a site's leaf link.

    >>> leaf_user_of("edge-a")
    'leaf-edge-a'
    """
    return f"leaf-{site}"


def site_devices(devices: dict[str, Device], site: str) -> dict[str, Device]:
    """The devices a site's server admits: its own and those of no site.

    >>> site_devices({"a": Device("p", ("x",), site="s1"), "b": Device("p", ("y",))}, "s2")
    {'b': Device(password='p', publish=('y',), subscribe=(), site=None)}
    """
    return {name: d for name, d in devices.items() if d.site in (None, site)}
