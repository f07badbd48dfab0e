"""The study controller: the decisions of the study state machine (`infra/stacks/study.py`), one
function per step, each reading and writing the study's items (`smlt.runtime.study.items`).

- `init`: validate the study file, resolve its warm start, store it, write META and a PENDING
  TRIAL item per trial; answer the trial numbers the machine's Map starts (up to `concurrency`
  at once).
- `admit` (each Map iteration, before it starts its trial's execution): reserve the trial's
  budget share and give it its deadline, or skip it when it could not finish.
- `ended` (after the execution, succeeded or failed): the trial's ledger replaces its
  reservation; the best trial so far.
- `watch` (a loop beside the Map): the running trials' curves, ASHA at each rung, the study's
  deadline; `done` once every trial has ended.
- `finish`: the best trial's final model copied to `studies/<id>/best/`; META's result.

A trial is stopped with `RunTable.request_stop(..., by="study:<id>")`: its next Plan stops it,
evaluates its newest model and Finalize publishes it, so a stopped trial still has a result.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smlt.runtime import deployed, keys
from smlt.runtime.errors import InvalidJob
from smlt.runtime.items import MetaItem, RoundItem, StopItem
from smlt.runtime.prices import Prices
from smlt.runtime.records import RunTable
from smlt.runtime.store import S3Store
from smlt.runtime.study import asha, budget
from smlt.runtime.study.events import AdmitAnswer, EndedAnswer, FinishAnswer, InitAnswer, WatchAnswer
from smlt.runtime.study.items import (
    ENDED,
    StudyItem,
    StudyTable,
    TrialItem,
    best_prefix,
    study_key,
    trial_run_id,
    trial_sk,
)
from smlt.runtime.study.sampler import sample
from smlt.runtime.study.spec import Study, parse_study, trial_job

# A trial's job never chains (the study machine watches the one execution it started).
TRIAL_ROUNDS_PER_EXECUTION = 1000


@dataclass
class Place:
    """Where the study lives: the run table, the artifacts bucket, the clock (tests move it)."""

    table: str
    artifacts_bucket: str
    dynamodb: Any = None
    s3: Any = None
    clock: Callable[[], float] = field(default=time.time)
    prices: Prices = field(default_factory=Prices)
    architecture: str = field(default_factory=lambda: deployed.value("architecture"))

    def step_cost(self, op: str, started: float) -> float:
        """The bill of the controller step `op` that started at perf_counter() `started`."""
        return budget.step_cost(op, time.perf_counter() - started, self.prices, self.architecture)

    def study_table(self, study_id: str) -> StudyTable:
        return StudyTable(self.table, study_id, client=self.dynamodb)

    def run_table(self, run_id: str) -> RunTable:
        return RunTable(self.table, run_id, client=self.dynamodb)

    @property
    def store(self) -> S3Store:
        return S3Store(self.artifacts_bucket, client=self.s3)

    def study(self, study_id: str) -> tuple[Study, StudyItem, StudyTable]:
        t = self.study_table(study_id)
        meta = t.study()
        if meta is None:
            raise InvalidJob(f"study {study_id!r}: no such study in table {self.table}")
        return parse_study(self.store.get(study_key(study_id))), meta, t


def _default_id(study: Study, now: float) -> str:
    return f"{study.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}"[:48]


def init(place: Place, raw: Any, execution: str | None = None) -> InitAnswer:
    """Validate and record the study; answers its trials for the Map and the first poll."""
    started = time.perf_counter()
    study = parse_study(raw)
    now = place.clock()
    study_id = study.study_id or _default_id(study, now)
    study = study.model_copy(update={"study_id": study_id})
    if study.warm_start is not None:
        study = _warm_started(place, study)
    t = place.study_table(study_id)
    meta = StudyItem(
        study_id=study_id,
        metric=study.metric_name,
        direction=study.direction,
        search=study.search.kind,
        trials=study.trials,
        status="RUNNING",
        created_at=now,
        budget_usd=study.budget_usd,
        deadline_s=study.deadline_seconds,
        execution=execution,
        overhead_reserve_usd=budget.overhead_reserve(
            study.trials,
            budget.expected_watches(
                study.trials,
                study.concurrency,
                study.job.training.max_rounds,
                study.deadline_seconds,
                study.poll_seconds,
            ),
            place.prices,
            place.architecture,
        ),
    )
    written, stored = t.put_once("META", meta)
    if not written and stored.execution != execution:
        raise InvalidJob(f"study_id: study {study_id!r} exists already; give the study another study_id")
    place.store.put(study_key(study_id), study.model_dump_json(exclude_none=True).encode())
    for n, params in enumerate(sample(study)):
        t.put_once(trial_sk(n), TrialItem(trial=n, run_id=trial_run_id(study_id, n), params=params, status="PENDING"))
    if written:
        cost = place.step_cost("init", started)
        t.update("META", StudyItem, overhead_usd=cost, total_usd=cost)
    return InitAnswer(
        study_id=study_id,
        trials=list(range(study.trials)),
        concurrency=study.concurrency,
        poll_seconds=study.poll_seconds or budget.FIRST_POLL_S,
    )


def _warm_started(place: Place, study: Study) -> Study:
    assert study.warm_start is not None
    other = place.study_table(study.warm_start.study).study()
    if other is None or other.best_model_key is None:
        raise InvalidJob(
            f"warm_start.study: study {study.warm_start.study!r} has no best model "
            "(it does not exist here or has not finished)"
        )
    job = study.job.model_copy(update={"warm_start": f"s3://{place.artifacts_bucket}/{other.best_model_key}"})
    return study.model_copy(update={"job": job})


def _charge_trial(place: Place, study_id: str, trial: int, op: str, started: float) -> None:
    """A trial's admit/ended step onto its TRIAL item (only that trial's steps write it)."""
    t = place.study_table(study_id)
    item = t.get(trial_sk(trial), TrialItem)
    if item is not None:
        t.update(trial_sk(trial), TrialItem, controller_usd=item.controller_usd + place.step_cost(op, started))


def admit(place: Place, study_id: str, trial: int) -> AdmitAnswer:
    """Reserve trial `trial`'s budget share and deadline: {start: true, run_id, job}; or skip it
    ({start: false, reason}) when the deadline leaves it too little time or the budget is gone."""
    started = time.perf_counter()
    answer = _admit(place, study_id, trial)
    _charge_trial(place, study_id, trial, "admit", started)
    return answer


def _admit(place: Place, study_id: str, trial: int) -> AdmitAnswer:
    study, meta, t = place.study(study_id)
    item = t.get(trial_sk(trial), TrialItem)
    assert item is not None, f"trial {trial} of {study_id} has no TRIAL item"
    if item.status != "PENDING":  # a retried step: answer what was decided
        return _admitted(study, item) if item.status == "RUNNING" else AdmitAnswer(start=False, reason=item.stop_reason)
    while True:
        now = place.clock()
        deadline = budget.trial_deadline(meta.created_at + study.deadline_seconds, now, study.min_trial_seconds)
        if str(trial) in meta.shares:  # this step's earlier invocation decided and died: its decision
            share = meta.shares[str(trial)]
            reason = None if share > 0 else (_why_not(study, meta, deadline, share) or "not started")
            deadline = deadline if deadline is not None else study.min_trial_seconds
            break
        # the trials share what the study's own bill (its reserve) leaves of the budget
        share = budget.share(
            study.budget_usd - meta.overhead_reserve_usd, meta.reserved_usd, study.trials - meta.started
        )
        reason = _why_not(study, meta, deadline, share)
        changes: dict[str, Any] = {
            "started": meta.started + 1,
            "version": meta.version + 1,
            "shares": {**meta.shares, str(trial): share if reason is None else 0.0},
        }
        if reason is None:
            changes["reserved_usd"] = meta.reserved_usd + share
        if t.update("META", StudyItem, only_if="#version = :ver", values={":ver": meta.version}, **changes):
            break
        meta = t.study() or meta  # another trial was admitted meanwhile: decide again
    if reason is not None:
        t.update(trial_sk(trial), TrialItem, status="SKIPPED", stop_reason=reason, ended_at=now)
        return AdmitAnswer(start=False, reason=reason)
    assert deadline is not None
    t.update(
        trial_sk(trial),
        TrialItem,
        status="RUNNING",
        budget_usd=share,
        started_at=now,
        execution=item.run_id,
    )
    item = item.model_copy(update={"budget_usd": share, "started_at": now})
    return _admitted(study, item, deadline)


def _why_not(study: Study, meta: StudyItem, deadline: float | None, share: float) -> str | None:
    if meta.status != "RUNNING":
        return f"not started: the study is {meta.status}"
    if deadline is None:
        return (
            f"not started: less than min_trial_seconds ({study.min_trial_seconds:g} s) left before the study's deadline"
        )
    if share <= 0:
        return "not started: the study's budget is reserved by the trials before it"
    return None


def _admitted(study: Study, item: TrialItem, deadline: float | None = None) -> AdmitAnswer:
    job = trial_job(study, item.params)
    job["run_id"] = item.run_id
    job["name"] = f"{study.name}-t{item.trial}"[:64]
    job["rounds_per_execution"] = TRIAL_ROUNDS_PER_EXECUTION
    # the trials running at once share the account's Lambda concurrency (smlt.runtime.account.run_share)
    job.setdefault("workers", {})["concurrent_runs"] = min(study.concurrency, study.trials)
    c = job.setdefault("constraints", {})
    own = c.get("budget_usd")
    c["budget_usd"] = min(own, item.budget_usd) if own else item.budget_usd
    if deadline is not None:
        c["deadline_seconds"] = min(c.get("deadline_seconds") or deadline, deadline)
    return AdmitAnswer(start=True, run_id=item.run_id, job=job)


def _curve(rounds: list[RoundItem], metric: str) -> dict[int, float | None]:
    return {r.round: getattr(r, metric) for r in rounds}


def _final_value(meta: MetaItem | None, metric: str) -> float | None:
    if meta is None or meta.final is None:
        return None
    return getattr(meta.final, metric, None)


def ended(place: Place, study_id: str, trial: int, error: str | None = None) -> EndedAnswer:
    """A trial's execution ended: its ledger replaces its reservation; its result and status."""
    started = time.perf_counter()
    answer = _ended(place, study_id, trial, error)
    _charge_trial(place, study_id, trial, "ended", started)
    return answer


