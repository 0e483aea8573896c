"""Plain-data snapshots of River models, so that a model can be keyed engine state.

River saves models only with pickle, and pickle runs whatever code its input names.
A model kept as Spark state is written into the checkpoint and read back after a
restart or on another node, so it must not be pickle. This module turns a model into
JSON text and back, with these rules:

* plain values (numbers — ``inf`` and ``nan`` included —, strings, lists, tuples,
  dicts with any plain keys, sets, deques, ``defaultdict``/``OrderedDict``/``Counter``,
  ``random.Random`` states and numpy arrays) are written as they are;
* an object is written as its class name and attributes, and only classes of the
  modules in :data:`TRUSTED_MODULES` (River, spanflow's own ML code) are ever
  re-created — ``cls.__new__`` then its attributes, no ``__reduce__`` callables, no
  imports of arbitrary modules: a snapshot cannot run code;
* extension types (River's Rust ``VectorDict`` and statistics) are written through
  their ``__reduce__`` when it names a trusted class with plain-data arguments;
* shared references stay shared (a Half-Space Tree's node lists alias its trees);
* anything else (a lambda as a ``defaultdict`` factory, a loss function object of an
  untrusted module) is not written at all: it is taken from the *template* — a fresh
  model built from the same pipeline definition — at the same place.

``restore(dump(model), template)`` continues exactly where ``model`` was: tested by
checking that every later prediction of the restored copy equals the original's.
"""

from __future__ import annotations

import collections
import importlib
import json
import math
import random
from typing import Any

import numpy as np

TRUSTED_MODULES = ("river.", "spanflow.ml.")
PLAIN_TYPES = {t.__name__: t for t in (list, dict, set, frozenset, tuple, int, float, str, bool)}
_KEEP = {"$keep": 1}


class SnapshotError(ValueError):
    """A snapshot names a class outside the trusted modules, or is malformed."""


def _trusted(cls: type) -> bool:
    return cls.__module__.startswith(TRUSTED_MODULES) or cls.__module__ == "river"


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _load_class(name: str) -> type:
    module, _, qualname = name.partition(":")
    if not (module + ".").startswith(TRUSTED_MODULES):
        raise SnapshotError(f"class {name!r} is not of a trusted module {TRUSTED_MODULES}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise SnapshotError(f"{name!r} is not a class")
    return obj


class _Encoder:
    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.alive: list[Any] = []  # keeps ids stable while encoding

    def value(self, v: Any) -> Any:
        if v is None or (isinstance(v, bool | str | int) and not isinstance(v, np.integer)):
            return v
        if isinstance(v, float | np.floating):
            f = float(v)
            return f if math.isfinite(f) else {"$f": repr(f)}
        if isinstance(v, np.integer | np.bool_):
            return v.item()
        if isinstance(v, np.ndarray):
            return {"$np": str(v.dtype), "shape": list(v.shape), "data": self.value(v.tolist())}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, tuple):
            return {"$t": [self.value(x) for x in v]}
        if isinstance(v, frozenset | set):
            return {"$set": [self.value(x) for x in v], "frozen": isinstance(v, frozenset)}
        if isinstance(v, collections.deque):
            return {"$dq": [self.value(x) for x in v], "maxlen": v.maxlen}
        if isinstance(v, dict):
            return self.mapping(v)
        if isinstance(v, random.Random):
            return {"$rng": self.value(v.getstate())}
        if isinstance(v, type):
            if any(v is plain for plain in PLAIN_TYPES.values()):
                return {"$cls": f"builtins:{v.__name__}"}
            return {"$cls": _class_name(v)} if _trusted(v) else _KEEP
        return self.instance(v)

    def mapping(self, v: dict[Any, Any]) -> Any:
        items = [[self.value(k), self.value(x)] for k, x in v.items()]
        if isinstance(v, collections.defaultdict):
            factory = v.default_factory
            return {"$dd": items, "factory": None if factory is None else self.value(factory)}
        if isinstance(v, collections.Counter):
            return {"$counter": items}
        if isinstance(v, collections.OrderedDict):
            return {"$od": items}
        return {"$d": items}

    def instance(self, v: Any) -> Any:
        cls = type(v)
        if not _trusted(cls):
            return _KEEP
        known = self.ids.get(id(v))
        if known is not None:
            return {"$ref": known}
        ident = self.ids[id(v)] = len(self.ids)
        self.alive.append(v)
        if _rebuildable_trees(v):
            return self.half_space_trees(v, ident)
        attrs = _attributes(v)
        if attrs is not None and not _is_extension(cls):
            return {
                "$o": _class_name(cls),
                "id": ident,
                "a": {k: self.value(x) for k, x in attrs.items()},
            }
        try:
            reduced = v.__reduce__()
        except TypeError:
            reduced = None
        if not (isinstance(reduced, tuple) and reduced[0] is cls):
            raise SnapshotError(
                f"{_class_name(cls)} cannot be kept as state (it has no plain-data form)"
            )
        state = reduced[2] if len(reduced) > 2 else None
        return {
            "$x": _class_name(cls),
            "id": ident,
            "args": self.value(tuple(reduced[1])),
            "state": self.value(state),
        }

    def half_space_trees(self, v: Any, ident: int) -> Any:
        """A Half-Space Trees detector as its masses only: its trees are random but
        seeded, so they are grown again from the seed when restored (a tenth of the
        size, and ten times faster, than writing every node)."""
        skip = {"trees", "_tree_nodes", "rng", "limits"}
        attrs = {k: self.value(x) for k, x in vars(v).items() if k not in skip}
        nodes = [node for tree in v._tree_nodes for node in tree]
        return {
            "$hst": _class_name(type(v)),
            "id": ident,
            "a": attrs,
            "features": self.value(list(v.limits)),
            "limits": self.value([list(v.limits[f]) for f in v.limits]),
            "root": [v.trees[0].feature, v.trees[0].threshold],
            "l": [node.l_mass for node in nodes],
            "r": [node.r_mass for node in nodes],
        }


