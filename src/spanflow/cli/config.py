"""One configuration file per host: every option of every command has a key there and
an environment variable.

The file (``SPANFLOW_CONFIG``, else ``./spanflow.yaml``) has one section per command,
keys named as the options are (``gossip-bind`` or ``gossip_bind``); sub-commands nest
(``secrets: {init: {host: [...]}}``). A command line option beats the environment,
which beats the file, which beats the built-in default. The environment variable of an
option is ``SPANFLOW_<COMMAND>_<OPTION>`` (``SPANFLOW_NODE_GOSSIP_BIND``) unless it has a
shorter one of its own (``SPANFLOW_TOKEN``, ``SPANFLOW_COORDINATOR``). ``spanflow
config`` lists them all with their defaults (docs/configuration.md is its output).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import typer.main
import yaml

from spanflow.cli.common import app, console
from spanflow.errors import SpanflowError

ENV_PREFIX = "SPANFLOW"
CONFIG_ENV = "SPANFLOW_CONFIG"
DEFAULT_FILE = "spanflow.yaml"


def config_path() -> Path | None:
    given = os.environ.get(CONFIG_ENV)
    if given:
        return Path(given)
    local = Path(DEFAULT_FILE)
    return local if local.exists() else None


def _is_group(command: Any) -> bool:
    return hasattr(command, "commands")


def _is_option(param: Any) -> bool:
    return bool(param.param_type_name == "option" and param.name)


def _options(command: Any) -> dict[str, Any]:
    """Every way a file may name an option of ``command`` → the option. (Typer bundles
    its own click: commands and options are duck-typed here.)"""
    out: dict[str, Any] = {}
    for param in command.params:
        if not _is_option(param):
            continue
        out[param.name] = param
        for flag in param.opts:
            name = flag.lstrip("-")
            out[name] = out[name.replace("-", "_")] = param
    return out


def default_map(raw: Any, command: Any, where: str) -> dict[str, Any]:
    """The file's section for ``command`` as click's ``default_map`` (parameter names),
    with a clear error for a key no option has."""
    if not isinstance(raw, dict):
        raise SpanflowError(f"{where}: expected a mapping of options, got {type(raw).__name__}")
    out: dict[str, Any] = {}
    if _is_group(command):
        for key, value in raw.items():
            sub = command.commands.get(str(key))
            if sub is None:
                raise SpanflowError(_unknown(where, str(key), list(command.commands), "command"))
            out[str(key)] = default_map(value, sub, f"{where}.{key}")
        return out
    options = _options(command)
    for key, value in raw.items():
        option = options.get(str(key))
        if option is None:
            names = sorted({o.lstrip("-") for p in set(options.values()) for o in p.opts})
            raise SpanflowError(_unknown(where, str(key), names, "option"))
        assert option.name is not None
        out[option.name] = value
    return out


def _unknown(where: str, key: str, known: list[str], what: str) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}.{key}: no such {what}{hint}"


def load(path: Path, root: Any) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SpanflowError(f"configuration {path}: {exc}") from None
    return default_map(raw, root, str(path))


def keys(root: Any) -> list[tuple[str, str, str, str]]:
    """(file key, environment variable, default, help) of every option, command by
    command, as ``spanflow config`` prints them."""
    rows: list[tuple[str, str, str, str]] = []

    def walk(command: Any, path: list[str]) -> None:
        if _is_group(command):
            for name in sorted(command.commands):
                walk(command.commands[name], [*path, name])
            return
        for param in command.params:
            if not _is_option(param) or param.hidden:
                continue
            if param.name == "help":
                continue
            flag = max(param.opts, key=len).lstrip("-")
            env = param.envvar if isinstance(param.envvar, str) else None
            env = env or "_".join([ENV_PREFIX, *path, param.name]).upper().replace("-", "_")
            default = param.default
            shown = "" if default is None or callable(default) else str(default)
            rows.append((".".join([*path, flag]), env, shown, (param.help or "").split("\n")[0]))

    walk(root, [])
    return rows


def table(root: Any) -> str:
    lines = ["| key | environment | default | what |", "|---|---|---|---|"]
    for key, env, default, text in keys(root):
        cell = text.replace("|", "\\|")
        lines.append(f"| `{key}` | `{env}` | {('`' + default + '`') if default else ''} | {cell} |")
    return "\n".join(lines) + "\n"


@app.command("config")
def show_config() -> None:
    """Every configuration key (file and environment) with its default, and the file
    in use."""
    root = typer.main.get_command(app)
    path = config_path()
    console.print(
        f"configuration file: {path or f'none (set {CONFIG_ENV} or create ./{DEFAULT_FILE})'}"
    )
    if path is not None:
        load(path, root)
        console.print("  valid")
    console.print(table(root), markup=False, highlight=False)
