"""Screenshots of the dashboard for docs/dashboard.md, from a running cluster.

    spanflow demo --duration 600 &     # prints "dashboard http://127.0.0.1:PORT/ui/"
    python3 scripts/dashboard_screenshots.py http://127.0.0.1:PORT [TOKEN]

Uses Debian's Chromium through Playwright (as the browser tests do).
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

OUT = Path(__file__).resolve().parents[1] / "docs" / "images"
PAGES = {
    "network": "#/",
    "pipelines": "#/pipelines",
    "events": "#/events",
    "models": "#/models",
}


def main(url: str, token: str | None) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/lib/chromium/chromium", args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{url}/ui/")
        if token:
            page.fill("#token", token)
            page.click("#token-form button")
        for name, route in PAGES.items():
            page.goto(f"{url}/ui/{route}")
            page.wait_for_selector("#live.on")
            page.wait_for_timeout(2500)
            page.screenshot(path=str(OUT / f"dashboard-{name}.png"))
            print(f"docs/images/dashboard-{name}.png")
        page.goto(f"{url}/ui/#/pipelines")
        page.wait_for_selector("#pipeline-table a")
        page.click("#pipeline-table a")
        page.wait_for_selector("#charts .chart canvas")
        page.wait_for_timeout(4000)
        page.screenshot(path=str(OUT / "dashboard-pipeline.png"), full_page=True)
        print("docs/images/dashboard-pipeline.png")
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
