"""Spark's Python workers log with a time and a name, as the agent does."""

from __future__ import annotations

import re
import subprocess
import sys

WORKER = """
import logging
from spanflow.spark.jvm import worker_logs
worker_logs.ensure()
logging.getLogger("spanflow.x").info("answers again after 4.2 s")
"""

CONFIGURED = """
import logging
logging.basicConfig(level=logging.WARNING, format="OWN %(message)s")
from spanflow.spark.jvm import worker_logs
worker_logs.ensure()
logging.getLogger("spanflow.x").info("not shown")
logging.getLogger("spanflow.x").warning("shown")
"""


def _stderr(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_process_without_logging_gets_times_names_and_info_lines():
    line = _stderr(WORKER).strip()
    assert re.match(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO spanflow\.x \[spark worker\]: "
        r"answers again after 4\.2 s$",
        line,
    ), line


def test_a_process_with_its_own_logging_keeps_it():
    assert _stderr(CONFIGURED).strip() == "OWN shown"
