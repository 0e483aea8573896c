"""``spanflow rules push/list/rollback``: versioned rule sets for pattern steps."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from spanflow.cli.common import (
    DataDirOption,
    NatsOption,
    RegistryCoordinatorOption,
    RegistryTokenOption,
    app,
    console,
    run_with_store,
)

rules_app = typer.Typer(
    no_args_is_help=True,
    help="Rule sets of pattern steps: versions, applied by running queries at a batch boundary.",
)
app.add_typer(rules_app, name="rules")


def _run(url: str | None, data_dir: Path | None, work: Any) -> Any:
    from spanflow.cep.rule_store import with_store

    return run_with_store(url, data_dir, with_store, work)


def _rest(coordinator: str, token: str | None, path: str, body: Any = None) -> Any:
    """A change through the coordinators' REST API: made by the leader, in the log."""
    from spanflow.local.api import Api

    return Api(coordinator, token).call("POST", f"/api/v1/rules/{path}", body)


@rules_app.command("push")
def push(
    file: Annotated[Path, typer.Argument(help="A rule file (YAML: rules: [...]).")],
    name: Annotated[str, typer.Option("--name", help="Rule set name.")],
    note: Annotated[str, typer.Option(help="A note kept with the version.")] = "",
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    coordinator: RegistryCoordinatorOption = None,
    token: RegistryTokenOption = None,
) -> None:
    """Store FILE's rules as the next version of rule set NAME; it becomes current, and
    pattern steps reading NAME use it from their next micro-batch."""
    from spanflow.api.rules_loader import load_rules

    rules = load_rules(file)
    if coordinator:
        body = {"rules": [r.model_dump(mode="json") for r in rules], "note": note}
        number = _rest(coordinator, token, name, body)["version"]
    else:
        number = _run(nats, data_dir, lambda store: store.push(name, rules, note=note)).version
    names = ", ".join(r.name for r in rules)
    console.print(f"pushed {name} version {number} ({names}) — current")


@rules_app.command("list")
def list_rule_sets(
    name: Annotated[str | None, typer.Argument(help="One rule set's versions.")] = None,
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Rule sets, their versions and rules."""

    async def work(store: Any) -> list[Any]:
        names = [name] if name else await store.names()
        return [(await store.manifest(n))[0] for n in names]

    manifests = _run(nats, data_dir, work)
    if not manifests:
        console.print("no rule sets")
        return
    table = Table()
    for column in ("rule set", "version", "current", "rules", "pushed", "note"):
        table.add_column(column, no_wrap=column != "rules")
    for manifest in manifests:
        for v in manifest.versions:
            pushed = datetime.fromtimestamp(v.created, UTC).strftime("%Y-%m-%d %H:%M:%S")
            current = "yes" if v.version == manifest.current else ""
            rules = ", ".join(r.name for r in v.rules)
            table.add_row(manifest.name, str(v.version), current, rules, pushed, v.note)
    console.print(table)


@rules_app.command("rollback")
def rollback(
    name: Annotated[str, typer.Argument(help="Rule set name.")],
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    coordinator: RegistryCoordinatorOption = None,
    token: RegistryTokenOption = None,
) -> None:
    """Make the version before the current one current again."""
    if coordinator:
        current = _rest(coordinator, token, f"{name}/rollback")["current"]
    else:
        current = _run(nats, data_dir, lambda store: store.rollback(name)).current
    console.print(f"{name}: version {current} is current again")
