"""A user's code that imports what the train_step image does not have (a package installed only on
the laptop) is named before anything is stored: `smlt start` refuses it, `smlt run --local` warns,
and only the files the entry points import are read."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from smlt.code_imports import describe, foreign_imports
from smlt.runtime.usercode import package_code

NET = """\
import math
import torch
from torch import nn
from .layers import conv
try:
    import apex  # optional: a faster kernel when present
except ImportError:
    apex = None
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import lightning

def build(input_shape, output_dim):
    import einops  # imported when the worker builds the model
    return nn.Linear(math.prod(input_shape), output_dim)
"""


def _package(root: Path) -> Path:
    pkg = root / "mymodels"
    (pkg / "layers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import numpy\n")
    (pkg / "net.py").write_text(NET)
    (pkg / "layers" / "__init__.py").write_text("")
    (pkg / "layers" / "conv.py").write_text("from timm.layers import DropPath\nfrom ..util import helper\n")
    (pkg / "util.py").write_text("import sklearn.metrics\ndef helper(): ...\n")
    (pkg / "plot.py").write_text("import matplotlib.pyplot as plt\n")  # a script the model never imports
    (pkg / "broken.py").write_text("def (:\n")
    return pkg


def test_the_entry_points_imports_the_image_lacks_are_named_with_file_and_line(tmp_path):
    found = foreign_imports(package_code(_package(tmp_path)).data, ["mymodels.net:build"])
    assert [str(f) for f in found] == [
        "mymodels/layers/conv.py, line 1: import 'timm.layers'",
        "mymodels/net.py, line 14: import 'einops'",
        "mymodels/util.py, line 1: import 'sklearn.metrics'",
    ]
    message = describe(found, shown=2)
    assert message.startswith("mymodels/layers/conv.py, line 1: import 'timm.layers'; mymodels/net.py, line 14")
    assert "; and 1 more: the train_step image has no 'einops', 'sklearn', 'timm'" in message
    assert "copy a pure-Python package into the code folder beside your own" in message


def test_a_package_copied_beside_the_users_own_is_available(tmp_path):
    folder = tmp_path / "code"
    pkg = _package(folder)
    (pkg / "layers" / "conv.py").write_text("")
    (pkg / "util.py").write_text("")
    for vendored in ("einops", "timm"):  # pure Python copied in: the zip holds them at its top
        (folder / vendored).mkdir()
        (folder / vendored / "__init__.py").write_text("import torch\n")
    assert foreign_imports(package_code(folder).data, ["mymodels.net:build"]) == []


def test_only_the_files_the_entry_points_import_are_read(tmp_path):
    data = package_code(_package(tmp_path)).data
    assert [str(f) for f in foreign_imports(data, ["mymodels.util:helper"])] == [
        "mymodels/util.py, line 1: import 'sklearn.metrics'"
    ]
    assert foreign_imports(data, []) == []  # a built-in model with a --code transform-less job


def _job_with_code(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A job on a small local CSV whose model imports `einops`, installed here (a stand-in module
    on the path, as the laptop's own environment would have it), not in the image."""
    rows = [f"{i % 7},{(i * 3) % 5},{i % 2}" for i in range(60)]
    (tmp_path / "d.csv").write_text("a,b,label\n" + "\n".join(rows) + "\n")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"dataset": {"uri": "d.csv"}, "model": {"name": "mymodels.net:build"}}))
    pkg = tmp_path / "src" / "mymodels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(
        "import einops\nfrom torch import nn\ndef build(input_shape, output_dim):\n"
        "    return nn.Linear(input_shape[0], output_dim)\n"
    )
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "einops.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return job, pkg


def test_smlt_start_refuses_code_that_imports_what_the_image_lacks_before_any_stack(tmp_path, capsys, monkeypatch):
    from smlt.cli import main

    job, pkg = _job_with_code(tmp_path, monkeypatch)
    monkeypatch.setattr("smlt.cloud.Stack.lookup", lambda name: pytest.fail("stack looked up"))
    try:
        assert main(["start", str(job), "--code", str(pkg), "--stack", "Smlt"]) == 2
    finally:
        for m in [m for m in sys.modules if m.split(".")[0] in ("mymodels", "einops")]:
            del sys.modules[m]
    err = capsys.readouterr().err
    assert "InvalidCode: code: mymodels/net.py, line 1: import 'einops': the train_step image has no 'einops'" in err


def test_smlt_run_local_warns_that_the_deployed_stack_would_fail(tmp_path, caplog, monkeypatch):
    from smlt.cli import main

    job, pkg = _job_with_code(tmp_path, monkeypatch)
    monkeypatch.setattr("smlt.runner.start_engine", lambda faults: pytest.fail("engine started"))
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(pytest.fail.Exception, match="engine started"):
            main(["run", "--local", str(job), "--code", str(pkg), "--out", str(tmp_path / "out")])
    finally:
        for m in [m for m in sys.modules if m.split(".")[0] in ("mymodels", "einops")]:
            del sys.modules[m]
    assert "code runs here but not on the deployed stack: mymodels/net.py, line 1: import 'einops'" in caplog.text
