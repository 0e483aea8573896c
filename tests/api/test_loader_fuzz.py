"""Fuzzing the file loaders: every malformed pipeline or topology file is a located
spanflow error, never a Python exception from deep inside the loader.

The example files are mutated both as text (lines dropped, duplicated, indented or
cut short, characters replaced) and as data (values replaced by odd ones of every YAML
kind, keys dropped or added, aliases that refer to themselves)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spanflow.api.topology_loader import load_topology_text
from spanflow.api.yaml_loader import load_pipeline_text
from spanflow.errors import PipelineFileError, SpanflowError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PIPELINES = [*sorted(EXAMPLES.glob("*.yaml")), EXAMPLES / "cluster" / "factory_monitoring.yaml"]
TOPOLOGIES = [EXAMPLES / "cluster" / "topology.yaml"]
MUTANTS_PER_FILE = 400

ODD_VALUES: list[Any] = [
    None, [], {}, [1, 2], {"a": 1}, "x", 0, -1, 1.5, True, "", "  ", [[]], [{}],
    {"x": [1]}, 10**30, "\xff\x00", "${X}", float("nan"), "1 s", "-5m", "sink",
]  # fmt: skip
ODD_KEYS = ["type", "id", "to", "inputs", "key", "stream", "where", "schema", "window", "zz"]


def _places(doc: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield at, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _places(value, (*at, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _places(value, (*at, i))


def _mutate_data(doc: Any, rng: random.Random) -> str:
    """One to three edits of the parsed file; the result may share a value with
    itself (a YAML alias), even one that contains itself."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        at, node = rng.choice(list(_places(doc))[1:])
        parent = doc
        for step in at[:-1]:
            parent = parent[step]
        roll = rng.random()
        if roll < 0.55:
            parent[at[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif roll < 0.7 and isinstance(parent, dict):
            del parent[at[-1]]
        elif isinstance(parent, dict):
            parent[rng.choice(ODD_KEYS)] = copy.deepcopy(rng.choice(ODD_VALUES))
        else:
            parent.append(node if rng.random() < 0.3 else copy.deepcopy(parent))
    return yaml.safe_dump(doc, sort_keys=False)


def _mutate_text(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    i = rng.randrange(len(lines))
    roll = rng.random()
    if roll < 0.2:
        del lines[i]
    elif roll < 0.4:
        lines[i] = "  " + lines[i]
    elif roll < 0.6:
        lines.insert(i, lines[rng.randrange(len(lines))])
    elif roll < 0.8:
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    elif lines[i]:
        j = rng.randrange(len(lines[i]))
        lines[i] = lines[i][:j] + rng.choice(":-[]{}&*!|>#'\"?%@`,") + lines[i][j + 1 :]
    return "\n".join(lines)


def _mutants(path: Path, seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    text = path.read_text()
    doc = yaml.safe_load(text)
    for n in range(MUTANTS_PER_FILE):
        yield _mutate_text(text, rng) if n % 3 == 0 else _mutate_data(doc, rng)


def _load_pipeline(text: str, path: str) -> object:
    return load_pipeline_text(text, path, source_stream="IN", sink_stream="OUT")


def _fuzz(path: Path, load: Callable[[str, str], object]) -> tuple[int, list[str]]:
    refused = 0
    crashes: list[str] = []
    for text in _mutants(path, seed=len(path.name)):
        try:
            load(text, path.name)
        except SpanflowError:
            refused += 1
        except Exception as exc:  # the point: anything else is a bug
            crashes.append(f"{type(exc).__name__}: {exc}\n{text}")
    return refused, crashes


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_mutated_pipeline_files_give_located_errors(path: Path) -> None:
    refused, crashes = _fuzz(path, _load_pipeline)
    assert not crashes, f"{len(crashes)} crashes; the first:\n{crashes[0]}"
    assert refused > MUTANTS_PER_FILE // 4  # the mutations do break files


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.name)
def test_mutated_topology_files_give_located_errors(path: Path) -> None:
    refused, crashes = _fuzz(path, load_topology_text)
    assert not crashes, f"{len(crashes)} crashes; the first:\n{crashes[0]}"
    assert refused > MUTANTS_PER_FILE // 4


def test_an_alias_that_contains_itself_is_refused_with_its_line() -> None:
    text = "name: p\nsources: &a\n  - id: s\n    to: *a\n"
    with pytest.raises(PipelineFileError) as caught:
        load_pipeline_text(text, "p.yaml")
    assert "p.yaml:4: sources[0].to: a YAML alias" in str(caught.value)


def test_a_billion_laughs_file_is_refused_before_it_expands() -> None:
    rows = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    with pytest.raises(PipelineFileError, match="once aliases are expanded"):
        load_pipeline_text("\n".join(rows) + "\n", "laughs.yaml")


def test_a_seed_file_whose_type_is_a_list_names_the_field() -> None:
    text = "- id: a\n  type: [forward]\n  to: [sink]\n"
    with pytest.raises(PipelineFileError) as caught:
        load_pipeline_text(text, "seed.yaml", source_stream="IN", sink_stream="OUT")
    assert "seed.yaml:2" in str(caught.value) and "type" in str(caught.value)
