"""Unit tests import no moto: neither the modules they test nor the tests themselves, at import
time (checked here, in a fresh interpreter) or while they run (the root conftest fails a unit test
that imports it). moto is the emulator's business: tests/functional and tests/engine patch it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import importlib, json, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
names = ["tests.conftest"] + [
    ".".join(p.relative_to({repo!r}).with_suffix("").parts).removesuffix(".__init__")
    for p in sorted(Path({repo!r}, "tests", "unit").rglob("*.py"))
]
for name in names:
    importlib.import_module(name)
print(json.dumps({{"modules": len(names), "moto": sorted(m for m in sys.modules if m == "moto" or m.startswith("moto."))}}))
"""


def test_unit_test_modules_and_what_they_import_load_no_moto():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(repo=str(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["modules"] > 40  # every unit test module was imported
    assert found["moto"] == [], f"importing tests/unit loads moto: {found['moto'][:5]}"
