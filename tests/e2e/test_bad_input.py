"""Bad input that only a run meets, on the local engine: named, and no traceback."""

import json

import pytest

from smlt.datasets import stage_dataset
from smlt.faults import FaultInjector
from smlt.runner import execute
from smlt.runtime import ledger
from smlt.runtime.errors import RunFailed
from smlt.runtime.records import RunTable
from tests.e2e.test_local_run import digits_job, run


def test_a_budget_too_small_for_one_round_is_refused_at_the_first_plan(local, tmp_path):
    engine, names = local
    job = digits_job()
    job["constraints"]["budget_usd"] = 1e-6
    job["dataset"] = {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))}
    with pytest.raises(RunFailed) as e:
        execute(engine, names, "tiny-budget", job, tmp_path)
    assert e.value.error == "Infeasible" and "budget: " in e.value.cause, (e.value.error, e.value.cause)
    assert not (tmp_path / ".state").exists()  # refused at the first plan: no round ran
    # The plan that refused it had created the run (META): the run is billed for it, as AWS bills it.
    table = RunTable(names.table, "tiny-budget", client=engine.client("dynamodb"))
    attempts = ledger.from_items(table.query(ledger.PREFIX))
    assert [(a.op, a.outcome, a.round) for a in attempts] == [("plan", "Infeasible", None)], attempts
    assert "Planner" in attempts[0].function and attempts[0].duration_s > 0


def test_best_effort_runs_what_the_budget_allows_and_says_why_it_stopped(local, tmp_path, caplog):
    job = digits_job()
    job["constraints"].update(budget_usd=1e-6, best_effort=True)
    with caplog.at_level("INFO", logger="smlt.runtime.progress"):
        assert run(local, job, tmp_path, "tiny-budget-best-effort") == 0
    final = json.loads((tmp_path / "metrics.json").read_text())["final"]
    assert final["rounds"] == 0 and final["model_key"] is None
    assert "done: run tiny-budget-best-effort: 0 rounds, val accuracy n/a, val loss n/a" in caplog.text
    assert "stop reason: budget: " in caplog.text and "(no round was trained)" in caplog.text


def test_every_worker_failing_in_round_0_says_there_is_nothing_to_resume(local, tmp_path):
    engine, names = local
    job = digits_job(max_rounds=2)
    job["dataset"] = {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))}
    engine.invoke_filter = injector = FaultInjector({"fail": 1.0}, functions=names.train_functions)
    try:
        with pytest.raises(RunFailed) as e:
            execute(engine, names, "all-fail", job, tmp_path, injector)
    finally:
        engine.invoke_filter = None
    assert e.value.error == "QuorumNotReached" and "nothing to resume: start the run again" in e.value.cause
    assert not (tmp_path / ".state").exists()  # indeed: no round was saved to resume from
