"""Datasets that keep their shape: uint8 images (N, 1, 8, 8) written with safetensors and a /2
manifest, trained through the handlers with a small CNN named as this module's `build`. On moto."""

import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load, save
from torch import nn

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime import keys
from smlt.runtime.config import Settings
from smlt.runtime.errors import ModelTooLarge
from smlt.runtime.records import RunTable
from smlt.runtime.steps.events import TrainEvent
from smlt.runtime.steps.train import run_worker

URI = "s3://smlt-data/datasets/quadrants/"
MODEL = "tests.functional.handlers.test_worker_shapes:build"


class CNN(nn.Module):
    def __init__(self, channels: int, side: int, output_dim: int, width: int):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(width * (side // 2) ** 2, output_dim)

    def forward(self, x):
        if x.dtype != torch.float32 or x.ndim != 4:  # the worker gives images, normalised to float
            raise TypeError(f"expected float32 images, got {x.dtype} of shape {tuple(x.shape)}")
        return self.head(self.features(x).flatten(1))


def build(input_shape, output_dim, width=8):
    channels, side, _ = input_shape
    return CNN(channels, side, output_dim, width)


def images(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Noise with one bright quadrant: the class is which one."""
    y = rng.integers(0, 4, n)
    x = rng.integers(0, 90, (n, 1, 8, 8))
    for i, c in enumerate(y):
        r, col = divmod(int(c), 2)
        x[i, 0, 4 * r : 4 * r + 4, 4 * col : 4 * col + 4] += 150
    return x.astype(np.uint8), y.astype(np.int64)


def put_split(s3, split, x, y, shards):
    infos = []
    for i, (xs, ys) in enumerate(zip(np.array_split(x, shards), np.array_split(y, shards))):
        blob = save({"x": xs, "y": ys})
        key = f"{split}-{i:05d}.safetensors"
        s3.put_object(Bucket="smlt-data", Key="datasets/quadrants/" + key, Body=blob)
        infos.append({"key": key, "rows": len(xs), "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
    return {"rows": len(x), "shards": infos}


@pytest.fixture
def quadrants(aws):
    rng = np.random.default_rng(0)
    xt, yt = images(2000, rng)
    xv, yv = images(400, rng)
    manifest = {
        "format": "smlt-dataset/2",
        "name": "quadrants",
        "source": "test",
        "task": "classification",
        "x": {"shape": [1, 8, 8], "dtype": "uint8"},
        "y": {"shape": [], "dtype": "int64"},
        "outputs": 4,
        "train": put_split(aws, "train", xt, yt, 4),
        "validation": put_split(aws, "validation", xv, yv, 2),
        "normalization": {
            "applied": "on_load",
            "axis": "channel",
            "mean": [float(xt.mean())],
            "std": [float(xt.std())],
        },
    }
    aws.put_object(Bucket="smlt-data", Key="datasets/quadrants/manifest.json", Body=json.dumps(manifest))
    return URI


def image_job(**training):
    return {
        "name": "q",
        "dataset": {"uri": URI},
        "model": {"name": MODEL},
        "training": {"local_steps": 10, "max_rounds": 12, "target_value": 0.95, **training},
        "workers": {"initial": 4, "memory_mb": 1769},
    }


def test_images_keep_their_shape_and_train_a_cnn(quadrants, aws):
    run, j = "img", image_job()
    for _ in range(12):
        p = planner({"op": "plan", "job": j, "execution": run}, None)
        if p["action"] == "stop":
            break
        for w in p["workers"]:
            train_step({"run_id": run, "round": p["round"], "worker": w}, None)
        if aggregate({"run_id": run, "round": p["round"]}, None)["stop"]:
            break
    final = planner({"op": "finalize", "run_id": run}, None)
    assert final["val_accuracy"] >= 0.95
    records = RunTable("smlt-runs", run).workers(0)
    # Two validation shards, four workers: workers 2 and 3 have none to evaluate.
    assert [r.val_count for r in records] == [200, 200, 0, 0]
    # Measured once per process, recorded by every worker: the conv's forward and weight gradient
    # (its input needs none), the head's forward and both gradients.
    conv, head = 2 * 8 * 9 * 64, 2 * 128 * 4
    assert {r.flops_per_sample for r in records} == {2 * conv + 3 * head}
    assert all(r.activation_mb and r.activation_mb > 32 * 8 * 64 * 4 / 2**20 for r in records)
    # Round 0 read every shard from S3: the time spent waiting for them is loading, counted once.
    for r in records:
        parts = (r.load_s, r.eval_s, r.compute_s, r.upload_s)
        assert r.cache_miss and min(parts) >= 0 and sum(parts) <= r.total_s


def test_activations_too_large_for_the_tier_are_refused_before_training(quadrants, aws):
    # 300k parameters, but ~1.8 MB of activations a sample: a batch of 1024 needs ~1.8 GB.
    j = image_job(batch_size=1024)
    j["model"]["params"] = {"width": 4096}
    planner({"op": "plan", "job": j, "execution": "acts"}, None)
    with pytest.raises(ModelTooLarge, match=r"MB of it activations for a batch of 1024\), more than the 1769 MB"):
        train_step({"run_id": "acts", "round": 0, "worker": 0}, None)
    listed = aws.list_objects_v2(Bucket="smlt-artifacts", Prefix="runs/acts/").get("Contents", [])
    assert [o["Key"] for o in listed] == ["runs/acts/job.json"]  # no model, no update


def test_a_transform_is_applied_to_each_training_batch_after_model_input(quadrants, aws):
    seen = []

    def record(x):
        seen.append(x)
        return x

    def update(run, transform=None):
        planner({"op": "plan", "job": image_job(), "execution": run}, None)
        run_worker(Settings.from_env(), TrainEvent(run_id=run, round=0, worker=0), transform=transform)
        body = aws.get_object(Bucket="smlt-artifacts", Key=keys.update_key(run, 0, 0))["Body"].read()
        return load(body)

    def same(a, b):
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    plain = update("plain")
    assert same(update("recorded", record), plain)  # the same batches, in the same order
    assert len(seen) == 10 and all(x.shape == (32, 1, 8, 8) and x.dtype == torch.float32 for x in seen)
    assert abs(float(torch.cat(seen).mean())) < 0.2  # normalised on load before the transform
    assert not same(update("flipped", lambda x: torch.flip(x, dims=[3])), plain)


def test_training_augment_reaches_the_worker_and_a_retry_is_identical(quadrants, aws):
    """`training.augment` is the worker's transform when the caller gives none: it changes what
    the worker trains on, and it is seeded by (job seed, round, worker), so a retried
    invocation computes the same update."""

    def update(run, **training):
        planner({"op": "plan", "job": image_job(**training), "execution": run}, None)
        run_worker(Settings.from_env(), TrainEvent(run_id=run, round=0, worker=0))
        return load(aws.get_object(Bucket="smlt-artifacts", Key=keys.update_key(run, 0, 0))["Body"].read())

    def same(a, b):
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    plain = update("no-augment")
    flipped = update("augment-a", augment=["flip", "crop"])
    assert not same(flipped, plain)
    assert same(update("augment-b", augment=["flip", "crop"]), flipped)


def negate(x):
    """A user's per-sample transform (`code.transform`): one sample in, the same shape out."""
    assert x.shape == (1, 8, 8), x.shape
    return -x


def test_the_users_per_sample_transform_reaches_the_worker(quadrants, aws):
    def update(run, job):
        planner({"op": "plan", "job": job, "execution": run}, None)
        run_worker(Settings.from_env(), TrainEvent(run_id=run, round=0, worker=0))
        return load(aws.get_object(Bucket="smlt-artifacts", Key=keys.update_key(run, 0, 0))["Body"].read())

    def explicit(x):  # the same transform handed to the worker batch by batch
        return -x

    job = {**image_job(), "code": {"transform": f"{__name__}:negate"}}
    via_job = update("user-transform", job)
    plain = update("no-transform", image_job())
    planner({"op": "plan", "job": image_job(), "execution": "explicit"}, None)
    run_worker(Settings.from_env(), TrainEvent(run_id="explicit", round=0, worker=0), transform=explicit)
    by_hand = load(aws.get_object(Bucket="smlt-artifacts", Key=keys.update_key("explicit", 0, 0))["Body"].read())
    assert all(np.array_equal(via_job[k], by_hand[k]) for k in via_job)
    assert not all(np.array_equal(via_job[k], plain[k]) for k in via_job)
