"""The layer's local bundling: hash inputs, failure message, and (opt-in) a real build."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.stacks import bundling

REPO = Path(__file__).resolve().parents[2]


def _fake_repo(tmp_path: Path) -> Path:
    (tmp_path / "layers").mkdir(parents=True)
    (tmp_path / "layers" / "requirements.txt").write_text("numpy==2.4.6\n")
    (tmp_path / "smlt").mkdir()
    (tmp_path / "smlt" / "__init__.py").write_text("")
    (tmp_path / "smlt" / "runtime").mkdir()
    (tmp_path / "smlt" / "runtime" / "job.py").write_text("X = 1\n")
    return tmp_path


def test_fingerprint_tracks_requirements_sources_and_platform(tmp_path):
    repo = _fake_repo(tmp_path)
    base = bundling.layer_fingerprint(repo, "x86_64", "3.12")
    assert bundling.layer_fingerprint(repo, "x86_64", "3.12") == base
    assert bundling.layer_fingerprint(repo, "arm64", "3.12") != base
    assert bundling.layer_fingerprint(repo, "x86_64", "3.13") != base
    (repo / "smlt" / "__pycache__").mkdir()
    (repo / "smlt" / "__pycache__" / "job.cpython-311.pyc").write_bytes(b"\0")
    assert bundling.layer_fingerprint(repo, "x86_64", "3.12") == base, "bytecode is not an input"
    (repo / "smlt" / "runtime" / "job.py").write_text("X = 2\n")
    changed = bundling.layer_fingerprint(repo, "x86_64", "3.12")
    assert changed != base
    (repo / "layers" / "requirements.txt").write_text("numpy==2.4.5\n")
    assert bundling.layer_fingerprint(repo, "x86_64", "3.12") != changed


def test_layer_requirements_pinned_and_without_torch():
    lines = [
        line.split("#")[0].strip()
        for line in (REPO / "layers" / "requirements.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    names = {line.split("==")[0].lower() for line in lines}
    assert all("==" in line for line in lines), lines
    assert {"numpy", "safetensors", "pydantic", "aws-lambda-powertools", "dynamodb-json"} <= names
    assert "torch" not in names
    # same pins as constraints.txt (what smlt is installed with)
    pins = (REPO / "constraints.txt").read_text().splitlines()
    for line in lines:
        assert line in pins, f"{line} differs from constraints.txt"


def test_failed_pip_raises_with_a_way_out(tmp_path, monkeypatch):
    repo = _fake_repo(tmp_path / "repo")

    def fake_run(cmd, **kwargs):
        assert "--only-binary=:all:" in cmd and "--platform" in cmd
        assert cmd[cmd.index("--python-version") + 1] == "3.12"
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="no index\n")

    monkeypatch.setattr(bundling.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="smlt:bundle=false"):
        bundling.LocalLayerBundling(repo, "x86_64", "3.12").try_bundle(str(tmp_path / "out"))


def test_bundler_copies_smlt_and_prunes(tmp_path, monkeypatch):
    repo = _fake_repo(tmp_path / "repo")
    (repo / "smlt" / "__pycache__").mkdir()
    (repo / "smlt" / "__pycache__" / "x.pyc").write_bytes(b"\0")

    def fake_run(cmd, **kwargs):
        site = Path(cmd[cmd.index("--target") + 1])
        (site / "numpy").mkdir(parents=True)
        (site / "bin").mkdir()
        (site / "tests").mkdir()
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")

    monkeypatch.setattr(bundling.subprocess, "run", fake_run)
    out = tmp_path / "out"
    assert bundling.LocalLayerBundling(repo, "arm64", "3.12").try_bundle(str(out)) is True
    site = out / "python"
    assert (site / "smlt" / "runtime" / "job.py").exists() and (site / "numpy").is_dir()
    assert not (site / "bin").exists() and not (site / "tests").exists()
    assert not list(site.rglob("__pycache__"))


def _fake_pip(cmd, **kwargs):
    Path(cmd[cmd.index("--target") + 1]).mkdir(parents=True, exist_ok=True)
    return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")


def test_layer_holds_exactly_the_runtime_and_still_serves_the_handlers(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(bundling.subprocess, "run", _fake_pip)
        bundling.build_layer(tmp_path, REPO, "x86_64", "3.12")
    pkg = tmp_path / "python" / "smlt"
    shipped = sorted(str(f.relative_to(pkg.parent)) for f in pkg.rglob("*") if f.is_file())
    runtime = sorted(
        str(f.relative_to(REPO))
        for f in [REPO / "smlt" / "__init__.py", *(REPO / "smlt" / "runtime").rglob("*")]
        if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
    )
    assert shipped == runtime, "the layer's smlt/ is not exactly smlt/__init__.py and smlt/runtime/"
    assert not (pkg / "runtime" / "store" / "redis.py").read_text().count("class LocalRedisServer")
    # The zip handlers import with the layer's smlt (the installed dependencies stand in for the
    # layer's wheels); every smlt module they load must come from the layer (an editable install
    # of smlt would otherwise supply what the layer lacks).
    for handler in ("planner", "aggregate"):
        code = (
            "import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('handler', {str(REPO / 'lambdas' / handler / 'handler.py')!r})\n"
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "print(sorted(f'{n}={m.__file__}' for n, m in sys.modules.items() if n.split('.')[0] == 'smlt'))\n"
        )
        env = {**os.environ, "PYTHONPATH": str(tmp_path / "python")}
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        loaded = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
        assert any(m.startswith("smlt.runtime.steps.") for m in loaded), loaded
        outside = [m for m in loaded if not m.split("=", 1)[1].startswith(str(pkg))]
        assert not outside, f"{handler} needs modules the layer leaves out: {outside}"


def test_fingerprint_ignores_client_code(tmp_path):
    repo = _fake_repo(tmp_path)
    base = bundling.layer_fingerprint(repo, "x86_64", "3.12")
    (repo / "smlt" / "local").mkdir()
    (repo / "smlt" / "local" / "engine.py").write_text("X = 1\n")
    (repo / "smlt" / "runner.py").write_text("X = 1\n")
    assert bundling.layer_fingerprint(repo, "x86_64", "3.12") == base


@pytest.mark.skipif(
    os.environ.get("SMLT_TEST_LAYER_BUILD") != "1", reason="set SMLT_TEST_LAYER_BUILD=1 (pip downloads ~60 MB)"
)
def test_real_layer_build(tmp_path):
    bundling.build_layer(tmp_path, REPO, "x86_64", "3.12")
    site = tmp_path / "python"
    for pkg in ("numpy", "safetensors", "pydantic", "pydantic_core", "aws_lambda_powertools", "dynamodb_json", "smlt"):
        assert (site / pkg).is_dir(), pkg
    assert not (site / "torch").exists()
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    assert size < 200 * 2**20, f"layer is {size / 2**20:.0f} MB unzipped (limit 250 MB with the code)"
    shutil.rmtree(site)
