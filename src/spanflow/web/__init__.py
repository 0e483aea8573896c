"""The dashboard's assets: HTML, JavaScript and CSS, with their libraries vendored from
npm under ``static/vendor`` (``scripts/vendor_web.py``), so it works offline."""

from pathlib import Path

STATIC = Path(__file__).parent / "static"
"""Served by the coordinator under ``/ui`` (``spanflow.server.routes.dashboard``)."""
