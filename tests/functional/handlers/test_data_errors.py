"""Data that the workers cannot learn from is named as such (issue #38): a shard whose inputs are
NaN or Inf ends the run with DataError naming the shard, not Diverged blaming the learning rate
(genuine divergence: test_failures.py); a validation shard that failed is retried by another
worker. On moto, with the real digits data, the handlers in-process."""

import hashlib
import json

import numpy as np
import pytest
from safetensors.numpy import load, save

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime.errors import DataError
from smlt.runtime.records import RunTable
from tests.functional.handlers.conftest import job

PREFIX = "datasets/digits/"


def _rewrite_shard(s3, split: str, index: int, change) -> str:
    """Change one stored shard's arrays and its manifest entry to match (sha256 and size): the
    shard is intact as stored, its content is what is wrong. Returns its key."""
    manifest = json.loads(s3.get_object(Bucket="smlt-data", Key=PREFIX + "manifest.json")["Body"].read())
    info = manifest[split]["shards"][index]
    arrays = load(s3.get_object(Bucket="smlt-data", Key=PREFIX + info["key"])["Body"].read())
    change(arrays)
    blob = save(arrays)
    s3.put_object(Bucket="smlt-data", Key=PREFIX + info["key"], Body=blob)
    info.update(sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))
    s3.put_object(Bucket="smlt-data", Key=PREFIX + "manifest.json", Body=json.dumps(manifest).encode())
    return info["key"]


def _workers(run_id, rnd, workers, failing: dict[int, type]):
    for w in workers:
        if w in failing:
            with pytest.raises(failing[w]):
                train_step({"run_id": run_id, "round": rnd, "worker": w}, None)
        else:
            train_step({"run_id": run_id, "round": rnd, "worker": w}, None)


def test_nan_inputs_end_the_run_with_a_data_error_naming_the_shard_not_diverged(digits, aws):
    def poison(arrays):
        arrays["x"][[3, 5, 8], 17] = np.nan
        arrays["x"][4, 2] = np.inf

    key = _rewrite_shard(aws, "train", 2, poison)
    p = planner({"op": "plan", "job": job(digits, target_value=None), "execution": "nan-data"}, None)
    _workers("nan-data", 0, p["workers"], {2: DataError})
    (error,) = RunTable("smlt-runs", "nan-data").errors(0).values()
    assert error.error == "DataError" and error.shard is not None and error.shard.key == key
    # Fatal at once, whatever the quorum (3 of 4 reported): the data is the cause on any worker.
    with pytest.raises(DataError) as e:
        aggregate({"run_id": "nan-data", "round": 0}, None)
    msg = str(e.value)
    assert msg.startswith(f"train shard {key} holds inputs that are not finite numbers: 4 rows of "), msg
    assert "feature 17 (3 rows)" in msg and "feature 2 (1 row)" in msg, msg
    assert "the data, not training.learning_rate, is the cause: prepare the dataset again" in msg, msg
    assert "Diverged" not in msg and "lower" not in msg


def test_a_failed_validation_shard_is_retried_on_another_worker(digits, aws):
    def bad_labels(arrays):
        arrays["y"] = np.full_like(arrays["y"], 12)  # outside digits' 10 classes

    key = _rewrite_shard(aws, "validation", 1, bad_labels)
    j = job(digits, target_value=None)
    p = planner({"op": "plan", "job": j, "execution": "val-move"}, None)
    _workers("val-move", 0, p["workers"], {1: IndexError})  # 4 validation shards: worker 1 evaluates shard 1
    a = aggregate({"run_id": "val-move", "round": 0}, None)  # 3 of 4: the quorum holds
    assert a["round"] == 0 and "retry" not in a
    planner({"op": "plan", "job": j, "execution": "val-move"}, None)
    spec = RunTable("smlt-runs", "val-move").plan(1).spec
    assert spec.val_assignments is not None and 1 not in spec.val_assignments[1]
    (moved_to,) = [w for w, held in enumerate(spec.val_assignments) if 1 in held]
    assert sorted(s for held in spec.val_assignments for s in held) == [0, 1, 2, 3]  # each evaluated once
    _workers("val-move", 1, p["workers"], {moved_to: IndexError})
    with pytest.raises(DataError) as e:
        aggregate({"run_id": "val-move", "round": 1}, None)
    assert f"validation shard {key} failed twice with IndexError" in str(e.value)
    assert f"on worker 1 in round 0 (attempt 1) and on worker {moved_to} in round 1" in str(e.value)
