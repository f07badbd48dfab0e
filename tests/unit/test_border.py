"""The border between the runtime (what the Lambda layer and the train image ship: smlt/runtime/)
and the client (the rest of smlt/: CLI, runner, local engine, simulator, dashboard).

The runtime never imports the client, at module level or inside a function: a handler that did
would fail on AWS with ModuleNotFoundError, since the layer and the image hold only smlt/runtime/.
The handlers in lambdas/ import only the runtime. The client may import the runtime freely.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _smlt_imports(path: Path) -> list[tuple[int, str]]:
    """Every `smlt...` module a file imports (absolute or relative), with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            # `from smlt import x` names a module x of smlt
            names = [f"{base}.{a.name}" for a in node.names] if base in ("smlt", "smlt.runtime") else [base]
            out += [(node.lineno, n) for n in names]
    return [(line, m) for line, m in out if m.split(".")[0] == "smlt"]


def _runtime(module: str) -> bool:
    return module == "smlt" or module == "smlt.runtime" or module.startswith("smlt.runtime.")


@pytest.mark.parametrize("folder", ["smlt/runtime", "lambdas"])
def test_the_runtime_and_the_handlers_import_no_client_code(folder):
    crossings = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in sorted((REPO / folder).rglob("*.py"))
        for line, module in _smlt_imports(path)
        if not _runtime(module)
    ]
    assert not crossings, "runtime code imports the client (move it to smlt/runtime/ or out):\n" + "\n".join(crossings)


def test_the_check_sees_a_crossing(tmp_path, monkeypatch):
    bad = REPO / "smlt" / "runtime" / "_border_probe.py"
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: iter([bad]))
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "def f():\n    from smlt.runner import execute\n")
    with pytest.raises(AssertionError, match=r"_border_probe.py:2 imports smlt.runner"):
        test_the_runtime_and_the_handlers_import_no_client_code("smlt/runtime")


def test_the_top_package_imports_nothing_so_the_layer_needs_nothing_else():
    """smlt/__init__.py exposes the Python API (smlt.api) lazily: importing smlt imports no other
    module of smlt, and the file itself imports nothing at module level."""
    tree = ast.parse((REPO / "smlt" / "__init__.py").read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    code = "import sys, smlt; print(sorted(m for m in sys.modules if m.startswith('smlt')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "['smlt']"
