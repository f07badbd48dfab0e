"""Metrics over the whole validation split: a failed worker's slice makes the round's metric
partial, and neither the target check nor the final metric may read a partial one. On moto,
with the real digits data; the final model is evaluated independently on every row."""

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load as load_arrays
from safetensors.torch import load as load_tensors

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime.data.manifest import Manifest
from smlt.runtime.job import parse_job
from smlt.runtime.records import RunTable
from smlt.runtime.train.models import build_model
from tests.functional.handlers.conftest import job

FAILING = 3  # the worker that crashes (its record never lands)


def _get(s3, key, bucket="smlt-artifacts"):
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def _partial_accuracy(run_id, rnd, workers):
    """The accuracy the reported workers' slices give (what the round read before the fix)."""
    recs = [r for r in RunTable("smlt-runs", run_id).workers(rnd) if r.worker in workers]
    return sum(r.val_correct for r in recs) / sum(r.val_count for r in recs)


def _drive(j, run_id, fail_when, also=None):
    """Plan → workers → aggregate until stop, then finalize. In a round where fail_when(plan,
    partial accuracy of the others, rounds failed so far) holds, worker FAILING crashes; in
    round r, worker also[r] crashes too. Answers the rounds FAILING failed in."""
    failed: list[int] = []
    for _ in range(40):
        plan = planner({"op": "plan", "job": j, "execution": run_id}, None)
        if plan["action"] == "stop":
            break
        rnd = plan["round"]
        others = [w for w in plan["workers"] if w not in (FAILING, (also or {}).get(rnd))]
        for w in others:
            train_step({"run_id": run_id, "round": rnd, "worker": w}, None)
        if fail_when(plan, _partial_accuracy(run_id, rnd, others), failed):
            failed.append(rnd)
        else:
            train_step({"run_id": run_id, "round": rnd, "worker": FAILING}, None)
        if aggregate({"run_id": run_id, "round": rnd}, None)["stop"]:
            break
    planner({"op": "finalize", "run_id": run_id}, None)
    return failed


def _evaluate(s3, uri, run_id):
    """(accuracy, rows, each class's recall) of final/model.safetensors over every validation row,
    computed here."""
    prefix = uri.removeprefix("s3://smlt-data/")
    manifest = json.loads(_get(s3, prefix + "manifest.json", "smlt-data"))
    parts = [load_arrays(_get(s3, prefix + sh["key"], "smlt-data")) for sh in manifest["validation"]["shards"]]
    x, y = np.concatenate([p["x"] for p in parts]), np.concatenate([p["y"] for p in parts])
    spec = parse_job(job(uri)).model
    model = build_model(spec, Manifest.model_validate(manifest).input_shape, manifest["outputs"], seed=0)
    model.load_state_dict(load_tensors(_get(s3, f"runs/{run_id}/final/model.safetensors")))
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(1).numpy()
    recall = [float((pred[y == c] == c).mean()) for c in range(manifest["outputs"])]
    return float((pred == y).mean()), len(y), recall


def _metrics(s3, run_id):
    return json.loads(_get(s3, f"runs/{run_id}/final/metrics.json"))


def test_a_failed_workers_slice_does_not_reach_the_target(digits, aws):
    target = 0.95
    j = job(digits, target_value=target)
    # The worker fails in the first round whose partial metric would reach the target.
    failed = _drive(j, "vs", lambda plan, acc, failed: not failed and plan["local_steps"] > 0 and acc >= target)
    assert failed, "no round's partial metric reached the target"
    metrics = _metrics(aws, "vs")
    total = RunTable("smlt-runs", "vs").meta().val_rows
    rounds = {r["round"]: r for r in metrics["rounds"]}
    hit = rounds[failed[0]]
    # Not declared on a partial split: the metric is marked partial and the round goes on.
    assert hit["stop"] is False and "target" not in hit["reason"]
    assert hit["val_accuracy"] is None and hit["val_accuracy_partial"] >= target
    assert 0 < hit["val_rows"] < hit["val_rows_total"] == total
    # Every other round evaluated every row.
    assert all(r["val_rows"] == total for n, r in rounds.items() if n not in failed)
    final = metrics["final"]
    assert final["val_rows"] == total
    acc, rows, _ = _evaluate(aws, digits, "vs")
    assert rows == total and final["val_accuracy"] == pytest.approx(acc, abs=1e-9) and acc >= target


def test_a_partial_final_evaluation_is_evaluated_again(digits, aws):
    j = job(digits, max_rounds=2, target_value=None)
    failed = _drive(j, "ve", lambda plan, acc, failed: not failed and plan["local_steps"] == 0)
    assert failed == [2]  # rounds 0, 1 train; 2 evaluates model 2 without worker 3's slice
    metrics = _metrics(aws, "ve")
    total = RunTable("smlt-runs", "ve").meta().val_rows
    partial, again = metrics["rounds"][2], metrics["rounds"][3]
    assert partial["eval_only"] and partial["stop"] is False and "evaluating again" in partial["reason"]
    assert partial["val_accuracy"] is None and partial["val_rows"] < total
    assert again["eval_only"] and again["stop"] is True and again["val_rows"] == total
    final = metrics["final"]
    assert final["rounds"] == 2 and final["val_rows"] == total and final["val_accuracy"] == again["val_accuracy"]
    acc, rows, recall = _evaluate(aws, digits, "ve")
    assert rows == total and final["val_accuracy"] == pytest.approx(acc, abs=1e-9)
    assert final["val_class_recall"] == pytest.approx(recall, abs=1e-9)  # summed per class over the workers
    assert final["val_balanced_accuracy"] == pytest.approx(np.mean(recall), abs=1e-9)
    assert partial["val_class_recall"] is None and partial["val_class_recall_partial"] is not None


def test_repeated_evaluations_combine_the_slices_of_one_model(digits, aws):
    # Worker 3 crashes in the first evaluation, worker 0 in the second: each slice was evaluated
    # once, on the same model, so the second evaluation completes the split.
    j = job(digits, max_rounds=2, target_value=None)
    failed = _drive(j, "vc", lambda plan, acc, failed: not failed and plan["local_steps"] == 0, also={3: 0})
    assert failed == [2]
    metrics = _metrics(aws, "vc")
    total = RunTable("smlt-runs", "vc").meta().val_rows
    first, second = metrics["rounds"][2], metrics["rounds"][3]
    assert first["val_accuracy"] is None and first["stop"] is False
    assert second["workers_ok"] == 3 and second["stop"] is True and second["val_rows"] == total
    assert len(metrics["rounds"]) == 4 and metrics["final"]["val_rows"] == total
    acc, _, recall = _evaluate(aws, digits, "vc")
    assert metrics["final"]["val_accuracy"] == pytest.approx(acc, abs=1e-9)
    assert metrics["final"]["val_class_recall"] == pytest.approx(recall, abs=1e-9)  # the two evaluations' slices
