"""Every command's help reads as paragraphs: the terminal wraps a paragraph to its own
width, so a line break the source's hard wrap left inside one would end a shown line
mid-sentence (``--help`` and the command list alike)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer.main

from spanflow.cli import app
from spanflow.cli.help_text import _ITEM


def _commands(command: Any, path: str = "spanflow") -> Iterator[tuple[str, Any]]:
    yield path, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _commands(sub, f"{path} {name}")


def test_no_help_text_breaks_a_paragraph() -> None:
    broken = []
    commands = list(_commands(typer.main.get_command(app)))
    assert len(commands) > 40  # every sub-app is walked
    for path, command in commands:
        for paragraph in (command.help or "").split("\n\n"):
            for line in paragraph.splitlines()[1:]:
                if not _ITEM.match(line):
                    broken.append(f"{path}: ...{line[:40]!r}")
    assert not broken, "\n".join(broken)
