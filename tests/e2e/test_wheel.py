"""smlt as a user installs it: the wheel `python -m build` makes (from its sdist, so the sdist is
whole too) holds the CLI, the CDK app (infra/), the Lambda sources (lambdas/) and the root files the
app reads (infra/project/); installed in a fresh venv with the local extra (the pins of
constraints.txt, from pip's cache), it runs the README's example from a folder outside the
repository: a cold synth of its own copy of the app, moto, the handler processes, real training.

The install is ~70 s here (pip --no-compile; ~120 s compiling every module), the run ~40 s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("smlt", "infra", "lambdas")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (found,) = out.glob("smlt-*.whl")
    return found


def _sources() -> set[str]:
    """Every file of the three packages in the checkout (what the wheel must hold)."""
    return {
        p.relative_to(ROOT).as_posix()
        for name in PACKAGES
        for p in (ROOT / name).rglob("*")
        if p.is_file() and p.suffix != ".pyc" and "__pycache__" not in p.parts
    }


def test_the_wheel_holds_smlt_the_cdk_app_and_the_lambda_sources(wheel):
    info = wheel.name.split("-py3")[0] + ".dist-info"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        shipped = {n: z.read(n) for n in names if n.startswith("infra/project/")}
        meta = z.read(f"{info}/METADATA").decode()
    assert _sources() - names == set()
    # the root files the CDK app reads, as they are in the checkout
    assert {n.removeprefix("infra/project/"): data for n, data in shipped.items()} == {
        rel: (ROOT / rel).read_bytes() for rel in ("cdk.json", ".dockerignore", "layers/requirements.txt")
    }
    assert {n.split("/")[0] for n in names} == {*PACKAGES, info}  # nothing else at the top of site-packages
    assert "Requires-Dist: torch<2.14,>=2.13" in meta
    for extra in ("local", "deploy", "dashboard", "tracking", "onnx"):
        assert f"Provides-Extra: {extra}" in meta


@pytest.mark.timeout(1200)
def test_a_fresh_venv_runs_the_readme_example_from_the_wheel(wheel, tmp_path, record_property, request):
    venv = tmp_path / "venv"  # ~2 GB (torch): removed at the end, not kept with pytest's last tmp folders
    request.addfinalizer(lambda: shutil.rmtree(venv, ignore_errors=True))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SMLT_SYNTH_CACHE")}
    env |= {"SMLT_HOME": str(tmp_path / "home"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    t0 = time.perf_counter()
    pip = subprocess.run(
        [venv / "bin" / "pip", "install", "-q", "--no-compile", f"{wheel}[local]", "-c", ROOT / "constraints.txt"],
        capture_output=True,
        text=True,
        env=env,
    )
    record_property("install_s", round(time.perf_counter() - t0, 1))
    assert pip.returncode == 0, pip.stderr[-3000:]

    user = tmp_path / "user"  # outside the repository: nothing of the checkout is on the path
    user.mkdir()
    shutil.copy(ROOT / "examples" / "digits.json", user)
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import smlt, infra, lambdas; print(smlt.__file__, infra.__file__)"],
        cwd=user,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert all(Path(p).is_relative_to(venv) for p in where.split()), where

    t0 = time.perf_counter()
    run = subprocess.run(
        [venv / "bin" / "smlt", "run", "--local", "digits.json", "--out", "out"],
        cwd=user,
        capture_output=True,
        text=True,
        env=env,
    )
    record_property("run_s", round(time.perf_counter() - t0, 1))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "done: run digits-" in run.stdout and "outputs in out/" in run.stdout
    assert "synth cached" not in run.stdout  # its own, cold synth of the installed app
    final = json.loads((user / "out" / "metrics.json").read_text())["final"]
    job = json.loads((ROOT / "examples" / "digits.json").read_text())["training"]
    assert final["val_accuracy"] >= job["target_value"], final
    assert (user / "out" / "model.safetensors").stat().st_size > 0
    # the app was synthesized from the copy of the installed files smlt made (smlt.project)
    (project,) = (tmp_path / "home" / "project").iterdir()
    assert (project / "cdk.json").read_bytes() == (ROOT / "cdk.json").read_bytes()
    assert (project / ".dockerignore").is_file() and (project / "lambdas" / "train_step" / "Dockerfile").is_file()
