"""The study controller on moto: budget shares reserved atomically, ASHA stops from the trials'
ROUND items (through their STOP item), the deadline, a trial's ledger settling its share."""

import json
import threading
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from smlt.runtime import keys
from smlt.runtime.items import FinalMetrics, MetaItem, RoundItem, StopItem
from smlt.runtime.job import parse_job
from smlt.runtime.records import RunTable, create_run_table
from smlt.runtime.study import controller
from smlt.runtime.study.items import StudyTable
from smlt.runtime.study.spec import parse_study, trial_job

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def place(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        ddb, s3 = boto3.client("dynamodb"), boto3.client("s3")
        s3.create_bucket(Bucket="art")
        create_run_table(ddb, "runs")
        yield controller.Place("runs", "art", dynamodb=ddb, s3=s3, clock=Clock())


def study(**changes):
    raw = json.loads((ROOT / "examples/digits-study.json").read_text())
    raw.update({"study_id": "s", **changes})
    return raw


def record(place, run_id, accs, cost_per_round=0.001):
    t = RunTable("runs", run_id, client=place.dynamodb)
    for r, acc in enumerate(accs):
        item = RoundItem(
            round=r,
            workers=1,
            memory_mb=1769,
            local_steps=30,
            batch_size=32,
            val_accuracy=acc,
            cost_total_usd=cost_per_round * (r + 1),
        )
        t.put_once(keys.round_sk(r), item)


def test_concurrent_admits_never_reserve_more_than_the_budget(place):
    controller.init(place, study(trials=8, budget_usd=0.08))
    answers = []

    def admit(n):
        answers.append(controller.admit(place, "s", n))

    threads = [threading.Thread(target=admit, args=(n,)) for n in range(8)]
    [t.start() for t in threads], [t.join() for t in threads]
    shares = [a.job["constraints"]["budget_usd"] for a in answers]
    meta = StudyTable("runs", "s", client=place.dynamodb).study()
    # the trials share what the reserve for the study's own bill leaves
    free = 0.08 - meta.overhead_reserve_usd
    assert 0 < meta.overhead_reserve_usd < 0.01
    assert all(a.start for a in answers) and sum(shares) == pytest.approx(free)
    assert meta.started == 8 and meta.reserved_usd == pytest.approx(free)
    # each admit's own bill is on its trial's item
    assert all(t.controller_usd > 0 for t in StudyTable("runs", "s", client=place.dynamodb).trials())
    assert {a.run_id for a in answers} == {f"s-t{n:03d}" for n in range(8)}


def test_asha_stops_a_trial_below_the_cutoff_at_its_rung_and_its_share_returns(place):
    controller.init(place, study(trials=3, budget_usd=0.03))
    for n in range(2):
        controller.admit(place, "s", n)
    record(place, "s-t000", [0.1, 0.9])  # rung 1: first there, goes on
    assert controller.watch(place, "s").done is False
    record(place, "s-t001", [0.1, 0.5])  # rung 1: below the cutoff (0.9)
    controller.watch(place, "s")
    stop = RunTable("runs", "s-t001", client=place.dynamodb).get(keys.STOP, StopItem)
    assert stop is not None and stop.by == "study:s" and "rung 1" in stop.reason
    assert RunTable("runs", "s-t000", client=place.dynamodb).get(keys.STOP, StopItem) is None
    # the stopped trial ends having spent 0.002 of its share: its share settles to its ledger
    assert controller.ended(place, "s", 1).status == "FAILED"  # no final metrics: the run did not finish
    meta = StudyTable("runs", "s", client=place.dynamodb).study()
    share = (0.03 - meta.overhead_reserve_usd) / 3
    assert meta.reserved_usd == pytest.approx(share + 0.002)
    third = controller.admit(place, "s", 2)
    assert third.job["constraints"]["budget_usd"] == pytest.approx(0.03 - meta.overhead_reserve_usd - share - 0.002)
    # the two looks are the watcher's bill, and it says when to look next
    assert meta.watches == 2 and meta.watch_usd > 0 and meta.overhead_usd > meta.watch_usd


def test_the_deadline_skips_trials_that_could_not_finish_and_stops_running_ones(place):
    controller.init(place, study(trials=2, deadline_seconds=100, min_trial_seconds=30))
    first = controller.admit(place, "s", 0)
    assert first.start and first.job["constraints"]["deadline_seconds"] <= 100 - 10
    place.clock.now += 70  # 30 s left, less the margin: too little for a trial
    skipped = controller.admit(place, "s", 1)
    assert not skipped.start and skipped.run_id is None and "deadline" in (skipped.reason or "")
    place.clock.now += 25  # at the deadline (less the margin): the running trial is asked to stop
    record(place, "s-t000", [0.1])
    controller.watch(place, "s")
    stop = RunTable("runs", "s-t000", client=place.dynamodb).get(keys.STOP, StopItem)
    assert stop is not None and "deadline" in stop.reason


def test_warm_start_needs_the_other_studys_best(place):
    from smlt.runtime.errors import InvalidJob

    with pytest.raises(InvalidJob, match="warm_start.study: study 'nope' has no best model"):
        controller.init(place, study(warm_start={"study": "nope"}))


def test_the_watcher_looks_once_per_round_of_the_trials_and_within_its_reserve(place):
    from smlt.runtime.study import budget

    controller.init(place, study(trials=2))
    controller.admit(place, "s", 0)
    # no round timed yet: the first interval, or longer when the reserve for the looks needs it
    assert controller.watch(place, "s").poll_seconds >= budget.FIRST_POLL_S
    # the polls follow the trials' round time, within [MIN_POLL_S, MAX_POLL_S]
    assert budget.next_poll(None, 7.4, 600, 1.0, 1e-4) == 7
    assert budget.next_poll(None, 0.3, 600, 1.0, 1e-4) == budget.MIN_POLL_S
    assert budget.next_poll(5, None, 600, 1.0, 1e-4) == 5  # the study's own poll_seconds
    # a reserve for many more looks: at the trials' pace (ASHA sees every rung)
    assert budget.next_poll(None, 3.0, 600, 10.5e-4, 1e-4) == 3
    assert budget.next_poll(None, 3.0, 600, 2.5e-4, 1e-4) == 3
    # one look left: kept for the deadline
    assert budget.next_poll(None, 3.0, 600, 1.5e-4, 1e-4) == 601
    # none left: one more look at the deadline
    assert budget.next_poll(None, 3.0, 600, 0.5e-4, 1e-4) == 601


class Died(BaseException):
    """The controller's process died here (nothing in the step catches a BaseException)."""


def _dies_after_write(monkeypatch, k):
    """The next step dies right after its k-th DynamoDB write (as `--faults crash=R` does)."""
    done = {"writes": 0}
    for name in ("update", "put_once"):
        real = getattr(RunTable, name)

        def write(self, *a, _real=real, **kw):
            out = _real(self, *a, **kw)
            done["writes"] += 1
            if done["writes"] == k:
                monkeypatch.undo()
                raise Died(k)
            return out

        monkeypatch.setattr(RunTable, name, write)
    return done


def _state(place):
    t = StudyTable("runs", "s", client=place.dynamodb)
    meta = t.study()
    trials = [(tr.trial, tr.status, tr.budget_usd, tr.cost_usd, tr.stop_reason) for tr in t.trials()]
    return meta.started, round(meta.reserved_usd, 12), trials


@pytest.mark.parametrize("step", ["admit", "ended"])
def test_a_controller_step_dying_after_any_write_is_retried_to_the_same_state(place, monkeypatch, step):
    """The study machine retries a controller step whose process died (Runtime.ExitError): its
    retry must not reserve a trial's share twice (admit) nor leave it unsettled (ended)."""

    def steps(dies_at=None):
        controller.init(place, study(trials=2, budget_usd=0.02))
        record(place, "s-t000", [0.1, 0.5])
        for op, trial in (("admit", 0), ("admit", 1), ("ended", 0)):
            if op == step and trial == 1 - (step == "ended") and dies_at is not None:
                died = _dies_after_write(monkeypatch, dies_at)
                with pytest.raises(Died):
                    getattr(controller, op)(place, "s", trial)
                assert died["writes"] == dies_at
            getattr(controller, op)(place, "s", trial)  # the step, or its retry
        return _state(place)

    clean = steps()
    for k in (1, 2, 3):
        place.dynamodb.delete_table(TableName="runs")
        create_run_table(place.dynamodb, "runs")
        assert steps(dies_at=k) == clean, f"{step} died after write {k}"


def test_a_look_that_read_a_trial_running_does_not_overwrite_it_once_ended(place, monkeypatch):
    """The watcher reads the trials, the trial's ended step writes its final ledger, then the look
    writes its round-by-round values: they must not replace the ended trial's (its cost_usd was
    the last round's total, not the run's ledger that its reservation settled to)."""
    _one_trial_run_finished(place)
    real = StudyTable.trials

    def trials_then_ended(self):
        found = real(self)
        monkeypatch.setattr(StudyTable, "trials", real)
        controller.ended(place, "s", 0)  # ends while the look holds it as RUNNING
        return found

    monkeypatch.setattr(StudyTable, "trials", trials_then_ended)
    controller.watch(place, "s")
    t = StudyTable("runs", "s", client=place.dynamodb)
    (trial,) = t.trials()
    assert trial.status == "SUCCEEDED" and trial.cost_usd == pytest.approx(0.005)
    assert t.study().reserved_usd == pytest.approx(0.005)


def test_a_look_still_running_when_the_study_finished_adds_only_its_own_cost(place, monkeypatch):
    """The last trial's end stops the watcher's branch without waiting for a Watch invocation in
    flight (infra/stacks/study.py), so Finish can write the result while a look still runs: the
    look must not overwrite the result (its best trial, the trials' spend) and its cost stays in
    the bill, whichever of the two writes META first."""
    _one_trial_run_finished(place)
    place.s3.put_object(Bucket="art", Key=keys.final_model_key("s-t000"), Body=b"model")
    real = StudyTable.trials

    def trials_then_finished(self):
        found = real(self)
        monkeypatch.setattr(StudyTable, "trials", real)
        controller.ended(place, "s", 0)  # the trial ends and the study finishes during the look
        controller.finish(place, "s")
        return found

    monkeypatch.setattr(StudyTable, "trials", trials_then_finished)
    t = StudyTable("runs", "s", client=place.dynamodb)
    controller.watch(place, "s")
    meta = t.study()
    assert meta.status == "SUCCEEDED" and meta.best_run_id == "s-t000" and meta.best_model_key
    assert meta.spent_usd == pytest.approx(0.005)  # the trial's ledger, not the look's last round
    assert meta.watches == 1 and meta.watch_usd > 0
    assert meta.total_usd == pytest.approx(meta.spent_usd + meta.overhead_usd)
    assert meta.overhead_usd >= meta.watch_usd + t.trials()[0].controller_usd


def test_the_cli_reads_the_bill_once_the_late_look_has_added_its_cost(place):
    """`smlt tune` prints META's bill once every look the history shows recording has written
    (`studies.settled`): a look still running when Finish ended the execution is not left out."""
    from smlt import studies

    _one_trial_run_finished(place)
    place.s3.put_object(Bucket="art", Key=keys.final_model_key("s-t000"), Body=b"model")
    controller.ended(place, "s", 0)
    controller.finish(place, "s")
    t = StudyTable("runs", "s", client=place.dynamodb)
    early = t.study()
    assert early.watches == 0
    late = threading.Timer(0.3, controller.watch, (place, "s"))  # the look in flight, ending after Finish
    late.start()
    meta = studies.settled(t, looks=1, interval=0.05)
    late.join()
    assert meta.watches == 1 and meta.watch_usd > 0
    assert meta.total_usd == pytest.approx(early.total_usd + meta.watch_usd)  # early, it was short by the look
    assert studies.settled(t, looks=2, wait_s=0.1, interval=0.05).watches == 1  # a look that died: bounded


def _one_trial_run_finished(place):
    """A one-trial study whose trial is admitted and its run finished (ROUND items, META's final)."""
    controller.init(place, study(trials=1, budget_usd=0.02))
    controller.admit(place, "s", 0)
    record(place, "s-t000", [0.1, 0.5])
    (pending,) = StudyTable("runs", "s", client=place.dynamodb).trials()
    job = parse_job({**trial_job(parse_study(study(trials=1, budget_usd=0.02)), pending.params), "run_id": "s-t000"})
    final = FinalMetrics(
        run_id="s-t000",
        rounds=2,
        samples=1,
        wall_seconds=1.0,
        estimated_cost_usd=0.005,
        stop_reason="max_rounds",
        val_accuracy=0.5,
    )
    meta = MetaItem(
        run_id="s-t000",
        execution="x",
        job=job,
        status="SUCCEEDED",
        created_at=1.0,
        train_rows=1,
        train_shards=1,
        features=64,
        outputs=10,
        task="classification",
    )
    RunTable("runs", "s-t000", client=place.dynamodb).put_once(keys.META, meta.model_copy(update={"final": final}))
