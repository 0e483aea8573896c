"""``spanflow rules push/list/rollback``: versioned rule sets for pattern steps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from spanflow.cli.catalog import Catalog, pushed_at
from spanflow.cli.common import (
    DataDirOption,
    NatsOption,
    RegistryCoordinatorOption,
    RegistryTokenOption,
    app,
    console,
)

rules_app = typer.Typer(
    no_args_is_help=True,
    help="Rule sets of pattern steps: versions, applied by running queries at a batch boundary.",
)
app.add_typer(rules_app, name="rules")


def _manifest(found: dict[str, Any]) -> Any:
    from spanflow.cep.rules import RuleSetManifest

    return RuleSetManifest.model_validate(found)


RULES = Catalog("rules", "spanflow.cep.rule_store", _manifest)


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
        number = RULES.rest(coordinator, token, "POST", name, body=body)["version"]
    else:
        number = RULES.run(nats, data_dir, lambda store: store.push(name, rules, note=note)).version
    names = ", ".join(r.name for r in rules)
    console.print(f"pushed {name} version {number} ({names}) — current")


@rules_app.command("list")
def list_rule_sets(
    name: Annotated[str | None, typer.Argument(help="One rule set's versions.")] = None,
    nats: NatsOption = None,
    data_dir: DataDirOption = None,
    coordinator: RegistryCoordinatorOption = None,
    token: RegistryTokenOption = None,
) -> None:
    """Rule sets, their versions and rules."""
    manifests = RULES.manifests(name, nats, data_dir, coordinator, token)
    if not manifests:
        console.print("no rule sets")
        return
    table = Table()
    for column in ("rule set", "version", "current", "rules", "pushed", "note"):
        table.add_column(column, no_wrap=column != "rules")
    for manifest in manifests:
        for v in manifest.versions:
            current = "yes" if v.version == manifest.current else ""
            rules = ", ".join(r.name for r in v.rules)
            table.add_row(
                manifest.name, str(v.version), current, rules, pushed_at(v.created), v.note
            )
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
        current = RULES.rest(coordinator, token, "POST", f"{name}/rollback")["current"]
    else:
        current = RULES.run(nats, data_dir, lambda store: store.rollback(name)).current
    console.print(f"{name}: version {current} is current again")
