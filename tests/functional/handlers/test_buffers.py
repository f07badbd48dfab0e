"""Batch-norm buffers through the real train and aggregate handlers on moto: model r+1's running
statistics are the sample-weighted average of the workers' final states and its integer counters
(`num_batches_tracked`) move, with the single aggregator and with sharded slices."""

import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save
from torch import nn

import smlt.runtime.steps.train as train_module
from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime import keys
from smlt.runtime.data.manifest import FORMAT
from smlt.runtime.model_store import read_model
from smlt.runtime.store import S3Store
from smlt.runtime.tensors.format import views
from smlt.runtime.tensors.layout import read_layout

ART = "smlt-artifacts"
URI = "s3://smlt-data/datasets/bn/"
# One sample as the shards store it. The worker reads shards as flat rows until the streaming
# loader lands (then this becomes IMAGE); the model below sees a 1x8x8 image either way.
SAMPLE_SHAPE = (1, 8, 8)
IMAGE = (1, 8, 8)


def bn_cnn(input_shape, output_dim):
    """A small CNN with two batch norms: one with momentum, one with a cumulative average (which
    reads num_batches_tracked, so a frozen counter would change what it learns)."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Unflatten(1, IMAGE),
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.BatchNorm2d(4, momentum=None),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 64, output_dim),
    )


def _write_split(s3, name, x, y, shards):
    infos = []
    for i, (xs, ys) in enumerate(zip(np.array_split(x, shards), np.array_split(y, shards))):
        blob = save({"x": np.ascontiguousarray(xs.reshape(len(xs), *SAMPLE_SHAPE)), "y": ys})
        key = f"{name}/{i:05d}.safetensors"
        s3.put_object(Bucket="smlt-data", Key=f"datasets/bn/{key}", Body=blob)
        infos.append({"key": key, "rows": len(xs), "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
    return {"rows": len(x), "shards": infos}


@pytest.fixture
def images(aws):
    """A learnable image-shaped dataset (class = the brightest quadrant), written with safetensors."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, *IMAGE)).astype(np.float32)
    y = rng.integers(0, 4, 512)
    for i, label in enumerate(y):
        r, c = divmod(int(label), 2)
        x[i, 0, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] += 1.5
    manifest = {
        "format": FORMAT,
        "name": "bn",
        "source": "test",
        "task": "classification",
        "x": {"shape": list(SAMPLE_SHAPE), "dtype": "float32"},
        "y": {"shape": [], "dtype": "int64"},
        "outputs": 4,
        "train": _write_split(aws, "train", x[:384], y[:384], 3),
        "validation": _write_split(aws, "validation", x[384:], y[384:], 1),
        "normalization": {"applied": "stored"},
    }
    aws.put_object(Bucket="smlt-data", Key="datasets/bn/manifest.json", Body=json.dumps(manifest).encode())
    return URI


@pytest.fixture
def final_states(monkeypatch):
    """Every worker's model state at the end of its round, as the worker computed it (captured
    where it builds its update), keyed by (round, worker) in call order."""
    seen = []
    real = train_module.update_delta

    def capture(new_state, global_state):
        seen.append({k: v.detach().clone() for k, v in new_state.items()})
        return real(new_state, global_state)

    monkeypatch.setattr(train_module, "update_delta", capture)
    return seen


def _expected(states, samples):
    """Model r+1 from the workers' states, computed independently in torch: float tensors the
    sample-weighted average (float64), integer tensors that average rounded."""
    w = torch.tensor(samples, dtype=torch.float64)
    out = {}
    for name, first in states[0].items():
        stacked = torch.stack([s[name].to(torch.float64) for s in states])
        mean = (stacked * w.reshape(-1, *[1] * first.dim())).sum(0) / w.sum()
        out[name] = mean.round().to(first.dtype) if not first.is_floating_point() else mean
    return out


def _round(j, run, final_states, samples_of):
    p = planner({"op": "plan", "job": j, "execution": run}, None)
    start = len(final_states)
    for w in p["workers"]:
        train_step({"run_id": run, "round": p["round"], "worker": w}, None)
    states = final_states[start:]
    samples = [samples_of(p["round"], w) for w in p["workers"]]
    ev = {"run_id": run, "round": p["round"]}
    if p.get("aggregators", 1) > 1:
        assert aggregate({**ev, "op": "prepare"}, None)["proceed"]
        for s in p["slices"]:
            aggregate({**ev, "op": "slice", "slice": s, "of": p["aggregators"]}, None)
        aggregate({**ev, "op": "finish"}, None)
    else:
        aggregate({**ev, "outcomes": []}, None)
    return p, states, samples


@pytest.mark.parametrize("sharded", [False, True])
def test_batch_norm_buffers_are_the_average_of_the_workers_states(images, aws, monkeypatch, final_states, sharded):
    run = f"bn-{'sharded' if sharded else 'single'}"
    if sharded:  # round 0 is always aggregated by one (its size is unknown), later rounds by slices
        monkeypatch.setenv("SMLT_AGGREGATOR_READ_BYTES", "1")
        monkeypatch.setenv("SMLT_MIN_SLICE_BYTES", "512")
    j = {
        "name": "bn",
        "run_id": run,
        "dataset": {"uri": images},
        "model": {"name": "tests.functional.handlers.test_buffers:bn_cnn"},
        "training": {"local_steps": 5, "batch_size": 16, "max_rounds": 3, "learning_rate": 0.05},
        "workers": {"initial": 3, "memory_mb": 1769},
    }
    store = S3Store(ART)

    def samples_of(rnd, w):
        return int(views(store.get(keys.update_key(run, rnd, w)))[1]["samples"])

    aggregators = []
    for rnd in range(2):
        p, states, samples = _round(j, run, final_states, samples_of)
        aggregators.append(p.get("aggregators", 1))
        assert p["round"] == rnd and len(states) == 3
        got = read_model(store, run, rnd + 1)
        want = _expected(states, samples)
        assert got.keys() == want.keys()
        for name, v in want.items():
            if name.endswith("num_batches_tracked"):
                assert got[name].dtype == np.int64 and int(got[name]) == int(v)
            else:
                np.testing.assert_allclose(got[name], v.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
        # every worker stepped 5 times from the same model: the counters advance by 5 a round
        assert int(got["3.num_batches_tracked"]) == int(got["6.num_batches_tracked"]) == 5 * (rnd + 1)
        assert not np.allclose(got["3.running_var"], 1.0)  # the running statistics did move
    assert (max(aggregators) > 1) == sharded


def test_compressed_updates_keep_integer_buffers_exact(images, aws, final_states):
    run = "bn-fp16"
    j = {
        "name": "bn",
        "run_id": run,
        "dataset": {"uri": images},
        "model": {"name": "tests.functional.handlers.test_buffers:bn_cnn"},
        "training": {"local_steps": 7, "batch_size": 16, "max_rounds": 2, "compression": "fp16"},
        "workers": {"initial": 2, "memory_mb": 1769},
    }
    store = S3Store(ART)
    _round(j, run, final_states, lambda rnd, w: 1)
    layout = read_layout(store, keys.update_key(run, 0, 0))
    assert {t.dtype for t in layout.tensors} == {"F16"}
    assert {t.name: t.dtype for t in layout.integers} == {
        "3.num_batches_tracked": "I64",
        "6.num_batches_tracked": "I64",
    }
    assert int(read_model(store, run, 1)["6.num_batches_tracked"]) == 7