def _ended(place: Place, study_id: str, trial: int, error: str | None = None) -> EndedAnswer:
    study, meta, t = place.study(study_id)
    item = t.get(trial_sk(trial), TrialItem)
    assert item is not None
    if item.status in ENDED:  # a retried step
        return EndedAnswer(trial=trial, status=item.status)
    run = place.run_table(item.run_id)
    run_meta = run.meta()
    rounds = run.rounds()
    cost = (
        run_meta.final.estimated_cost_usd
        if run_meta is not None and run_meta.final is not None
        else (rounds[-1].cost_total_usd if rounds else 0.0)
    )
    value = _final_value(run_meta, study.metric_name)
    stop = run.get(keys.STOP, StopItem)
    status = "FAILED" if error is not None or run_meta is None or run_meta.final is None else "SUCCEEDED"
    if status == "SUCCEEDED" and stop is not None:
        status = "STOPPED"
    reason = error or (
        stop.reason if stop is not None else (run_meta.final.stop_reason if run_meta and run_meta.final else None)
    )
    # The ledger replaces the reservation first, once (META's `settled`), then the trial ends: a
    # retry of a step that died between the two settles nothing again and ends the trial.
    _settle(t, meta, trial, item.budget_usd or 0.0, cost)
    t.update(
        trial_sk(trial),
        TrialItem,
        status=status,
        cost_usd=cost,
        metric=value,
        rounds=len([r for r in rounds if not r.eval_only]),
        stop_reason=item.stop_reason if status == "STOPPED" and item.stop_reason else reason,
        ended_at=place.clock(),
    )
    return EndedAnswer(trial=trial, status=status, cost_usd=cost, metric=value)


