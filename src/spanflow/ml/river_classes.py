"""River classes named in pipeline specs as ``river:<module>.<Class>``."""

from __future__ import annotations

import importlib


def river_class(ref: str) -> type:
    """The River class behind ``river:<module>.<Class>`` (ValueError when unknown).

    Only classes of River's own modules can be named: a spec cannot make a worker
    import anything else."""
    path = ref.removeprefix("river:")
    module, _, name = path.rpartition(".")
    if not ref.startswith("river:") or not module or not name:
        raise ValueError(
            f"{ref!r}: expected 'river:<module>.<Class>', "
            "e.g. river:linear_model.LogisticRegression"
        )
    try:
        cls = getattr(importlib.import_module(f"river.{module}"), name)
    except (ImportError, AttributeError):
        raise ValueError(f"{ref!r}: River has no {path}") from None
    if not isinstance(cls, type):
        raise ValueError(f"{ref!r} is not a class")
    return cls
