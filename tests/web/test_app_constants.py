"""Constants the dashboard's JavaScript copies from Python stay the same as their source."""

from __future__ import annotations

import json
import re
from pathlib import Path

import spanflow.web
from spanflow.protocol.metrics import LATENCY_BUCKETS

APP_JS = Path(spanflow.web.__file__).parent / "static" / "app.js"


def js_array(name: str) -> list[float]:
    """The literal array a ``const NAME = [...]`` of app.js holds."""
    found = re.search(rf"const {name} = (\[[^\]]*\]);", APP_JS.read_text())
    assert found, f"app.js has no const {name} = [...]"
    return [float(v) for v in json.loads(found.group(1))]


def test_the_dashboard_reads_histograms_with_the_buckets_they_are_counted_in() -> None:
    # a quantile read with other bounds than the counts' is silently wrong, not an error
    assert js_array("BUCKETS") == list(LATENCY_BUCKETS)
