"""What a connector declares, and the registry of connectors by role and name."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from spanflow.errors import SpecError

Role = Literal["source", "sink"]

KeyFields = Annotated[tuple[str, ...], BeforeValidator(lambda v: (v,) if isinstance(v, str) else v)]
"""The fields that identify a record in an external system: one name or a list."""


def url_check(*schemes: str, what: str, passwords: bool = True) -> AfterValidator:
    """A validator of a URL that must start with one of ``schemes`` (and, with
    ``passwords=False``, hold no ``user:password@``: secrets stay out of specs)."""

    def check(value: str) -> str:
        if not value.startswith(schemes):
            raise ValueError(f"{what} starts with {' or '.join(schemes)}")
        if not passwords and re.search(r"://[^/@:]+:[^/@]+@", value):
            raise ValueError(f"put no password in the {what}: name an environment variable")
        return value

    return AfterValidator(check)


class ConnectorOptions(BaseModel):
    """A connector's own options (the step's common fields — format, schema, key, event
    time, trigger — are not repeated here)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def secret_free(self) -> dict[str, Any]:
        """The options as shown in logs, plans and errors: secrets masked."""
        return self.model_dump(mode="json")

    def inline_secrets(self) -> list[str]:
        """Options that hold a secret's value in the spec itself (``config.sasl.password``):
        a submission with any is refused — the spec is stored in the control plane,
        shown by the API and handed to Spark — in favour of ``..._env`` references."""
        return []


class NoOptions(ConnectorOptions):
    """A connector whose settings are all fields of the step itself."""


@dataclass(frozen=True)
class Connector:
    """One connector in one role (a Kafka source and a Kafka sink are two)."""

    name: str
    """What a pipeline names it by: ``type: kafka`` in YAML."""
    role: Role
    options: type[ConnectorOptions]
    exactly_once: str
    """How its output (sink) or its replay (source) is exactly once, in one sentence."""
    realtime: bool = False
    """Whether a query through it can run in Spark's Real-Time Mode."""
    standby: str | None = None
    """How it stays exactly once when a pipeline runs hot standby replicas (both read
    and write it, docs/cluster.md#hot-standby), in one sentence; None: a pipeline
    with ``standby`` may not use it."""
    append_only: bool = False
    """A sink that takes only rows that are final (no updates of earlier ones)."""
    external: bool = False
    """It reads or writes a system outside spanflow's NATS servers: the fragment must run
    at a site that can reach it."""
    extra: str | None = None
    """The install extra that brings its client library (``pip install spanflow[kafka]``)."""
    module: str | None = None
    """The client library's import name, checked when a pipeline is validated."""
    address_option: str | None = None
    """The option that says where the external system is (``bootstrap``, ``dsn``...):
    filled from the topology's ``externals`` when a step names one and leaves it out."""

    def address(self, options: ConnectorOptions) -> str | None:
        """Where a step's external system is (brokers, a DSN, a URL), to match it with
        an external declared in the topology; None for spanflow's own systems."""
        value = getattr(options, self.address_option) if self.address_option else None
        return str(value) if value else None

    def parse(self, raw: Any) -> ConnectorOptions:
        """The typed options from a mapping (or an options object already typed)."""
        if isinstance(raw, self.options):
            return raw
        if isinstance(raw, ConnectorOptions):
            raw = raw.model_dump()
        return self.options.model_validate(raw if raw is not None else {})

    def missing_library(self) -> str | None:
        """Why this connector cannot run here (its client library is not installed)."""
        if self.module is None or importlib.util.find_spec(self.module) is not None:
            return None
        return (
            f"the {self.name} {self.role} needs the {self.module!r} library: "
            f"pip install 'spanflow[{self.extra or self.name}]'"
        )


_REGISTRY: dict[tuple[Role, str], Connector] = {}


def register(connector: Connector) -> Connector:
    key = (connector.role, connector.name)
    known = _REGISTRY.get(key)
    if known is not None and known != connector:
        raise TypeError(f"{connector.role} connector {connector.name!r} is declared twice")
    _REGISTRY[key] = connector
    return connector


def connectors(role: Role) -> dict[str, Connector]:
    """Every registered connector of a role, by name, alphabetically."""
    return {name: c for (r, name), c in sorted(_REGISTRY.items()) if r == role}


def lookup(role: Role, name: str) -> Connector:
    """The connector a step names; a SpecError listing the known ones otherwise."""
    found = _REGISTRY.get((role, name))
    if found is None:
        known = ", ".join(connectors(role))
        raise SpecError(f"unknown {role} type {name!r} (known: {known})")
    return found
