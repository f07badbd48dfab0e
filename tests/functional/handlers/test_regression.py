"""Regression through the real handlers on moto: the rounds and the final result report RMSE and
R² in the user's units, never an accuracy, and those numbers are what the final model gives when
evaluated here, independently, on every validation row."""

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save
from safetensors.torch import load as load_tensors
from sklearn.datasets import load_diabetes

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime.data.manifest import Manifest, ShardInfo, TargetScaling
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.job import ModelSpec
from smlt.runtime.store import S3Store
from smlt.runtime.train.models import build_model

URI = "s3://smlt-data/datasets/diabetes/"
PREFIX = "datasets/diabetes/"


def _scaled_targets(store: S3Store) -> Manifest:
    """Standardise the stored targets with the train split's statistics and record them in the
    manifest, as prepare does for regression (a manifest that has them already is kept)."""
    manifest = Manifest.model_validate_json(store.get(PREFIX + "manifest.json"))
    if manifest.target is not None:
        return manifest
    arrays = {s.key: load_arrays(store.get(PREFIX + s.key)) for s in manifest.train.shards + manifest.validation.shards}
    yt = np.concatenate([arrays[s.key]["y"] for s in manifest.train.shards])
    yv = np.concatenate([arrays[s.key]["y"] for s in manifest.validation.shards])
    mean, std = yt.mean(axis=0), yt.std(axis=0)
    for split in (manifest.train, manifest.validation):
        shards = []
        for s in split.shards:
            blob = save({"x": arrays[s.key]["x"], "y": ((arrays[s.key]["y"] - mean) / std).astype(np.float32)})
            store.put(PREFIX + s.key, blob)
            shards.append(ShardInfo(key=s.key, rows=s.rows, bytes=len(blob), sha256=_sha(blob)))
        split.shards = shards
    manifest.target = TargetScaling(mean=mean.tolist(), std=std.tolist(), val_var=yv.var(axis=0).tolist())
    store.put(PREFIX + "manifest.json", manifest.model_dump_json().encode())
    return manifest


def _sha(blob: bytes) -> str:
    import hashlib

    return hashlib.sha256(blob).hexdigest()


@pytest.fixture
def diabetes(aws):
    prepare_dataset("sklearn:diabetes", URI, shards=4)
    return _scaled_targets(S3Store("smlt-data"))


def _drive(j: dict, run_id: str) -> dict:
    for _ in range(60):
        plan = planner({"op": "plan", "job": j, "execution": run_id}, None)
        if plan["action"] == "stop":
            break
        for w in plan["workers"]:
            train_step({"run_id": run_id, "round": plan["round"], "worker": w}, None)
        if aggregate({"run_id": run_id, "round": plan["round"]}, None)["stop"]:
            break
    planner({"op": "finalize", "run_id": run_id}, None)
    return json.loads(S3Store("smlt-artifacts").get(f"runs/{run_id}/final/metrics.json"))


def _independent(manifest: Manifest, run_id: str) -> tuple[float, float, int]:
    """(RMSE, R², rows) of the final model over the whole validation split, in the user's units:
    the predictions unscaled here and compared with the source's own targets."""
    data = S3Store("smlt-data")
    parts = [load_arrays(data.get(PREFIX + s.key)) for s in manifest.validation.shards]
    x, stored = np.concatenate([p["x"] for p in parts]), np.concatenate([p["y"] for p in parts])
    model = build_model(ModelSpec(), manifest.input_shape, manifest.outputs, seed=0)
    model.load_state_dict(load_tensors(S3Store("smlt-artifacts").get(f"runs/{run_id}/final/model.safetensors")))
    model.eval()
    with torch.no_grad():
        scaled = model(torch.from_numpy(x)).numpy().astype(np.float64)
    assert manifest.target is not None
    mean, std = np.asarray(manifest.target.mean), np.asarray(manifest.target.std)
    pred = scaled * std + mean
    # The user's targets, unscaled here: diabetes' are whole numbers, each one of the source's.
    y = stored.astype(np.float64) * std + mean
    assert np.allclose(y, np.round(y), atol=1e-3) and np.isin(np.round(y), load_diabetes().target).all()
    rmse = float(np.sqrt(np.mean((pred - y) ** 2)))
    r2 = float(1 - np.sum((pred - y) ** 2) / np.sum((y - y.mean()) ** 2))
    return rmse, r2, len(x)


def test_regression_reports_rmse_and_r2_of_the_final_model(diabetes, aws):
    # Default training settings: only the round count is bounded.
    j = {"name": "diabetes", "dataset": {"uri": URI}, "training": {"max_rounds": 6}, "workers": {"memory_mb": 1769}}
    m = _drive(j, "diabetes-1")
    final = m["final"]
    rmse, r2, rows = _independent(diabetes, "diabetes-1")
    assert final["task"] == "regression" and final["val_rows"] == rows == diabetes.validation.rows
    assert final["val_rmse"] == pytest.approx(rmse, rel=1e-4)
    assert final["val_r2"] == pytest.approx(r2, rel=1e-4, abs=1e-5)
    assert 0.3 < r2 < 1 and rmse < 65  # it learned: the targets' std is about 77
    assert final["val_accuracy"] is None
    assert all(r["val_accuracy"] is None and r["val_rmse"] is not None for r in m["rounds"])
    assert m["rounds"][-1]["val_rmse"] < m["rounds"][0]["val_rmse"]


def test_a_regression_target_stops_the_run(diabetes, aws):
    j = {
        "name": "diabetes",
        "dataset": {"uri": URI},
        "training": {"max_rounds": 20, "target_metric": "val_r2", "target_value": 0.3},
        "workers": {"memory_mb": 1769},
    }
    m = _drive(j, "diabetes-2")
    reached = [r for r in m["rounds"] if r["stop"]]
    assert reached and reached[0]["reason"] == "target val_r2 0.3 reached" and reached[0]["val_r2"] >= 0.3
    assert all(r["val_r2"] < 0.3 for r in m["rounds"] if not r["stop"])


def test_a_partial_split_gives_partial_rmse_and_r2_and_no_target(diabetes, aws):
    # Workers 0 and 1 evaluate the two validation shards; worker 1 crashes in round 1, so round
    # 1's metrics cover half the split: partial, and the target (R² >= 0.2, which they reach) is not declared on them.
    j = {
        "name": "diabetes",
        "dataset": {"uri": URI},
        "training": {"max_rounds": 3, "target_metric": "val_r2", "target_value": 0.2},
        "workers": {"initial": 4, "memory_mb": 1769},
    }
    for rnd in range(2):
        plan = planner({"op": "plan", "job": j, "execution": "partial"}, None)
        for w in plan["workers"]:
            if (rnd, w) != (1, 1):
                train_step({"run_id": "partial", "round": rnd, "worker": w}, None)
        aggregate({"run_id": "partial", "round": rnd}, None)
    from smlt.runtime.records import RunTable

    r0, r1 = sorted(RunTable("smlt-runs", "partial").rounds(), key=lambda r: r.round)
    assert r0.val_rmse is not None and r0.val_rows == diabetes.validation.rows and r0.val_rmse_partial is None
    assert r1.val_rmse is None and r1.val_r2 is None and r1.val_loss is None and not r1.stop
    assert r1.val_rmse_partial is not None and r1.val_r2_partial is not None and r1.val_r2_partial >= 0.2
    assert r1.val_accuracy_partial is None and 0 < r1.val_rows < diabetes.validation.rows