def _attributes(v: Any) -> dict[str, Any] | None:
    """An object's attributes, from ``__dict__`` and ``__slots__``."""
    attrs = dict(getattr(v, "__dict__", {}))
    for klass in type(v).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(v, name):
                attrs[name] = getattr(v, name)
    if not attrs and not hasattr(v, "__dict__"):
        return None
    return attrs


def _rebuildable_trees(v: Any) -> bool:
    from river.anomaly import HalfSpaceTrees

    return type(v) is HalfSpaceTrees and v.seed is not None and bool(v.trees)


def _is_extension(cls: type) -> bool:
    """A compiled type (River's Rust structures): re-created through its arguments."""
    return "_river_rust" in cls.__module__


class _Decoder:
    def __init__(self) -> None:
        self.objects: dict[int, Any] = {}

    def value(self, v: Any, template: Any) -> Any:
        if not isinstance(v, dict | list):
            return v
        if isinstance(v, list):
            return [self.value(x, _at(template, i)) for i, x in enumerate(v)]
        if "$keep" in v:
            return template
        if "$f" in v:
            return float(v["$f"])
        if "$t" in v:
            return tuple(self.value(x, _at(template, i)) for i, x in enumerate(v["$t"]))
        if "$d" in v or "$od" in v or "$counter" in v or "$dd" in v:
            return self.mapping(v, template)
        if "$set" in v:
            items = [self.value(x, None) for x in v["$set"]]
            return frozenset(items) if v["frozen"] else set(items)
        if "$dq" in v:
            return collections.deque([self.value(x, None) for x in v["$dq"]], v["maxlen"])
        if "$np" in v:
            return np.asarray(self.value(v["data"], None), dtype=v["$np"]).reshape(v["shape"])
        if "$rng" in v:
            rng = random.Random()
            rng.setstate(_tuples(self.value(v["$rng"], None)))
            return rng
        if "$cls" in v:
            name = v["$cls"]
            plain = PLAIN_TYPES.get(name.removeprefix("builtins:"))
            return (
                plain if plain is not None and name.startswith("builtins:") else _load_class(name)
            )
        if "$ref" in v:
            return self.objects[v["$ref"]]
        if "$o" in v:
            return self.instance(v, template)
        if "$x" in v:
            return self.extension(v)
        if "$hst" in v:
            return self.half_space_trees(v)
        raise SnapshotError(f"unknown snapshot entry {sorted(v)[:3]}")

    def mapping(self, v: dict[str, Any], template: Any) -> Any:
        kind = next(k for k in ("$d", "$od", "$counter", "$dd") if k in v)
        out: dict[Any, Any]
        if kind == "$dd":
            factory = v["factory"]
            made = None if factory is None else self.value(factory, _factory(template))
            out = collections.defaultdict(made)
        elif kind == "$counter":
            out = collections.Counter()
        elif kind == "$od":
            out = collections.OrderedDict()
        else:
            out = {}
        for k, x in v[kind]:
            key = _hashable(self.value(k, None))
            out[key] = self.value(x, _at(template, key))
        return out

    def instance(self, v: dict[str, Any], template: Any) -> Any:
        cls = _load_class(v["$o"])
        obj: Any = object.__new__(cls)
        self.objects[v["id"]] = obj
        attrs = (_attributes(template) or {}) if type(template) is cls else {}
        for k, x in v["a"].items():
            object.__setattr__(obj, k, self.value(x, attrs.get(k)))
        return obj

    def half_space_trees(self, v: dict[str, Any]) -> Any:
        from river.anomaly import HalfSpaceTrees
        from river.tree.padded import make_padded_tree

        a = {k: self.value(x, None) for k, x in v["a"].items()}
        features = self.value(v["features"], None)
        limits = dict(zip(features, (tuple(x) for x in self.value(v["limits"], None)), strict=True))
        obj = HalfSpaceTrees(a["n_trees"], a["height"], a["window_size"], limits, a["seed"])
        obj.trees = [
            make_padded_tree(
                limits={f: limits[f] for f in sorted(limits)},
                height=obj.height,
                padding=0.15,
                rng=obj.rng,
                r_mass=0,
                l_mass=0,
            )
            for _ in range(obj.n_trees)
        ]
        if [obj.trees[0].feature, obj.trees[0].threshold] != v["root"]:
            raise SnapshotError("Half-Space Trees grown from the seed differ from the snapshot")
        obj._tree_nodes = [list(t.iter_dfs()) for t in obj.trees]
        nodes = [node for tree in obj._tree_nodes for node in tree]
        for node, left, right in zip(nodes, v["l"], v["r"], strict=True):
            node.l_mass, node.r_mass = left, right
        obj.__dict__.update(a)
        self.objects[v["id"]] = obj
        return obj

    def extension(self, v: dict[str, Any]) -> Any:
        cls = _load_class(v["$x"])
        obj = cls(*self.value(v["args"], None))
        state = self.value(v["state"], None)
        if state is not None:
            obj.__setstate__(state)
        self.objects[v["id"]] = obj
        return obj


def _at(template: Any, key: Any) -> Any:
    """The part of the template at ``key`` (None when it has none)."""
    try:
        if isinstance(template, dict):
            return template.get(key)
        if isinstance(template, list | tuple):
            return template[key]
    except (IndexError, TypeError):
        return None
    return None


def _factory(template: Any) -> Any:
    return template.default_factory if isinstance(template, collections.defaultdict) else None


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list | tuple) else v


def dump(model: Any) -> str:
    """The model's state as JSON text (see the module's rules)."""
    return json.dumps(_Encoder().value(model), separators=(",", ":"))


def restore(text: str, template: Any) -> Any:
    """A model equal in state to the one ``text`` was dumped from. ``template`` is a
    fresh model built from the same definition: parts a snapshot does not hold (a
    lambda, an untrusted helper object) are taken from it."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SnapshotError(f"not a model snapshot: {exc}") from None
    return _Decoder().value(data, template)
