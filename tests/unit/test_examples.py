"""The job files in examples/: each validates, and the bench's are the jobs it recorded."""

import json
from pathlib import Path

import pytest

from bench.time_to_accuracy import TTA
from smlt.runtime.job import parse_job
from smlt.runtime.study.spec import parse_study

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path):
    # a study file (smlt tune) holds a job; every other example is a job file
    (parse_study if path.name.endswith("-study.json") else parse_job)(path.read_text())


@pytest.mark.parametrize("name", sorted(TTA))
def test_recorded_bench_ran_the_example_job(name):
    # bench/results/local.json (and the README rendered from it) must describe examples/ as they are:
    # changing a bench job means measuring it again.
    recorded = json.loads((ROOT / "bench/results/local.json").read_text())["tta"][name]
    job = json.loads((ROOT / "examples" / TTA[name][0]).read_text())
    assert recorded["source"] == job.pop("dataset")["uri"]
    assert {k: v for k, v in recorded["job"].items() if k != "dataset"} == job
