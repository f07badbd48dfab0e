"""A run in a team's tracking tools: one MLflow run per smlt run (a local file store, read back
with MLflow's own client), whatever the crashes, resumes and repeated fetches; TensorBoard event
files written round by round, readable with tensorboard's own reader after the run is killed."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from smlt.cli import main
from smlt.outputs import fetch_outputs
from smlt.runtime.store import S3Store
from smlt.tracking import TAG
from tests.e2e.test_crash_resume import ROOT, drive, finish
from tests.e2e.test_local_run import digits_job, run

# A local run (its own process group) killed with SIGKILL right after round `at` was reported.
KILL_AFTER = r"""
import os, signal, sys
from pathlib import Path
from smlt import runner, tracking

job, out, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
reported = tracking.LiveTracking.round

def round_then_die(self, r):
    reported(self, r)
    if r["round"] == at:
        os.killpg(os.getpgrp(), signal.SIGKILL)

tracking.LiveTracking.round = round_then_die
runner.run_local(Path(job), Path(out))
"""


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local MLflow file store (MLflow asks for this opt-in to its file backend)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"file://{tmp_path / 'mlruns'}"


def mlflow_runs(uri: str, run_id: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    return client.search_runs(
        [e.experiment_id for e in client.search_experiments()], filter_string=f"tags.`{TAG}` = '{run_id}'"
    )


def steps(uri: str, mlflow_run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(tracking_uri=uri).get_metric_history(mlflow_run_id, key))


def board(folder) -> EventAccumulator:
    events = EventAccumulator(str(folder))
    events.Reload()
    return events


def test_a_run_and_its_repeated_fetches_log_one_mlflow_run(local, tmp_path, store, capsys):
    job = digits_job(max_rounds=3, target_value=None)
    job["tracking"] = {"mlflow_uri": store, "mlflow_experiment": "digits-tracking"}
    out = tmp_path / "out"
    assert run(local, job, out, "tracked") == 0
    metrics = json.loads((out / "metrics.json").read_text())

    def check() -> None:
        (r,) = mlflow_runs(store, "tracked")
        assert r.info.status == "FINISHED" and r.info.run_name == "tracked"
        assert r.data.params["training.max_rounds"] == "3" and r.data.params["model"] == "mlp"
        assert r.data.params["workers.initial"] == str(job["workers"]["initial"])
        history = MlflowClient(tracking_uri=store).get_metric_history(r.info.run_id, "metrics/val_accuracy")
        assert sorted((m.step, m.value) for m in history) == [
            (x["round"], x["val_accuracy"]) for x in metrics["rounds"]
        ]
        assert steps(store, r.info.run_id, "plan/local_steps") == [0, 1, 2]  # the eval-only round 3 trains none
        for key in ("plan/workers", "plan/memory_mb", "time/round_s", "cost/spent_usd", "loss/validation"):
            assert steps(store, r.info.run_id, key) == [0, 1, 2, 3], key
        assert r.data.metrics["final/val_accuracy"] == metrics["final"]["val_accuracy"]
        assert steps(store, r.info.run_id, "final/val_accuracy") == [0]
        model = MlflowClient(tracking_uri=store).download_artifacts(
            r.info.run_id, "model/model.safetensors", str(tmp_path / "dl")
        )
        assert open(model, "rb").read() == (out / "model.safetensors").read_bytes()
        files = {f.path for f in MlflowClient(tracking_uri=store).list_artifacts(r.info.run_id, "model")}
        assert files == {"model/model.safetensors", "model/model.json"}

    check()
    # The live curves were replaced at the end by one set with the hyper-parameters.
    tb = board(out / "tensorboard" / "tracked")
    assert [e.step for e in tb.Scalars("metrics/val_accuracy")] == [0, 1, 2, 3]

    # A second fetch (`smlt fetch`, a retried Finalize's outputs) and `smlt track` log nothing twice.
    engine, names = local
    fetch_outputs(S3Store(names.artifacts_bucket, client=engine.client("s3")), "tracked", out)
    check()
    capsys.readouterr()
    assert main(["track", str(out)]) == 0
    assert "mlflow: run tracked logged to file://" in capsys.readouterr().out
    check()


def test_an_unreachable_tracking_server_warns_and_the_run_is_logged_later(local, tmp_path, store, caplog, capsys):
    bad = "http://127.0.0.1:9"  # nothing listens there: connection refused
    job = digits_job(max_rounds=2, target_value=None)
    job["tracking"] = {"mlflow_uri": bad}
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        assert run(local, job, out, "untracked") == 0  # the run finished: its model is stored
    assert (out / "model.safetensors").is_file()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"mlflow: {bad}: MlflowException" in w and "the run goes on" in w for w in warnings), warnings
    (end,) = [w for w in warnings if w.startswith("mlflow: run untracked was not logged")]
    assert f"MLflow at {bad}" in end and f"log it again with: smlt track {out}" in end

    # Logged afterwards, to another store, twice: one MLflow run, each round once.
    for _ in range(2):
        assert main(["track", str(out), "--mlflow-uri", store, "--experiment", "later"]) == 0
    (r,) = mlflow_runs(store, "untracked")
    assert steps(store, r.info.run_id, "loss/validation") == [0, 1, 2] and r.info.status == "FINISHED"
    # Without any URI, `smlt track` says where to give one.
    capsys.readouterr()
    job_without = json.loads((out / "metrics.json").read_text())
    job_without["job"]["tracking"] = {}
    (out / "metrics.json").write_text(json.dumps(job_without))
    assert main(["track", str(out)]) == 1
    assert "no MLflow tracking URI: pass --mlflow-uri URI" in capsys.readouterr().err


def test_a_killed_and_resumed_run_logs_each_round_once(local, tmp_path, store):
    run_id = "tracked-crash"
    job = {
        "name": "tracked-crash",
        "run_id": run_id,
        "dataset": {"uri": "sklearn:digits"},
        "model": {"name": "mlp", "params": {"hidden": [32]}},
        "training": {"max_rounds": 4, "local_steps": 5, "batch_size": 32},
        "workers": {"initial": 2, "memory_mb": 1769, "planner": "fixed"},
        "constraints": {"budget_usd": 1.0},
        "tracking": {"mlflow_uri": store},
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    out = tmp_path / "out"

    # Killed (SIGKILL, every process) right after round 1 was reported: its curves are on disk.
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_AFTER, str(path), str(out), "1"],
        cwd=ROOT,
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    rc, err = finish(proc)
    assert rc == -9, err
    live = board(out / "tensorboard" / run_id)
    assert [e.step for e in live.Scalars("loss/validation")] == [0, 1]
    assert [e.step for e in live.Scalars("cost/spent_of_budget")] == [0, 1]
    (r,) = mlflow_runs(store, run_id)
    assert r.info.status == "RUNNING" and steps(store, r.info.run_id, "loss/validation") == [0, 1]

    # Resumed and killed again right after Finalize (outputs not fetched), then resumed to the end.
    rc, err = drive("resume", "finalize", run_id, out)
    assert rc == -9, err
    rc, err = drive("resume", "none", run_id, out)
    assert rc == 0, err

    (r,) = mlflow_runs(store, run_id)  # the experiment is the job's name
    assert MlflowClient(tracking_uri=store).get_experiment(r.info.experiment_id).name == "tracked-crash"
    assert r.info.status == "FINISHED"
    for key in ("loss/validation", "plan/workers", "cost/spent_usd", "cost/spent_of_budget"):
        assert steps(store, r.info.run_id, key) == [0, 1, 2, 3, 4], key
    assert steps(store, r.info.run_id, "plan/local_steps") == [0, 1, 2, 3]
    final = json.loads((out / "metrics.json").read_text())
    assert r.data.metrics["final/val_loss"] == final["final"]["val_loss"]
    assert [e.step for e in board(out / "tensorboard" / run_id).Scalars("loss/validation")] == [0, 1, 2, 3, 4]
