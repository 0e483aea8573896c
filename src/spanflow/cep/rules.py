"""Versioned rule sets, pure: what a push or a rollback does to a rule set's manifest.
:mod:`spanflow.cep.rule_store` keeps manifests in a JetStream key-value bucket.

A rule set is a list of :class:`~spanflow.spec.patterns.RuleSpec` (named patterns
with their selections). Every push is a new version and becomes current; a
rollback makes the version before current again. Running pattern steps pin one
version per micro-batch, so a change applies at a batch boundary.

>>> from spanflow.spec.patterns import RuleSpec
>>> r = RuleSpec.model_validate({"name": "hot", "pattern": {"stages": [{"name": "a"}]}})
>>> b = r.model_copy(update={"name": "b"})
>>> m = push(push(None, "plant", [r], now=0.0), "plant", [r, b], now=1.0)
>>> m.current, [x.name for x in m.version(m.current).rules]
(2, ['hot', 'b'])
>>> rollback(m).current
1
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from spanflow.errors import SpecError
from spanflow.spec.patterns import RULE_NAME, RuleSpec

KEEP_VERSIONS = 100
"""Older versions are dropped from the manifest (a rollback reaches this far)."""
_NAME = re.compile(RULE_NAME)


class RuleSetError(SpecError):
    """A rule-set request cannot be met (the message says why)."""

    code = "rule_set_error"


class RuleSetNotFound(RuleSetError):
    code = "rule_set_not_found"


class RuleSetVersion(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(ge=1)
    rules: tuple[RuleSpec, ...]
    created: float
    note: str = ""


class RuleSetManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=RULE_NAME)
    versions: tuple[RuleSetVersion, ...] = ()
    current: int | None = None
    history: tuple[int, ...] = Field(default=(), description="Earlier current versions.")

    def version(self, number: int) -> RuleSetVersion:
        for v in self.versions:
            if v.version == number:
                return v
        known = ", ".join(str(v.version) for v in self.versions) or "none"
        raise RuleSetNotFound(f"rule set {self.name!r} has no version {number} (versions: {known})")


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise RuleSetError(f"rule set name {name!r}: use 1 to 64 letters, digits, '.', '-' or '_'")
    return name


def push(
    manifest: RuleSetManifest | None,
    name: str,
    rules: Sequence[RuleSpec],
    *,
    now: float,
    note: str = "",
) -> RuleSetManifest:
    """A new version with ``rules``, current from now on."""
    check_name(name)
    if not rules:
        raise RuleSetError(f"rule set {name!r}: a version needs at least one rule")
    names = [r.name for r in rules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RuleSetError(f"rule set {name!r}: rules {twice} are named twice")
    current = manifest or RuleSetManifest(name=name)
    number = max((v.version for v in current.versions), default=0) + 1
    added = RuleSetVersion(version=number, rules=tuple(rules), created=now, note=note)
    history = (*current.history, current.current) if current.current is not None else ()
    versions = (*current.versions, added)[-KEEP_VERSIONS:]
    return current.model_copy(
        update={"versions": versions, "current": number, "history": history[-KEEP_VERSIONS:]}
    )


def rollback(manifest: RuleSetManifest) -> RuleSetManifest:
    """The version current before this one, current again."""
    if manifest.current is None:
        raise RuleSetError(f"rule set {manifest.name!r} has no version to roll back")
    kept = {v.version for v in manifest.versions}
    history = [h for h in manifest.history if h in kept]
    if not history:
        raise RuleSetError(
            f"rule set {manifest.name!r}: version {manifest.current} is the first; "
            "nothing to roll back to"
        )
    return manifest.model_copy(update={"current": history[-1], "history": tuple(history[:-1])})
