"""bench/model_zoo.py's baseline pieces, quick: plain PyTorch and local SGD train to a target with
smlt's evaluation cadence, the plain throughput loop times its steps, the README section renders."""

import json

import pytest

from bench import model_zoo
from bench.jobs import Split, example_job, prepare


@pytest.fixture(scope="module")
def digits():
    job = example_job("digits.json")  # the flat MLP: what this checkout has for sure
    job = {**job, "workers": {**job["workers"], "initial": 2}, "training": {**job["training"], "target_value": 0.9}}
    return prepare("zoo-test-digits", "sklearn:digits", Split(16, 0.2)), job


def test_plain_pytorch_trains_to_the_target_evaluating_as_often_as_smlt(digits, tmp_path):
    folder, job = digits
    out = tmp_path / "plain.json"
    model_zoo.train_to_target(0, 1, str(folder), job, 0, str(out))
    r = json.loads(out.read_text())
    assert r["reached"] and r["accuracy"] >= 0.9
    t = job["training"]
    per_round = job["workers"]["initial"] * t["local_steps"] * t["batch_size"]  # what one smlt round trains on
    assert r["samples"] == r["evals"] * per_round and r["curve"][-1][2] == round(r["accuracy"], 5)


def test_local_sgd_processes_average_every_local_steps(digits):
    folder, job = digits
    r = model_zoo.run_baseline(folder, job, world=2)
    assert r["kind"] == "local_sgd" and r["processes"] == 2 and r["reached"]
    # each process evaluates after every averaging: local_steps steps each, both processes' samples counted
    t = job["training"]
    assert r["steps"] == r["evals"] * t["local_steps"]
    assert r["samples"] == r["steps"] * t["batch_size"] * 2
    assert r["spread"] < 1e-6  # the model evaluated had just been averaged: every process holds it


def test_plain_throughput_times_its_steps(digits):
    import torch

    folder, job = digits
    xt, yt, _, _, manifest = model_zoo._load(str(folder))
    r = model_zoo.timed_steps(job, manifest, xt, yt, steps=5)
    assert r["samples"] == 5 * job["training"]["batch_size"] and r["samples_per_s"] == r["samples"] / r["seconds"]
    assert r["threads"] == torch.get_num_threads()


def test_a_missing_model_is_said_and_skipped():
    assert model_zoo.unavailable({"model": {"name": "mlp"}}) is None
    assert model_zoo.unavailable({"model": {"name": "pkg.mod:build"}}) is None  # a user's: imported at run time
    assert "'no-such-net' is not in smlt.runtime.train.models" in model_zoo.unavailable(
        {"model": {"name": "no-such-net"}}
    )


def test_the_readme_section_says_what_was_not_measured():
    res = {"recorded_at": "t", "cpus": 2, "load_start": 1.0, "load_end": 1.5}
    res |= {"tta": {"job_file": "digits-cnn.json", "target": 0.95, "seeds": [0, 1, 2], "skipped": True, "note": "x"}}
    res |= {
        "throughput": {"steps": 12, "threads": 2, "smlt": {"samples_per_s": 90.0}, "plain": {"samples_per_s": 100.0}}
    }
    res["throughput"]["ratio"] = 0.9
    res["round"] = {
        "aggregators": 4,
        "skipped": True,
        "note": "model 'resnet50' is not in smlt.runtime.train.models yet",
    }
    text = model_zoo.readme_section(res)
    assert text.startswith("## Model zoo\n") and "not measured: x." in text
    assert "smlt's worker 90.0 samples/s, plain PyTorch 100.0 samples/s: ratio 0.9" in text
    assert "not measured: model 'resnet50' is not in smlt.runtime.train.models yet." in text


def test_the_readme_section_is_the_recorded_results_rendered():
    recorded = json.loads(model_zoo.RESULTS.read_text())
    assert model_zoo.readme_section(recorded) in model_zoo.README.read_text()
