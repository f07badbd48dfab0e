"""Where a run is tracked: the URI and experiment from the arguments, the job, the environment;
the per-round scalars both tools show; a server that refuses is a named error within seconds."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from smlt.tracking import TrackingFailed, log_mlflow, mlflow_target, round_scalars

JOB = {"name": "digits", "tracking": {"mlflow_uri": "http://job:5000", "mlflow_experiment": "job-exp"}}


def test_the_uri_and_experiment_come_from_the_arguments_then_the_job_then_the_environment(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "env-exp")
    assert mlflow_target(JOB, "http://arg:5000", "arg-exp") == ("http://arg:5000", "arg-exp")
    assert mlflow_target(JOB) == ("http://job:5000", "job-exp")
    assert mlflow_target({"name": "digits", "tracking": {}}) == ("http://env:5000", "env-exp")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    assert mlflow_target({"name": "digits"}) == ("http://env:5000", "digits")  # the job's name
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert mlflow_target({"name": "digits", "tracking": {"mlflow_uri": None}}) is None


def test_round_scalars_leave_out_what_a_round_did_not_measure():
    train = {"round": 2, "train_loss": 0.5, "val_loss": None, "workers": 4, "local_steps": 20, "cost_total_usd": 0.01}
    assert round_scalars(train, 0.04) == {
        "loss/train": 0.5,
        "plan/workers": 4.0,
        "plan/local_steps": 20.0,
        "cost/spent_usd": 0.01,
        "cost/spent_of_budget": 0.25,
    }
    last = {"round": 3, "eval_only": True, "local_steps": 20, "val_accuracy": 0.9}
    assert round_scalars(last, None) == {"metrics/val_accuracy": 0.9}  # an evaluation trains no steps


def test_a_server_that_refuses_is_a_named_error_within_seconds(monkeypatch):
    for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(k, raising=False)
    t0 = time.perf_counter()
    with pytest.raises(TrackingFailed, match=r"MLflow at http://127\.0\.0\.1:9: MlflowException: API request"):
        log_mlflow({"run_id": "r", "job": {"tracking": {"mlflow_uri": "http://127.0.0.1:9"}}}, Path("."))
    assert time.perf_counter() - t0 < 15  # MLflow's own default retries for minutes
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the bound is ours only
