"""The layer rule of docs/architecture.md, enforced on every import in src/spanflow.

A module may import its own package and packages of lower layers only; packages of
one layer never import each other (``spark`` may adapt ``cep`` and ``ml``). Only
``spanflow.spark`` imports pyspark.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "spanflow"

LAYERS: dict[str, float] = {
    "errors": -1,
    "clock": -1,
    "plugins": -1,  # registries that fill themselves, lazy exports (standard library only)
    "maven": -0.5,  # jars fetched from Maven Central (errors and the standard library)
    "faults": -1,  # fault points tests arm to kill a process at an exact moment
    "spec": 0,
    "protocol": 0.4,  # the wire vocabulary: names, REST models, the typed client (spec only)
    "security": 0.5,  # certificates, credentials, keys: read by nats, runtime, servers
    "nats": 1,
    "store": 1.5,  # documents, files, pins and signals on JetStream (the ml/cep stores' shell)
    "api": 2,
    "plan": 3,
    "cep": 3,
    "ml": 3,
    "spark": 3,
    "control": 4,
    "runtime": 4,
    "simulator": 4.5,  # simulated devices: a library the demo, CLI and benchmarks use
    "web": 4.8,  # the dashboard's static assets; the server serves them
    "doors": 4.9,  # the site's doors for devices (MQTT, HTTP ingest): local clusters start them
    "server": 5,
    "local": 5,
    "demo": 5.5,  # the demo: its pipelines, and a whole cluster here (local) shown live
    "testing": 5,
    "cli": 6,  # the outermost entry points
    "__init__": 7,  # the package facade (lazy re-exports)
    "__main__": 7,
}
SIDEWAYS = {("spark", "cep"), ("spark", "ml")}


def _package_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement, at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_package_has_a_layer():
    unknown = sorted({_package_of(p) for p in _modules()} - set(LAYERS))
    assert not unknown, f"give these packages a layer in tests/test_layers.py: {unknown}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_go_down_the_layers(path: Path):
    here = _package_of(path)
    wrong = []
    for line, module in _imports(path):
        parts = module.split(".")
        if parts[0] == "pyspark" and here != "spark":
            wrong.append(f"line {line}: imports {module} (only spanflow.spark may)")
        if parts[0] != "spanflow" or len(parts) < 2:
            continue
        there = parts[1]
        if there == here or (here, there) in SIDEWAYS:
            continue
        if there not in LAYERS or LAYERS[there] >= LAYERS[here]:
            wrong.append(
                f"line {line}: {here} (layer {LAYERS[here]}) imports {module} "
                f"(layer {LAYERS.get(there, '?')})"
            )
    assert not wrong, f"{path.relative_to(SRC)}:\n" + "\n".join(wrong)


ROOMS: dict[str, set[str]] = {
    # client libraries, and the packages that may use them
    "typer": {"cli"},
    "rich": {"cli", "demo"},
    "fastapi": {"server", "doors"},
    "starlette": {"server", "doors"},
    "uvicorn": {"server", "doors", "cli"},
    "confluent_kafka": {"spark", "local"},
    "psycopg": {"spark", "local"},
    "pymongo": {"spark", "local"},
    "boto3": {"spark", "local"},
    "paho": {"local"},
    "nats": {
        "nats",
        "simulator",
        "control",
        "runtime",
        "spark",
        "server",
        "doors",
        "local",
        "demo",
        "testing",
        "cli",
        "store",
    },
}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_client_libraries_stay_in_their_rooms(path: Path):
    """A web framework, a CLI toolkit or a connector's client library is imported only
    by the packages whose job it is (a pipeline step never imports typer; the REST
    routes never import a Kafka client)."""
    here, rel = _package_of(path), str(path.relative_to(SRC))
    wrong = []
    for line, module in _imports(path):
        top = module.split(".")[0]
        if top in ROOMS and here not in ROOMS[top]:
            wrong.append(f"line {line}: {here} imports {module} (only {sorted(ROOMS[top])})")
        if here in ("ml", "cep") and module.startswith("spanflow.nats"):
            wrong.append(f"line {line}: {rel} imports {module} (ml and cep use spanflow.store)")
    assert not wrong, f"{rel}:\n" + "\n".join(wrong)


def test_the_rule_catches_an_upward_import(tmp_path):
    """The check itself: an api module importing the control plane is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from spanflow.control.coordinator import Coordinator\n")
    found = [m for _, m in _imports(bad)]
    assert found == ["spanflow.control.coordinator"]
    assert LAYERS["control"] >= LAYERS["api"]


def test_doctest_collection_can_tell_every_module_apart():
    """The suite collects doctests from every module; in a folder without __init__.py
    pytest imports a module by its file name, so two such files of one name (e.g.
    control/settings.py and runtime/settings.py) break the collection."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in _modules():
        parts, folder = [path.stem], path.parent
        while (folder / "__init__.py").exists():
            parts.insert(0, folder.name)
            folder = folder.parent
        name = ".".join(parts)
        if name in seen:
            clashes.append(f"{seen[name].relative_to(SRC)} and {path.relative_to(SRC)}")
        seen[name] = path
    assert not clashes, f"rename one of each: {clashes}"
