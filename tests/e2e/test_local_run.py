"""The digits job through the real stack's state machine on the local engine."""

import json
from pathlib import Path

import pytest

from smlt.datasets import stage_dataset
from smlt.faults import FaultInjector
from smlt.reconcile import reconcile
from smlt.runner import execute
from smlt.runtime.errors import RunFailed

# Also run with the local engine's speed patches off (make test-stock-moto): see pyproject's markers.
pytestmark = pytest.mark.stock_moto

ROOT = Path(__file__).resolve().parents[2]


def digits_job(**training):
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job["training"].update(training)
    return job


def run(local, job, out, run_id, injector=None):
    engine, names = local
    job = {
        **job,
        "dataset": {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))},
    }
    engine.invoke_filter = injector
    try:
        execute(engine, names, run_id, job, out, injector=injector)
        return 0  # the exit code `smlt run` gives
    except RunFailed:
        return 1
    finally:
        engine.invoke_filter = None


def test_short_run_writes_all_outputs(local, tmp_path):
    rc = run(local, digits_job(max_rounds=3, target_value=None), tmp_path, "short")
    assert rc == 0
    for name in ("model.safetensors", "metrics.json", "report.png", "history.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    final = metrics["final"]
    assert final["rounds"] == 3 and final["val_accuracy"] > 0.5
    assert final["estimated_cost_usd"] > 0 and final["wall_seconds"] > 0
    # Three training rounds and the evaluation of the last model.
    assert [r["eval_only"] for r in metrics["rounds"]] == [False, False, False, True]
    history = json.loads((tmp_path / "history.json").read_text())
    entered = {e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e}
    assert {"Plan", "Train", "Aggregate", "Finalize"} <= entered


def test_invalid_job_fails_in_the_first_state_and_writes_nothing(local, tmp_path, capsys):
    engine, names = local
    job = digits_job()
    job["constraints"]["budget_usd"] = -1
    arn = engine.start_execution(job, name="bad-budget")
    desc = engine.wait(arn, interval=0.1)
    assert desc["status"] == "FAILED" and desc["error"] == "InvalidJob"
    assert "constraints.budget_usd" in desc["cause"]
    s3 = engine.client("s3")
    assert s3.list_objects_v2(Bucket=names.artifacts_bucket, Prefix="runs/bad-budget/").get("KeyCount", 0) == 0


def test_faults_still_reach_the_target_with_an_exact_ledger(local, tmp_path):
    # Seed 8: the first 8 draws already hold 2 failures and 3 duplicates, so both kinds are
    # exercised however few rounds the run needs.
    injector = FaultInjector({"fail": 0.2, "duplicate": 0.05}, functions=local[1].train_functions, seed=8)
    rc = run(local, digits_job(target_value=0.95), tmp_path, "faulty", injector)
    assert rc == 0
    final = json.loads((tmp_path / "metrics.json").read_text())["final"]
    assert final["val_accuracy"] >= 0.95
    assert reconciled(local, "faulty") == []
    assert injector.counts["fail"] > 0 and injector.counts["duplicate"] > 0


def test_long_run_chains_executions(local, tmp_path):
    job = digits_job(max_rounds=10, target_value=None, local_steps=2)
    job["workers"].update(initial=2)
    job["rounds_per_execution"] = 4
    assert run(local, job, tmp_path, "chained") == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["final"]["rounds"] == 10
    assert [r["round"] for r in metrics["rounds"]] == list(range(11))  # no round twice, none lost
    executions = {e["execution"] for e in json.loads((tmp_path / "history.json").read_text())}
    assert len(executions) == 3  # 4 + 4 + 3 rounds


def reconciled(local, run_id: str) -> list:
    """What the reconciliation finds wrong with a run on the engine (smlt.reconcile: every update
    stored, applied once, in the model): [] for a clean run."""
    engine, names = local
    s3, ddb = engine.client("s3"), engine.client("dynamodb")
    return reconcile(s3, ddb, names.artifacts_bucket, names.table, run_id).findings


NOISY_MODEL = """
import torch


class Net(torch.nn.Module):
    def __init__(self, features, classes):
        super().__init__()
        self.fc = torch.nn.Linear(features, classes)

    def forward(self, x):
        print("forward of a batch of", len(x))
        return self.fc(x.flatten(1))


def build(input_shape, output_dim):
    return Net(int(torch.tensor(input_shape).prod()), output_dim)
"""


def test_a_forward_that_prints_writes_to_the_runs_log_not_the_terminal(local, tmp_path, monkeypatch, caplog):
    """As on AWS the functions' prints go to CloudWatch Logs: locally to OUT/logs/RUN.log, each
    invocation's under a line naming it, and one line of the run's output says where."""
    import smlt.runner
    from smlt.cli import main

    engine, names = local
    pkg = tmp_path / "src" / "smlt_e2e_noisy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(NOISY_MODEL)
    job = digits_job(max_rounds=2, target_value=None)
    job.update(run_id="noisy", model={"name": "smlt_e2e_noisy.net:build", "params": {}})
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(job))
    monkeypatch.setattr(smlt.runner, "start_engine", lambda faults: (engine, names, None))
    monkeypatch.setattr(engine, "stop", lambda: None)
    # --out as a user types it, relative to the folder they are in: the handler processes run in
    # their own working folder, so the log is named by its absolute path (its prints were lost)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--local", str(job_path), "--out", "out", "--code", str(pkg)]) == 0
    said = caplog.text  # the run's progress lines
    log = Path("out") / "logs" / "noisy.log"
    text = log.read_text()
    printed = text.count("forward of a batch of")
    assert printed > 20, text[:2000]
    heads = [line for line in text.splitlines() if line.startswith("--- ")]
    assert heads and any("TrainStep" in h for h in heads), heads  # the workers, named as Lambda names them
    assert (
        f"the functions printed {len(text.splitlines()) - len(heads):,} lines (CloudWatch Logs on AWS): {log}" in said
    )
    assert "forward of a batch of" not in said
    assert engine.handler_output is None  # the next run, or another caller of the engine, prints as before
