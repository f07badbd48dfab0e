"""The account's Lambda concurrency as an input of the plan, the throttled attempt's bill, and
the code/warm-start locations a job may name (pure functions; the engine tests run them whole)."""

import pytest

from smlt.runtime import account, keys, ledger
from smlt.runtime.config import Settings
from smlt.runtime.errors import ConcurrencyLimit, InvalidCode
from smlt.runtime.job import Job
from smlt.runtime.steps import plan
from smlt.runtime.usercode import check_code_location


def job(**workers):
    return Job.model_validate({"dataset": {"uri": "s3://data/digits/"}, "workers": workers})


class Meta:
    def __init__(self, account_concurrency):
        self.account_concurrency = account_concurrency


def settings(max_concurrency=64):
    return Settings(artifacts_bucket="art", table="t", max_concurrency=max_concurrency)


def test_slots_are_the_lower_of_max_concurrency_and_the_accounts_unreserved():
    assert account.worker_slots(64, 10) == 10
    assert account.worker_slots(8, 1000) == 8
    assert account.worker_slots(64, None) == 64
    assert account.worker_slots(64, 0) == 1


def test_the_planner_plans_within_the_slots():
    held = plan._within_slots(job(initial=4, min=1, max=64, planner="adaptive"), settings(), Meta(10))
    assert (held.workers.min, held.workers.initial, held.workers.max) == (1, 4, 10)
    held = plan._within_slots(job(initial=20, min=12, max=64, planner="adaptive"), settings(), Meta(10))
    assert (held.workers.min, held.workers.initial, held.workers.max) == (10, 10, 10)
    untouched = job(initial=4, max=8)
    assert plan._within_slots(untouched, settings(), Meta(10)) is untouched


def test_a_pinned_plan_beyond_the_account_is_refused_naming_the_quota(monkeypatch):
    monkeypatch.setattr(account, "try_read_limits", lambda client=None: account.AccountLimits(10, 10))
    with pytest.raises(ConcurrencyLimit) as e:
        plan._check_concurrency(job(initial=16, max=16, planner="fixed"), settings())
    assert "workers.initial: 16" in str(e.value) and account.QUOTA_CODE in str(e.value)
    assert plan._check_concurrency(job(initial=10, max=64, planner="fixed"), settings()) == 10
    with pytest.raises(ConcurrencyLimit, match="workers.min: 12"):
        plan._check_concurrency(job(initial=12, min=12, max=64, planner="adaptive"), settings())
    # the stack's own max_concurrency is named when it is the lower one
    with pytest.raises(ConcurrencyLimit, match="max_concurrency is 8"):
        plan._check_concurrency(job(initial=9, max=9, planner="fixed"), settings(max_concurrency=8))


def test_runs_at_once_share_the_account_and_leave_one_for_the_studys_watcher(monkeypatch):
    # a study's 4 trials on a new account of 10: each (10 - 1) // 4 = 2 workers, so 4 x 2 workers
    # (or a trial's one control step instead) and the watcher make 9 <= 10: nothing is throttled
    assert account.worker_slots(64, 10, runs=4) == 2
    assert account.worker_slots(64, 1000, runs=4) == 64  # the stack's cap is the lower
    assert account.worker_slots(64, 10, runs=16) == 1  # never below one
    assert account.worker_slots(64, None, runs=4) == 64  # unreadable: max_concurrency, as for one run
    held = plan._within_slots(job(initial=4, max=8, planner="adaptive", concurrent_runs=4), settings(), Meta(10))
    assert (held.workers.initial, held.workers.max) == (2, 2)
    monkeypatch.setattr(account, "try_read_limits", lambda client=None: account.AccountLimits(10, 10))
    with pytest.raises(ConcurrencyLimit) as e:
        plan._check_concurrency(job(initial=3, max=3, planner="fixed", concurrent_runs=4), settings())
    message = str(e.value)
    assert "workers.initial: 3" in message and "shared by 4 runs" in message and "leaves this run 2" in message
    assert "study.concurrency at most 3" in message and account.QUOTA_CODE in message


def test_an_unreadable_account_plans_with_max_concurrency(monkeypatch):
    monkeypatch.setattr(account, "try_read_limits", lambda client=None: None)
    assert plan._check_concurrency(job(initial=16, max=16, planner="fixed"), settings()) is None


def test_a_throttled_worker_that_never_ran_bills_no_duration():
    ran = ledger.AttemptItem(function="w", memory_mb=1769, round=0, worker=0, request_id="r0", duration_s=30.0)
    outcomes = [
        {"worker": 1, "ok": False, "error": "Lambda.TooManyRequestsException"},
        {"worker": 2, "ok": False, "error": "Sandbox.Timedout"},
        {"worker": 3, "ok": False, "error": "Lambda.Unknown"},
    ]
    est = {a.worker: a for a in ledger.estimate_missing(4, 1769, 0, [ran], outcomes, 900.0)}
    assert est[1].duration_s == 0.0 and est[1].outcome == "Lambda.TooManyRequestsException"
    assert est[2].duration_s == 900.0  # a time-out bills its timeout
    assert est[3].duration_s == 30.0  # a crash: the round's longest attempt
    # the throttled one bills one request and nothing else
    bill = ledger.breakdown([est[1]], 0, Settings(artifacts_bucket="a", table="t").prices, "arm64")
    assert bill.lambda_gb_s == 0 and bill.lambda_invocations == 1


def test_code_runs_only_from_the_stacks_code_object():
    sha = "a" * 64
    ok = Job.model_validate(
        {"dataset": {"uri": "s3://data/d/"}, "code": {"uri": f"s3://art/{keys.code_key(sha)}", "sha256": sha}}
    )
    check_code_location(ok, "art")
    for uri in (f"s3://data/incoming/p/{sha}.zip", f"s3://other/{keys.code_key(sha)}", f"s3://art/runs/x/{sha}.zip"):
        bad = ok.model_copy(update={"code": ok.code.model_copy(update={"uri": uri})})
        with pytest.raises(InvalidCode, match="code.uri"):
            check_code_location(bad, "art")


def test_iam_patterns_come_from_the_key_functions():
    assert keys.object_pattern(keys.run_prefix(keys.ANY)) == "runs/*/*"
    assert keys.object_pattern(keys.rounds_prefix(keys.ANY)) == "runs/*/rounds/*"
    assert keys.object_pattern(keys.study_best_prefix(keys.ANY)) == "studies/*/best/*"
    assert keys.object_pattern(keys.pipeline_latest_key(keys.ANY)) == "pipelines/*/latest.json"
    assert keys.object_pattern(keys.code_key(keys.ANY)) == "code/*.zip"