def _settle(t: StudyTable, meta: StudyItem, trial: int, share: float, cost: float) -> None:
    while trial not in meta.settled:
        changes = {
            "reserved_usd": budget.settle(meta.reserved_usd, share, cost),
            "version": meta.version + 1,
            "settled": [*meta.settled, trial],
        }
        if t.update("META", StudyItem, only_if="#version = :ver", values={":ver": meta.version}, **changes):
            return
        meta = t.study() or meta


def watch(place: Place, study_id: str) -> WatchAnswer:
    """One look at the running trials: their curves and ledgers onto their TRIAL items, ASHA at
    each rung they reached, a stop request to every running trial once the deadline has come.
    Answers whether every trial ended and the wait before the next look."""
    started = time.perf_counter()
    study, meta, t = place.study(study_id)
    trials = t.trials()
    past_deadline = place.clock() >= meta.created_at + study.deadline_seconds - budget.DEADLINE_MARGIN_S
    rungs = study.asha_rungs()
    # The values recorded at each rung so far, by every trial judged there (in its order).
    recorded: dict[int, list[float]] = {r: [] for r in rungs}
    for tr in trials:
        for rung, v in tr.rung_values.items():
            recorded.setdefault(int(rung), []).append(v)
    round_s = [
        s
        for tr in sorted(trials, key=lambda x: x.trial)
        if tr.status == "RUNNING" and (s := _look(place, study, t, tr, recorded, rungs, past_deadline))
    ]
    trials = t.trials()
    spent = sum(tr.cost_usd for tr in trials)
    best = _best(study, trials)
    # This look's own bill, and the next look paced so the watches stay within their reserve.
    cost = place.step_cost("watch", started)
    reserve_left = meta.overhead_reserve_usd - _fixed_overhead(place, study) - (meta.watch_usd + cost)
    if meta.started >= study.trials:  # no trial is left to start: what the trials do not hold pays looks too
        reserve_left += max(0.0, study.budget_usd - meta.overhead_reserve_usd - meta.reserved_usd)
    poll = budget.next_poll(
        study.poll_seconds,
        sorted(round_s)[len(round_s) // 2] if round_s else None,
        meta.created_at + study.deadline_seconds - place.clock(),
        reserve_left,
        cost,
    )
    _record_look(t, meta, cost, spent, best, sum(tr.controller_usd for tr in trials))
    return WatchAnswer(
        done=all(tr.status in ENDED for tr in trials),
        running=sum(tr.status == "RUNNING" for tr in trials),
        stopped=sum(tr.status == "STOPPED" for tr in trials),
        poll_seconds=poll,
    )


def _record_look(
    t: StudyTable, meta: StudyItem, cost: float, spent: float, best: TrialItem | None, controller_usd: float
) -> None:
    """A look's bill (and, while the study runs, the trials' spend and the best trial so far) onto
    META. The last trial's end stops the watcher's branch without waiting for a look in flight
    (`infra/stacks/study.py`), so a look can end after Finish wrote the study's result: then it
    adds only its own cost. Version-conditional, like Finish's write, so neither loses the other's."""
    while True:
        changes: dict[str, Any] = {
            "overhead_usd": meta.overhead_usd + cost,
            "watch_usd": meta.watch_usd + cost,
            "watches": meta.watches + 1,
            "version": meta.version + 1,
        }
        if meta.status == "RUNNING":
            changes.update(spent_usd=spent, total_usd=spent + meta.overhead_usd + cost + controller_usd)
            if best is not None:
                changes.update(best_trial=best.trial, best_run_id=best.run_id, best_metric=best.metric)
        else:
            changes["total_usd"] = meta.total_usd + cost
        if t.update("META", StudyItem, only_if="#version = :ver", values={":ver": meta.version}, **changes):
            return
        meta = t.study() or meta


def _fixed_overhead(place: Place, study: Study) -> float:
    """The reserve's part for the steps that are not the watcher's (init, finish, admit/ended)."""
    return budget.overhead_reserve(study.trials, 0, place.prices, place.architecture)


def _look(
    place: Place,
    study: Study,
    t: StudyTable,
    tr: TrialItem,
    recorded: dict[int, list[float]],
    rungs: list[int],
    past_deadline: bool,
) -> float | None:
    """Updates the trial's item; returns its last round's time (None before its first)."""
    run = place.run_table(tr.run_id)
    rounds = run.rounds()
    curve = _curve(rounds, study.metric_name)
    changes: dict[str, Any] = {
        "rounds": len([r for r in rounds if not r.eval_only]),
        "cost_usd": rounds[-1].cost_total_usd if rounds else tr.cost_usd,
    }
    measured = [v for v in curve.values() if v is not None]
    if measured:
        changes["metric"] = measured[-1]
    stop_reason = None
    values = dict(tr.rung_values)
    if study.search.kind == "asha" and tr.stop_reason is None:
        eta = study.search.reduction_factor
        for rung, value in asha.next_rungs(curve, rungs, tr.rung):
            verdict = asha.judge(value, rung, recorded.get(rung, []), eta, study.direction == "max")
            recorded.setdefault(rung, []).append(value)
            values[str(rung)] = value
            changes["rung"] = rung
            if not verdict.keep:
                stop_reason = verdict.reason(study.metric_name, eta)
                break
        changes["rung_values"] = values
    if stop_reason is None and past_deadline and tr.stop_reason is None:
        stop_reason = "stopped at the study's deadline"
    if stop_reason is not None:
        run.request_stop(stop_reason, by=f"study:{study.study_id}")
        changes["stop_reason"] = stop_reason
    # Only while the trial runs: its ended step (which may end it after this look read it) writes
    # its final ledger and status, which a look's round-by-round values must not overwrite.
    t.update(trial_sk(tr.trial), TrialItem, only_if="#status = :running", values={":running": "RUNNING"}, **changes)
    trained = [r.round_s for r in rounds if not r.eval_only and r.round_s > 0]
    return trained[-1] if trained else None


def _best(study: Study, trials: list[TrialItem]) -> TrialItem | None:
    """The trial with the best final metric among those that ended with a model."""
    done = [tr for tr in trials if tr.status in ("SUCCEEDED", "STOPPED") and tr.metric is not None]
    if not done:
        return None
    sign = 1.0 if study.direction == "max" else -1.0
    return max(done, key=lambda tr: (sign * (tr.metric or 0.0), -tr.trial))


def finish(place: Place, study_id: str) -> FinishAnswer:
    """Publish the best trial's final model as the study's result; META SUCCEEDED (or FAILED
    when no trial produced a model). Its bill: the trials' ledgers (`spent_usd`) and the study's
    own steps (`overhead_usd`, the trials' admit/ended included): `total_usd`."""
    started = time.perf_counter()
    study, meta, t = place.study(study_id)
    trials = t.trials()
    best = _best(study, trials)
    spent = sum(tr.cost_usd for tr in trials)
    now = place.clock()

    def close(**fields: Any) -> None:
        # Conditional on META's version: a look still in flight when the trials ended
        # (`_record_look`) may write META meanwhile; its cost is then read again, never lost.
        m = meta
        while True:
            overhead = m.overhead_usd + place.step_cost("finish", started) + sum(tr.controller_usd for tr in trials)
            bill: dict[str, Any] = {"spent_usd": spent, "overhead_usd": overhead, "total_usd": spent + overhead}
            bill.update(fields, version=m.version + 1, ended_at=now)
            if t.update("META", StudyItem, only_if="#version = :ver", values={":ver": m.version}, **bill):
                return
            m = t.study() or m

    if best is None:
        close(status="FAILED")
        return FinishAnswer(study_id=study_id, status="FAILED", spent_usd=spent)
    store = place.store
    prefix = best_prefix(study_id)
    store.copy(keys.final_model_key(best.run_id), prefix + "model.safetensors")
    answer = FinishAnswer(
        study_id=study_id,
        status="SUCCEEDED",
        best_trial=best.trial,
        best_run_id=best.run_id,
        metric=study.metric_name,
        value=best.metric,
        params=best.params,
        spent_usd=spent,
        budget_usd=study.budget_usd,
    )
    summary = answer.model_dump(mode="json", exclude={"status"})
    store.put(prefix + "metrics.json", json.dumps(summary, indent=2).encode())
    close(
        status="SUCCEEDED",
        best_trial=best.trial,
        best_run_id=best.run_id,
        best_metric=best.metric,
        best_model_key=prefix + "model.safetensors",
    )
    return answer
