"""Logging in Spark's Python workers, formatted as the agent's own.

A Python data source's offsets and reads run in Python worker processes that Spark
starts, whose stderr goes to the agent's log but whose logging nobody configured:
Python's last-resort handler then prints warnings without a time or a name and drops
everything below. A stall in the output is timed by those lines (a stream that did
not answer, then answered again), so the workers log like the agent does.
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s [spark worker]: %(message)s"


def ensure() -> None:
    """Give a process without any logging set up the agent's format at INFO.

    A no-op where logging is configured already (the agent, a test run), so it is safe
    on the driver too."""
    root = logging.getLogger()
    if root.handlers:
        return
    logging.basicConfig(level=logging.INFO, format=FORMAT)
    for noisy in ("py4j", "nats"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
