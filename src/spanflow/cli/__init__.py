"""The ``spanflow`` command line."""

from spanflow.cli import (  # noqa: F401  (registers the commands)
    cluster,
    config,
    demo,
    detectors,
    local,
    models,
    node,
    plan,
    probe,
    rules,
    secrets,
    servers,
)
from spanflow.cli.common import SpanflowError, _error, app
from spanflow.cli.help_text import reflow_commands

reflow_commands(app)


def main() -> None:
    """Run a command with this host's configuration file and environment variables as
    defaults for every option (docs/configuration.md)."""
    import sys

    import typer.main

    try:
        root = typer.main.get_command(app)
        path = config.config_path()
        defaults = config.load(path, root) if path is not None else {}
        app(auto_envvar_prefix=config.ENV_PREFIX, default_map=defaults)
    except SpanflowError as exc:
        _error(exc)
        sys.exit(2)


__all__ = ["app", "main"]
