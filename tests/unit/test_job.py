import json

import pytest

from smlt.runtime.errors import InvalidJob
from smlt.runtime.job import parse_job

GOOD = {"dataset": {"uri": "s3://b/datasets/digits/"}}


def test_defaults_fill_in():
    job = parse_job(GOOD)
    assert job.model.name == "mlp"
    assert job.training.local_steps > 0 and job.workers.initial == 4


def test_accepts_json_text_and_bytes():
    assert parse_job(json.dumps(GOOD)).dataset.uri == GOOD["dataset"]["uri"]
    assert parse_job(json.dumps(GOOD).encode()).dataset.uri == GOOD["dataset"]["uri"]


@pytest.mark.parametrize(
    "raw, field",
    [
        ({}, "dataset: field required"),
        ({**GOOD, "constraints": {"budget_usd": -1}}, "constraints.budget_usd"),
        ({**GOOD, "model": {"name": "resnet9000"}}, "model.name"),
        ({**GOOD, "training": {"batch_size": "big"}}, "training.batch_size"),
        ({**GOOD, "training": {"learning_rate": 0}}, "training.learning_rate"),
        ({**GOOD, "workers": {"initial": 10, "max": 4}}, "workers"),
        ({**GOOD, "bogus": 1}, "bogus: unknown field"),
        (
            {**GOOD, "tracking": {"mlflow_url": "http://x"}},
            "tracking.mlflow_url: unknown field (did you mean 'mlflow_uri'?)",
        ),
        (
            {**GOOD, "training": {"learning_rte": 0.1}},
            "training.learning_rte: unknown field (did you mean 'learning_rate'?)",
        ),
        (
            {**GOOD, "training": {"memory_mb": 1769}},
            "training.memory_mb: unknown field (it belongs in workers) (got 1769)",
        ),
        ({**GOOD, "deadline_seconds": 60}, "deadline_seconds: unknown field (it belongs in constraints)"),
        ({**GOOD, "tracking": {"mlflow_uri": ""}}, "tracking.mlflow_uri"),
        ({**GOOD, "run_id": "has spaces"}, "run_id"),
        ("{not json", "job: not valid JSON"),
        (
            {"job": GOOD, "space": {}},
            "job: this is a study (it has `job` and `space`), not a job: run it with `smlt tune FILE`",
        ),
        ([1, 2], "job: expected a JSON object"),
    ],
)
def test_bad_jobs_name_the_field(raw, field):
    with pytest.raises(InvalidJob) as e:
        parse_job(raw)
    assert field in str(e.value)


def test_user_entry_point_is_accepted():
    assert parse_job({**GOOD, "model": {"name": "mypkg.models:build_model"}}).model.name == "mypkg.models:build_model"
