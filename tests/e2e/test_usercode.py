"""A user's CNN package, on no path of this process (no PYTHONPATH), trains through `smlt run
--local JOB --code DIR` (on an image folder) and through `smlt start JOB --code DIR` against the
local engine's endpoint (on an NPZ of shape (N, 3, 32, 32)): the handler processes fetch, verify
and import it, and it receives the images with their shape kept."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load
from sklearn.datasets import load_digits

import smlt.runner
from smlt.cli import main
from smlt.snapshot import restore_snapshot
from tests.e2e.test_cloud_cli import deployed  # noqa: F401 - the "deployed stack" fixture

PKG = "smlt_e2e_usercnn"
CNN = """import torch
from torch import nn


class Net(nn.Module):
    # Any image size: (C, H, W) in, pooled to 4x4 before the head.
    def __init__(self, input_shape, output_dim, channels):
        super().__init__()
        c = input_shape[0]
        self.conv = nn.Sequential(nn.Conv2d(c, channels, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.head = nn.Linear(channels * 16, output_dim)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


def build(input_shape, output_dim, channels=8):
    assert len(input_shape) == 3, f"an image model, given samples of shape {input_shape}"
    return Net(input_shape, output_dim, channels)
"""


@pytest.fixture
def user_code(tmp_path):
    pkg = tmp_path / "src" / PKG
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "cnn.py").write_text(CNN)
    # An earlier test of this process may have loaded a stored package (smlt.load_model of a --code
    # model keeps its code importable, as a worker does): start from a process without any.
    from smlt.runtime import usercode

    sys.path[:] = [p for p in sys.path if "smlt-code" not in p]
    usercode._active = None
    for mod in [m for m in sys.modules if m.split(".")[0] == PKG]:
        del sys.modules[mod]
    importlib.invalidate_caches()
    assert importlib.util.find_spec(PKG) is None and str(tmp_path) not in os.environ.get("PYTHONPATH", "")
    return pkg


def _digits_uint8():
    x, y = load_digits(return_X_y=True)
    return (x * (255 / 16)).round().astype(np.uint8).reshape(-1, 8, 8), y.astype(np.int64)


def image_folder(tmp_path: Path) -> dict:
    """Digits as an image folder: one subfolder of 8x8 grayscale PNGs per class."""
    from PIL import Image

    x, y = _digits_uint8()
    for i, (img, label) in enumerate(zip(x, y)):
        (tmp_path / "images" / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(tmp_path / "images" / str(label) / f"{i:04d}.png")
    return {"uri": str(tmp_path / "images"), "image_size": 8, "channels": 1}


def npz_3x32x32(tmp_path: Path) -> dict:
    """Digits as an NPZ of shape (N, 3, 32, 32), uint8: each pixel 4x4, on three channels."""
    x, y = _digits_uint8()
    big = np.repeat(np.repeat(x, 4, axis=1), 4, axis=2)
    npz = tmp_path / "digits-3x32x32.npz"
    np.savez(npz, x=np.stack([big] * 3, axis=1), y=y)
    return {"uri": str(npz)}


def _job(tmp_path: Path, run_id: str, dataset: dict) -> Path:
    job = {
        "name": "usercnn",
        "run_id": run_id,
        "dataset": dataset,
        "model": {"name": f"{PKG}.models.cnn:build", "params": {"channels": 8}},
        "training": {"learning_rate": 0.05, "batch_size": 32, "local_steps": 30, "max_rounds": 4},
        "workers": {"initial": 2, "memory_mb": 1769},
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


def _trained_the_users_cnn(final: dict, model: bytes, channels: int) -> None:
    assert final["rounds"] == 4 and final["val_accuracy"] > 0.8, final
    state = load(model)
    assert {"conv.0.weight", "head.weight"} <= set(state), "not the user's model"
    # The images arrived with their shape: the first convolution has the data's channels.
    assert state["conv.0.weight"].shape == (8, channels, 3, 3)


def test_smlt_run_local_with_code(local, tmp_path, user_code, monkeypatch, capsys):
    engine, names = local
    # `smlt run --local` as the CLI runs it, on the session's engine instead of a new one.
    monkeypatch.setattr(smlt.runner, "start_engine", lambda faults: (engine, names, None))
    monkeypatch.setattr(engine, "stop", lambda: None)
    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                "--local",
                str(_job(tmp_path, "usercnn-local", image_folder(tmp_path))),
                "--out",
                str(out),
                "--code",
                str(user_code.parent / PKG),
            ]
        )
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    _trained_the_users_cnn(metrics["final"], (out / "model.safetensors").read_bytes(), channels=1)
    code = metrics["job"]["code"]
    assert code["uri"] == f"s3://{names.artifacts_bucket}/code/{code['sha256']}.zip"
    # The code outlives the engine in the run's saved state: `smlt resume --local` puts it back
    # into a fresh engine's bucket (here: the object deleted, as a new engine would lack it).
    s3, key = engine.client("s3"), f"code/{code['sha256']}.zip"
    s3.delete_object(Bucket=names.artifacts_bucket, Key=key)
    restore_snapshot(engine, names, "usercnn-local", out)
    zipped = s3.get_object(Bucket=names.artifacts_bucket, Key=key)["Body"].read()
    assert hashlib.sha256(zipped).hexdigest() == code["sha256"]


def test_smlt_start_with_code(deployed, tmp_path, user_code, capsys):  # noqa: F811 - the fixture
    engine, stack = deployed
    assert (
        main(
            [
                "start",
                str(_job(tmp_path, "usercnn-start", npz_3x32x32(tmp_path))),
                "--stack",
                "SmltCliTest",
                "--code",
                str(user_code),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "started run usercnn-start" in printed
    assert "code: 3 files," in printed and "stored as s3://" in printed
    sfn = engine.client("stepfunctions")
    (ex,) = [
        e
        for e in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
        if e["name"].startswith("usercnn-start")
    ]
    desc = engine.wait(ex["executionArn"], interval=0.2)
    assert desc["status"] == "SUCCEEDED", desc.get("cause")
    assert main(["fetch", "usercnn-start", "--stack", "SmltCliTest", "--out", str(tmp_path / "fetched")]) == 0
    metrics = json.loads((tmp_path / "fetched" / "metrics.json").read_text())
    _trained_the_users_cnn(metrics["final"], (tmp_path / "fetched" / "model.safetensors").read_bytes(), channels=3)
