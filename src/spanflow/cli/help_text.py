"""Help texts as paragraphs: a command's docstring is hard-wrapped for the source, but
the terminal wraps it again, so each wrapped line would end where the source's did
(mid-sentence). :func:`reflow_commands` joins every paragraph's lines before Typer
reads the docstrings; blank lines, and lines that start a list item, stay."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import typer

_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s")


def reflow(doc: str) -> str:
    """A docstring's paragraphs each on one line (list items on their own).

    >>> reflow("Run a node:\\n    its agent and\\n    its queries.\\n\\n    - one\\n    - two")
    'Run a node: its agent and its queries.\\n\\n- one\\n- two'
    """
    paragraphs = []
    for block in inspect.cleandoc(doc).split("\n\n"):
        lines: list[str] = []
        for line in block.splitlines():
            if lines and not _ITEM.match(line):
                lines[-1] = f"{lines[-1]} {line.strip()}"
            else:
                lines.append(line.strip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def _callbacks(app: typer.Typer) -> Iterator[Callable[..., Any]]:
    if app.registered_callback is not None and app.registered_callback.callback is not None:
        yield app.registered_callback.callback
    for command in app.registered_commands:
        if command.callback is not None:
            yield command.callback
    for group in app.registered_groups:
        if group.typer_instance is not None:
            yield from _callbacks(group.typer_instance)


def reflow_commands(app: typer.Typer) -> None:
    """Reflow the docstring of every command of ``app`` and its sub-apps, in place."""
    for callback in _callbacks(app):
        if callback.__doc__:
            callback.__doc__ = reflow(callback.__doc__)
