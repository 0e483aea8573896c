"""``spanflow probe``: a container's health check — each role answers what it serves
(a coordinator's ``/healthz``, NATS's own ``/healthz``, a Spark master's UI), or, for a
node agent, the file its main loop renews. Exit 0 healthy, 1 not, with the reason."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from spanflow.cli.common import app, console, err

PROBE_ENV = "SPANFLOW_PROBE"
"""What ``spanflow probe`` asks with no argument: a URL, or ``file:PATH``; the image's
HEALTHCHECK relies on it (docs/deploy.md)."""


@app.command()
def probe(
    target: Annotated[
        str | None,
        typer.Argument(
            help="http(s)://… to GET (2xx is healthy), or file:PATH a loop renews; "
            f"default ${PROBE_ENV}.",
            show_default=False,
        ),
    ] = None,
    max_age: Annotated[
        float, typer.Option(help="file: the most seconds since it was renewed.")
    ] = 30.0,
    timeout: Annotated[float, typer.Option(help="http: seconds to wait for the answer.")] = 4.0,
) -> None:
    """Whether this container's role is healthy (exit 0) or not (exit 1). HTTPS trusts
    the deployment's CA when SPANFLOW_SECRETS names the secrets."""
    given = target or os.environ.get(PROBE_ENV)
    if not given:
        err.print(f"nothing to probe: give a URL or file:PATH, or set {PROBE_ENV}")
        raise typer.Exit(1)
    why_not = _file(given[5:], max_age) if given.startswith("file:") else _http(given, timeout)
    if why_not is not None:
        err.print(f"unhealthy: {why_not}")
        raise typer.Exit(1)
    console.print("healthy")


def _file(path: str, max_age: float) -> str | None:
    from spanflow.runtime.liveness import age

    seconds = age(Path(path))
    if seconds is None:
        return f"{path} does not exist (not started yet?)"
    if seconds > max_age:
        return f"{path} not renewed for {seconds:.0f} s (more than {max_age:.0f})"
    return None


def _http(url: str, timeout: float) -> str | None:
    import httpx

    from spanflow.security.https import client_context

    verify = client_context()  # the deployment's CA when SPANFLOW_SECRETS names one
    try:
        answer = httpx.get(url, timeout=timeout, verify=verify)
    except httpx.HTTPError as exc:
        return f"{url}: {exc}"
    if not 200 <= answer.status_code < 300:
        return f"{url} answered {answer.status_code}: {answer.text[:200]}"
    return None
