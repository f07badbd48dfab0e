"""The docs name every module: docs/architecture.md's layout table lists each file under smlt/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_table() -> str:
    text = (ROOT / "docs/architecture.md").read_text()
    start = text.index("## Code layout")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_every_module_under_smlt_is_in_the_layout_table():
    table = layout_table()
    named = set(re.findall(r"`(smlt/[\w/]+\.py)`", table))
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "smlt").rglob("*.py") if p.name != "__init__.py"}
    missing = sorted(modules - named)
    assert not missing, f"docs/architecture.md's layout table does not name: {', '.join(missing)}"
    gone = sorted(named - modules)
    assert not gone, f"docs/architecture.md's layout table names modules that do not exist: {', '.join(gone)}"
