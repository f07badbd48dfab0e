"""A new account's Lambda concurrency (10) on the local engine: the planner reads it at the run's
first plan and plans within it; a pinned plan beyond it is refused before anything is spent; an
invocation beyond it is throttled as Lambda throttles it."""

import json
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from smlt.datasets import stage_dataset
from smlt.local import throttle
from smlt.runtime import keys, ledger
from smlt.runtime.items import PlanItem
from smlt.runtime.records import RunTable

ROOT = Path(__file__).resolve().parents[2]
NEW_ACCOUNT = "10"


def planner(engine):
    return next(f.name for f in engine.functions.values() if "SMLT_TRAIN_FUNCTIONS" in f.env)


def digits_job(names, engine, workers, **training):
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job["training"].update(training)
    job["workers"] = workers
    job["dataset"] = {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))}
    return job


def test_the_engine_answers_get_account_settings_and_throttles_beyond_the_limit(local, monkeypatch):
    engine, names = local
    monkeypatch.setenv(throttle.ENV, "1")
    lam = engine.client("lambda")
    limit = lam.get_account_settings()["AccountLimit"]
    assert limit["ConcurrentExecutions"] == limit["UnreservedConcurrentExecutions"] == 1
    assert throttle.acquire()  # one invocation in flight: the account is at its limit
    try:
        with pytest.raises(ClientError) as e:
            lam.invoke(FunctionName=planner(engine), Payload=b"{}")
        assert e.value.response["Error"]["Code"] == "TooManyRequestsException"
    finally:
        throttle.release()


def test_a_new_account_runs_at_most_10_workers_at_once_and_bills_no_phantom_durations(local, monkeypatch):
    engine, names = local
    monkeypatch.setenv(throttle.ENV, NEW_ACCOUNT)
    job = digits_job(
        names,
        engine,
        {"initial": 4, "min": 1, "max": 64, "memory_mb": 1769, "planner": "adaptive"},
        max_rounds=3,
        target_value=None,
    )
    job["constraints"] = {"budget_usd": 0.5, "objective": "speed"}  # the fastest plan: as many workers as run
    before = len(engine.billed)
    desc = engine.wait(engine.start_execution(job, name="new-account"), interval=0.5, timeout=600)
    assert desc["status"] == "SUCCEEDED", desc
    table = RunTable(names.table, "new-account", client=engine.client("dynamodb"))
    assert table.meta().account_concurrency == 10
    plans = [PlanItem.model_validate(i) for i in table.query("PLAN#")]
    trained = [p.spec.workers for p in plans if p.spec is not None]
    assert trained and max(trained) <= 10
    # every attempt in the ledger is a handler run the engine served: none estimated, none throttled
    attempts = ledger.from_items(table.query(ledger.PREFIX))
    billed = engine.billed[before:]
    assert not [a for a in attempts if a.estimated]
    assert len(attempts) == len(billed) > 0
    assert all(b.outcome != "throttle" for b in billed)


def test_a_pinned_plan_beyond_the_limit_is_refused_before_anything_is_spent(local, monkeypatch):
    engine, names = local
    monkeypatch.setenv(throttle.ENV, NEW_ACCOUNT)
    job = digits_job(names, engine, {"initial": 16, "min": 1, "max": 16, "memory_mb": 1769, "planner": "fixed"})
    before = len(engine.billed)
    desc = engine.wait(engine.start_execution(job, name="pinned-16"), interval=0.2, timeout=120)
    assert desc["status"] == "FAILED" and desc["error"] == "ConcurrencyLimit", desc
    cause = desc["cause"]
    assert "workers.initial" in cause and "16" in cause and "10" in cause and "L-B99A9384" in cause
    # the planner's own invocation only: no worker ran, nothing was written
    assert [b.function for b in engine.billed[before:]] == [planner(engine)]
    s3 = engine.client("s3")
    assert s3.list_objects_v2(Bucket=names.artifacts_bucket, Prefix=keys.run_prefix("pinned-16")).get("KeyCount") == 0
    assert RunTable(names.table, "pinned-16", client=engine.client("dynamodb")).meta() is None


def test_smlt_doctor_reads_the_accounts_limit_and_says_what_to_raise(engine_as_aws, monkeypatch, caplog):
    from smlt.cli import main

    monkeypatch.setenv(throttle.ENV, NEW_ACCOUNT)
    caplog.set_level("INFO")
    assert main(["doctor", "--stack", "NoSuchStack"]) == 0  # the default tiers deploy on a new account
    err = caplog.text
    assert "10 per account in this region, 10 unreserved" in err
    assert "at most 10 workers at once" in err and "L-B99A9384" in err


def study_file(tmp_path, initial):
    raw = json.loads((ROOT / "examples/digits-study.json").read_text())
    raw["job"]["training"].update(max_rounds=2, local_steps=10)
    raw["job"]["workers"] = {"initial": initial, "min": 1, "max": initial, "memory_mb": 1769, "planner": "fixed"}
    # a short deadline bounds the watcher's last wait (on a loaded machine its looks' cost can use
    # up their reserve, and its next look is then at the deadline, after the trials have ended)
    raw.update(
        {"trials": 2, "concurrency": 2, "search": {"kind": "random"}, "budget_usd": 0.2, "deadline_seconds": 150}
    )
    path = tmp_path / f"study-{initial}.json"
    path.write_text(json.dumps(raw))
    return path


def test_a_studys_trials_share_a_new_accounts_concurrency(local, monkeypatch, tmp_path):
    """Two trials at once on an account of 7: each trial's planner reads 7 and plans within its
    share, (7 - 1) // 2 = 3 workers, so two trials' workers and the study's watcher never pass the
    limit: 3 pinned workers run, no invocation throttled; 4 pinned workers are refused at the
    trial's first plan, naming the share and what to lower (before, each trial took the whole
    7 and the two trials' 8 workers ran into the account's throttling)."""
    from smlt import studies as tune
    from smlt.runtime.errors import StudyFailed

    engine, names = local
    monkeypatch.setenv(throttle.ENV, "7")
    target = tune.local_target(engine)
    before = len(engine.billed)
    meta, trials = tune.run(target, study_file(tmp_path, 3), tmp_path / "fits", "shared-fits")
    assert meta.status == "SUCCEEDED" and [t.status for t in trials] == ["SUCCEEDED"] * 2, (meta, trials)
    billed = engine.billed[before:]
    assert not [b for b in billed if b.outcome == "throttle"], [b.function for b in billed if b.outcome == "throttle"]
    for t in trials:
        table = RunTable(names.table, t.run_id, client=engine.client("dynamodb"))
        assert table.meta().account_concurrency == 7
        assert {p.spec.workers for p in table.plans() if p.spec is not None} == {3}

    before = len(engine.billed)
    with pytest.raises(StudyFailed) as e:
        tune.run(target, study_file(tmp_path, 4), tmp_path / "over", "shared-over")
    cause = str(e.value)
    assert "every trial: FAILED: ConcurrencyLimit: workers.initial: 4" in cause, cause
    assert "leaves this run 3" in cause and "study.concurrency at most 1" in cause, cause
    assert not [b for b in engine.billed[before:] if b.function in names.train_functions]  # no worker ran
