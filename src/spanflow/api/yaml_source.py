"""Safe YAML parsing that remembers where every value came from.

Shared by the pipeline and topology loaders so that both report problems as
``file:line: field: message``. Only plain data tags are accepted: no Python object is
ever constructed from a file.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from spanflow.errors import PipelineFileError

Path_ = tuple[str | int, ...]
MAX_NODES = 100_000
"""Values a file may hold once its aliases are expanded: a few ``&a [*b, *b, ...]``
lines would otherwise expand to billions (the "billion laughs" file)."""
MAX_DEPTH = 64
_SAFE_TAGS = {
    f"tag:yaml.org,2002:{t}"
    for t in ("map", "seq", "str", "int", "float", "bool", "null", "timestamp")
}


def _hint(problem: str) -> str:
    """The usual cause of a confusing parser message, when there is one."""
    if "got '?'" in problem:
        return ' (inside { } quote a type that ends in "?", e.g. id: "long?")'
    return ""


def compose_located(
    text: str, path: str, error: type[PipelineFileError] = PipelineFileError
) -> tuple[Any, dict[Path_, int]]:
    """Parse YAML safely, remembering the line of every mapping key and list item."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(path, [(line, "", f"not valid YAML: {problem}{_hint(problem)}")]) from None
    lines: dict[Path_, int] = {}
    scalars = yaml.SafeLoader("")
    open_nodes: set[int] = set()
    walked = 0

    def refuse(at: Path_, problem: str) -> PipelineFileError:
        return error(path, [(lines.get(at), field_text(at) or "document", problem)])

    def walk(node: yaml.Node | None, at: Path_) -> Any:
        nonlocal walked
        if node is None:
            return None
        if id(node) in open_nodes:  # the line of the key or item holding the alias
            raise refuse(at, "a YAML alias (*name) refers to a value that contains it")
        lines[at] = node.start_mark.line + 1
        walked += 1
        if walked > MAX_NODES:
            raise refuse(at, f"more than {MAX_NODES:,} values once aliases are expanded")
        if len(at) > MAX_DEPTH:
            raise refuse(at, f"nested more than {MAX_DEPTH} levels deep")
        if node.tag not in _SAFE_TAGS:
            where = field_text(at) or "document"
            raise error(
                path,
                [(lines[at], where, f"YAML tag {node.tag!r} is not allowed (plain data only)")],
            )
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            open_nodes.add(id(node))
            try:
                return walk_collection(node, at)
            finally:
                open_nodes.discard(id(node))
        return scalars.construct_object(node, deep=True)

    def walk_collection(node: yaml.MappingNode | yaml.SequenceNode, at: Path_) -> Any:
        if isinstance(node, yaml.SequenceNode):
            return [walk(item, (*at, i)) for i, item in enumerate(node.value)]
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise refuse(at, "a mapping key must be a plain value, not a list or mapping")
            key = key_node.value
            lines[(*at, key)] = key_node.start_mark.line + 1
            out[key] = walk(value_node, (*at, key))
        return out

    return walk(root, ()), lines


def line_for(loc: Path_, lines: dict[Path_, int]) -> int | None:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            return lines[loc[:cut]]
    return None


def field_text(loc: Path_) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def located_problems(
    exc: ValidationError, lines: dict[Path_, int], prefix: Path_ = ()
) -> list[tuple[int | None, str, str]]:
    """pydantic errors as (line, field, message), for documents validated as they are."""
    out: list[tuple[int | None, str, str]] = []
    for err in exc.errors():
        loc: Path_ = (*prefix, *err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        out.append((line_for(loc, lines), field_text(loc), message))
    return out
