"""The ``spanflow`` command line."""

from spanflow.cli import cluster, demo, local, models, plan, rules, secrets, servers  # noqa: F401
from spanflow.cli.common import SpanflowError, _error, app


def main() -> None:
    import sys

    try:
        app()
    except SpanflowError as exc:
        _error(exc)
        sys.exit(2)


__all__ = ["app", "main"]
