"""Reading a River model file without letting it name arbitrary code.

A River model is a pickle, and River has no other format. The registry takes one from
an authenticated user (the CLI, the REST API) — and from node agents: online learning
publishes what it learnt. A host holding a stolen agent bundle can therefore put a
file of its own making in the registry, and every node that scores with that model
would unpickle it. A plain ``pickle.loads`` runs whatever the file names
(``os.system``, ``subprocess.Popen``, ``builtins.eval``), so model files are read by
:func:`loads`, which resolves only:

* classes and functions *defined in* River, outside its parts that read or write files
  or fetch URLs (datasets, streams and their caches, evaluation, checks);
* the containers and numbers River models hold (``collections``, ``functools.partial``,
  ``random.Random``, ``statistics.NormalDist``, NumPy arrays and scalars, the safe
  builtins);
* ``getattr`` (River pickles bound methods with it) for names without double
  underscores, so ``__globals__``, ``__class__`` or ``__subclasses__`` lead nowhere.

Anything else fails to load with :class:`~spanflow.errors.InvalidModel` naming what the
file asked for — before any of it runs. This narrows what a forged file can do; it is
defence in depth, not a sandbox.
"""

from __future__ import annotations

import importlib
import io
import pickle
from typing import Any

from spanflow.errors import InvalidModel

RIVER_OFF_LIMITS = (
    "river.datasets",
    "river.bandit.datasets",
    "river.stream",
    "river.evaluate",
    "river.checks",
    "river.compose.func",
)
"""River's parts that open files, fetch URLs, unpickle caches or call what they are
given: a model never needs to name them."""
SAFE_BUILTINS = frozenset(
    {
        "bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int",
        "list", "object", "range", "set", "slice", "str", "tuple",
    }
)  # fmt: skip
ALLOWED = {
    "collections": frozenset({"Counter", "OrderedDict", "defaultdict", "deque"}),
    "copyreg": frozenset({"_reconstructor", "__newobj__", "__newobj_ex__"}),
    "functools": frozenset({"partial"}),
    "random": frozenset({"Random"}),
    "statistics": frozenset({"NormalDist"}),
    "numpy": frozenset({"ndarray", "dtype"}),
    "numpy.core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy._core.multiarray": frozenset({"_reconstruct", "scalar"}),
}
"""Module → the names a model file may use from it (besides River's own and builtins)."""


def safe_getattr(obj: object, name: str, *default: object) -> object:
    """``getattr`` for names without double underscores (bound methods, fields)."""
    if "__" in name:
        raise InvalidModel(f"the river model asks for attribute {name!r}: refused")
    return getattr(obj, name, *default)


def _off_limits(module: str) -> bool:
    return any(module == off or module.startswith(off + ".") for off in RIVER_OFF_LIMITS)


def _river_own(module: str, name: str) -> object:
    """A class or function River defines, by its (possibly dotted) name: never a module
    or anything a River module merely imported."""
    if _off_limits(module) or "__" in name:
        raise InvalidModel(f"the river model names {module}.{name}, which no model needs")
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidModel(f"the river model names {module}.{name}: {exc}") from None
    owner = getattr(found, "__module__", None)
    if not callable(found) or not isinstance(owner, str) or not owner.startswith("river."):
        raise InvalidModel(f"{module}.{name} is not River's own class or function: refused")
    if _off_limits(owner):
        raise InvalidModel(f"the river model names {owner}.{name}, which no model needs")
    return found


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins":
            if name == "getattr":
                return safe_getattr
            if name in SAFE_BUILTINS:
                return super().find_class(module, name)
        elif module == "river" or module.startswith("river."):
            return _river_own(module, name)
        elif name in ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise InvalidModel(f"the river model names {module}.{name}, which a model may not use")


def loads(data: bytes) -> Any:
    """A River model from its file, resolving only what :data:`ALLOWED` and River's own
    classes and functions cover (InvalidModel otherwise)."""
    return _Unpickler(io.BytesIO(data)).load()
