"""docs/security.md backs its claims with tests by path: every test module it names
exists, and every module under tests/security is named there (a new attack's test is
documented, an old one's document does not point at nothing)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_security_doc_and_security_tests_name_each_other() -> None:
    doc = (ROOT / "docs" / "security.md").read_text()
    cited = set(re.findall(r"tests/[\w/]+\.py", doc))
    missing = sorted(path for path in cited if not (ROOT / path).is_file())
    assert missing == [], f"docs/security.md cites tests that do not exist: {missing}"
    here = Path(__file__).name
    ours = {
        f"tests/security/{p.name}"
        for p in (ROOT / "tests" / "security").glob("test_*.py")
        if p.name != here
    }
    unnamed = sorted(ours - cited)
    assert unnamed == [], f"docs/security.md names no claim these tests back: {unnamed}"
