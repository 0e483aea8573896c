"""``spanflow detector rebaseline``: an operator accepts a key's behaviour as normal."""

from __future__ import annotations

from typing import Annotated

import typer

from spanflow.cli.cluster import DEFAULT_URL, Api, CoordinatorOption, TokenOption
from spanflow.cli.common import app, console

detector_app = typer.Typer(
    no_args_is_help=True,
    help="Anomaly detectors of running pipelines (detect_anomalies steps).",
)
app.add_typer(detector_app, name="detector")


@detector_app.command("rebaseline")
def rebaseline(
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    key: Annotated[
        str | None,
        typer.Argument(
            help="The key whose current behaviour is normal (a compound key's values joined "
            "by commas: site-1,pump-3).",
            show_default=False,
        ),
    ] = None,
    every_key: Annotated[
        bool, typer.Option("--every-key", help="Rebaseline every key of the step.")
    ] = False,
    step: Annotated[
        str | None,
        typer.Option(
            "--step", help="The detect_anomalies step (default: the pipeline's only one)."
        ),
    ] = None,
    coordinator_url: CoordinatorOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Accept KEY's current behaviour as normal: from the next micro-batch the detector
    forgets what it learnt of KEY and learns it afresh (its warm-up first), and an open
    anomaly episode of KEY ends. Written to the control log."""
    from spanflow.cli.common import SpanflowError
    from spanflow.ml.rebaseline import EVERY_KEY
    from spanflow.protocol.rest import RebaselineBody

    if (key is None) == (not every_key):
        raise SpanflowError("give a KEY or --every-key (not both)")
    body = RebaselineBody(step=step, key=EVERY_KEY if every_key else key)
    done = Api(coordinator_url, token).typed(lambda c: c.rebaseline(pipeline, body))
    which = "every key" if done.key == EVERY_KEY else f"key {done.key}"
    console.print(
        f"{done.pipeline}/{done.step}: {which} rebaselined (generation {done.generation}); "
        "it learns afresh from its next readings"
    )
