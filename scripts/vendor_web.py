"""Fetch the dashboard's JavaScript and CSS from npm into ``src/spanflow/web/static/vendor``.

The dashboard must work offline (edge sites, air-gapped clouds): nothing is loaded from
a CDN. The files are committed; run this only to change a version::

    python3 scripts/vendor_web.py

Each package is fetched with ``npm pack`` at the pinned version, its tarball checked
against the registry's integrity hash (npm does that), and only the files listed below
are kept, with the package's licence. ``VENDORED.json`` records what came from where.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "src" / "spanflow" / "web" / "static" / "vendor"

PACKAGES: dict[str, tuple[str, str, list[str]]] = {
    # directory: (npm package, version, files in the package to keep)
    "swagger-ui": (
        "swagger-ui-dist",
        "5.35.0",
        ["swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png", "LICENSE"],
    ),
    "uplot": ("uplot", "1.6.32", ["dist/uPlot.iife.min.js", "dist/uPlot.min.css", "LICENSE"]),
    "cytoscape": ("cytoscape", "3.34.4", ["dist/cytoscape.min.js", "LICENSE"]),
}


def fetch(package: str, version: str, into: Path) -> Path:
    out = subprocess.run(
        ["npm", "pack", f"{package}@{version}", "--json", "--pack-destination", str(into)],
        check=True,
        capture_output=True,
        text=True,
    )
    return into / json.loads(out.stdout)[0]["filename"]


def main() -> None:
    record: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for directory, (package, version, files) in PACKAGES.items():
            tarball = fetch(package, version, Path(tmp))
            target = VENDOR / directory
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            kept: dict[str, str] = {}
            with tarfile.open(tarball) as tar:
                for name in files:
                    member = tar.extractfile(f"package/{name}")
                    assert member is not None, f"{package}@{version} has no {name}"
                    data = member.read()
                    (target / Path(name).name).write_bytes(data)
                    kept[Path(name).name] = hashlib.sha256(data).hexdigest()
            record[directory] = {"npm": package, "version": version, "files": kept}
            print(f"{package}@{version} → {target.relative_to(ROOT)}")
    (VENDOR / "VENDORED.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
