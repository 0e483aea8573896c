"""How spanflow's registries fill themselves and its packages export lazily: every
module of a registry package is imported so that its decorators register it (step
families, connectors, compile functions), and a package's public names are imported
on first use (Spark's Python workers import ``spanflow`` many times over and need none
of the front ends). Standard library only: importable from every layer."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def import_all(package: str, path: Iterable[str], skip: Iterable[str] = ()) -> None:
    """Import each module of ``package`` (found on ``path``, its ``__path__``) but the
    private ones and ``skip``, alphabetically; a subpackage's modules too (so a
    subpackage's ``__init__`` can stay light: Spark's workers import it)."""
    left_out = set(skip)
    found = pkgutil.walk_packages(list(path), prefix=f"{package}.")
    for info in sorted(found, key=lambda m: m.name):
        last = info.name.rsplit(".", 1)[-1]
        if last not in left_out and not last.startswith("_"):
            importlib.import_module(info.name)


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``name`` from ``exports[name]`` on first use."""

    def attribute(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return attribute
