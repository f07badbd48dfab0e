"""Aggregate one round: average the updates that arrived into the next global model, combine
the workers' evaluation of this round's model, price the round, decide whether to stop.

Two paths, chosen by the plan (`RoundSpec.aggregators`):

- one aggregator (`aggregate_round`): quorum check, seal, streamed weighted average of the
  accepted updates (`reduce.reduce_updates`, bit-identical to decoding them all), model r+1 as
  one object, metrics and ledger;
- k > 1 aggregators, three ops of the Aggregate function driven by the state machine:
  `prepare_round` (quorum check, seal, fix the accepted list with `commit_accepted`),
  k x `slice_round` in a Map (`reduce.aggregate_slice`: slice j of model r+1), `finish_round`
  (divergence check, metrics, ledger and stop decision, without the reduce).

Idempotent: the ROUND item is written once (conditional) and a repeated call returns it.
"""

from __future__ import annotations

import json
import math
import time

from smlt.runtime import errors as smlt_errors
from smlt.runtime import keys, ledger, metrics
from smlt.runtime.aggregate.guard import check_share, combine_checks, screen_updates
from smlt.runtime.aggregate.reduce import (
    aggregate_slice,
    apply_update,
    commit_accepted,
    is_finite,
    param_count,
    reduce_updates,
)
from smlt.runtime.bill import ledger_round
from smlt.runtime.config import Settings
from smlt.runtime.evaluation import ValMetrics, target_reached, val_metrics
from smlt.runtime.exchange import delete_prefix
from smlt.runtime.items import (
    Accepted,
    ErrorItem,
    MetaItem,
    PlanItem,
    Rejected,
    RoundItem,
    RoundTiming,
    SealItem,
    WorkerItem,
    data_error_message,
)
from smlt.runtime.job import BUILTIN_MODELS
from smlt.runtime.model_store import (
    fetch_model,
    model_sha256,
    model_source,
    sliced_model_complete,
    verified_model,
)
from smlt.runtime.records import RunTable, raise_late_user_error
from smlt.runtime.roundspec import RoundSpec
from smlt.runtime.steps.events import (
    AggregateEvent,
    FinishEvent,
    NotPrepared,
    Prepared,
    PrepareEvent,
    RoundAnswer,
    SliceAnswer,
    SliceEvent,
)
from smlt.runtime.store import NotFound, S3Store
from smlt.runtime.tensors.digest import check, sha256_hex
from smlt.runtime.tensors.format import decode, encode

MAX_ATTEMPTS = 3  # a round whose quorum fails this many times fails the run


def _fatal_worker_error(table: RunTable, rnd: int, quorum_met: bool = False) -> None:
    """Re-raise a worker's non-transient error under its own name. The user's code's error
    (UserCodeError) and a shard that failed the same way twice (DataError, CorruptShard) end the
    run whatever the quorum; another named error (bad data, model too large) when the round
    cannot reach its quorum. Any other exception a worker recorded (a WorkerError) is fatal only
    when it repeats on its shard: the plan moves that shard to another worker, a quorum retry
    runs it again."""
    errors = table.errors(rnd)
    for worker, e in sorted(errors.items()):
        if e.error == "UserCodeError":
            raise smlt_errors.UserCodeError(f"worker {worker}, round {rnd}: {e.message}")
        if e.error == "DataError":
            raise smlt_errors.DataError(e.message)
    # A worker of an earlier round that the Map stopped waiting for may record the user's error
    # later (its watchdog stopped a hung step): this round's workers read FATAL and stopped, and
    # so does the run (one read, only when a worker is missing).
    raise_late_user_error(table)
    _repeated_shard_failure(table, rnd, errors)
    if quorum_met:
        return
    named = [(w, e) for w, e in sorted(errors.items()) if e.error != "WorkerError"]
    if named:
        worker, e = named[0]
        if e.shard is not None:
            raise smlt_errors.CorruptShard(f"worker {worker}: {e.message}; {_REPAIR}")
        cls = getattr(smlt_errors, e.error, smlt_errors.SmltError)
        raise cls(f"worker {worker}: {e.message}")


_REPAIR = "prepare the dataset again (`smlt data prepare SOURCE --out FOLDER`) and start the run again"


def _repeated_shard_failure(table: RunTable, rnd: int, errors: dict[int, ErrorItem]) -> None:
    """CorruptShard when a shard that could not be read this round failed in the round before too;
    DataError when a shard raised the same exception in both (on different workers: the plan
    moved it)."""
    failed = {(e.shard.split, e.shard.index): (w, e) for w, e in sorted(errors.items()) if e.shard is not None}
    if not failed or rnd == 0:
        return
    for w0, e0 in sorted(table.errors(rnd - 1).items()):
        if e0.shard is None or (e0.shard.split, e0.shard.index) not in failed:
            continue
        w, e = failed[(e0.shard.split, e0.shard.index)]
        if e.error == "WorkerError" and e0.error == "WorkerError" and e.exception == e0.exception:
            raise smlt_errors.DataError(data_error_message(e, e0))
        if e.error == "CorruptShard" and e0.error == "CorruptShard":
            raise smlt_errors.CorruptShard(
                f"{e0.shard.split} shard {e0.shard.key} failed twice: on worker {w0} in round {rnd - 1} and on "
                f"worker {w} in round {rnd} ({e.message}); {_REPAIR}"
            )


def _recorded(table: RunTable, rnd: int) -> str:
    """The exceptions the round's workers recorded, for a QuorumNotReached message."""
    errors = table.errors(rnd)
    if not errors:
        return ""
    shown = [
        f"worker {w}: {e.message}" + (f" (on {e.shard.split} shard {e.shard.key})" if e.shard else "")
        for w, e in sorted(errors.items())[:3]
    ]
    return "the workers recorded " + "; ".join(shown)


def _model_problem(artifacts: S3Store, run_id: str, rnd: int, expected: str | None) -> str | None:
    """What is wrong with the stored model `rnd` every worker starts from, if anything (read
    only when a round has failed for good)."""
    key = keys.model_key(run_id, rnd)
    try:
        stored = fetch_model(artifacts, run_id, rnd)
        state = decode(stored.blob)
    except NotFound:
        return None if rnd == 0 else f"model {rnd} ({key}) is missing"  # round 0's is written by its workers
    except ValueError as e:  # HeaderError, or a data section shorter than its header says
        return f"model {rnd} ({key}) is unreadable ({e})"
    if not is_finite(state):
        return f"model {rnd} ({key}) holds NaN or Inf"
    try:
        check(stored.key, stored.sha256, expected, f"model {rnd}")
    except smlt_errors.DigestMismatch as e:
        return str(e)
    return None


def _quorum_advice(artifacts: S3Store, run_id: str, rnd: int, expected: str | None, recorded: str = "") -> str:
    """The cause of a round that failed for good, as far as it can be told, and what to do."""
    problem = _model_problem(artifacts, run_id, rnd, expected)
    if problem:  # a resume would start from the same model
        return f"{problem}, so every worker fails on it: start the run again (a resume would read the same model)"
    cause = recorded or (
        "none recorded a named error: they crashed, timed out or were throttled (see the worker function's logs)"
    )
    if rnd == 0:  # no checkpoint to continue from: nothing was aggregated
        return f"{cause}; no round was completed, so there is nothing to resume: start the run again once it is fixed"
    return f"{cause}; resume the run with `smlt resume {run_id}` once the cause is fixed"


class _Round:
    """What every aggregation step of a round reads first."""

    def __init__(self, settings: Settings, run_id: str, rnd: int):
        self.settings, self.run_id, self.rnd = settings, run_id, rnd
        self.table = RunTable(settings.table, run_id)
        self.artifacts = S3Store(settings.artifacts_bucket)
        # The round's own items and the previous round's (the ledger so far), in one request.
        # META: the task and target scaling the metrics are computed in.
        items = self.table.get_many(
            keys.round_sk(rnd),
            keys.seal_sk(rnd),
            keys.plan_sk(rnd),
            keys.META,
            *([keys.round_sk(rnd - 1)] if rnd > 0 else []),
        )
        self.done = items.item(keys.round_sk(rnd), RoundItem)  # aggregated already: answer it again
        self.seal_item = items.item(keys.seal_sk(rnd), SealItem)
        self._plan = items.item(keys.plan_sk(rnd), PlanItem)
        self.meta = items.item(keys.META, MetaItem)
        self.previous = items.item(keys.round_sk(rnd - 1), RoundItem) if rnd > 0 else None
        self._reported: list[WorkerItem] | None = None  # the workers' records read by the quorum check
        self.outcomes: list[dict] = []  # the Map's outcomes (single aggregator): how a worker ended

    @property
    def plan_item(self) -> PlanItem:
        """The round's train plan (the aggregator has nothing to do without one)."""
        if self._plan is None or self._plan.spec is None:
            raise RuntimeError(
                f"round {self.rnd} of run {self.run_id} has no training plan "
                f"({keys.plan_sk(self.rnd)}); nothing to aggregate"
            )
        return self._plan

    @property
    def spec(self) -> RoundSpec:
        spec = self.plan_item.spec
        assert spec is not None  # plan_item has one
        return spec

    def quorum_retry(self) -> RoundAnswer | None:
        """The retry answer when fewer than the quorum reported and the round is not sealed yet."""
        spec, table, rnd = self.spec, self.table, self.rnd
        needed = max(1, math.ceil(spec.job.training.quorum * spec.workers))
        reported = table.workers(rnd)
        if len(reported) >= needed or self.seal_item is not None:
            if len(reported) < spec.workers:  # a worker failed: on a shard that failed before?
                _fatal_worker_error(table, rnd, quorum_met=True)
            self._reported = reported
            return None
        _fatal_worker_error(table, rnd)
        # The attempt the Map ran is counted once: an invocation of this Aggregate that died after
        # counting it left `attempts` past `handed_out` (Plan catches it up when it hands out the next).
        plan = self.plan_item
        attempts = plan.handed_out
        if plan.attempts <= attempts:
            table.update(
                keys.plan_sk(rnd),
                PlanItem,
                attempts=attempts + 1,
                only_if="attribute_not_exists(#attempts) OR #attempts = :n",
                values={":n": attempts},
            )
        if attempts + 1 >= MAX_ATTEMPTS:
            raise smlt_errors.QuorumNotReached(
                f"round {rnd}: fewer than {needed} of {spec.workers} workers reported, {MAX_ATTEMPTS} times; "
                + _quorum_advice(self.artifacts, self.run_id, rnd, self.model_digest, _recorded(table, rnd))
            )
        self.clear_sync()  # the retried round's exchange starts clean
        return RoundAnswer(round=rnd, stop=False, retry=True, reason=f"quorum not reached (attempt {attempts + 1})")

    def seal(self) -> list[WorkerItem]:
        """Close the round: from here on a worker's record can no longer land (see
        put_unless_sealed), so the records read after the seal are exactly the ones that count."""
        was_sealed = self.seal_item is not None
        if not was_sealed:
            _, self.seal_item = self.table.put_once(keys.seal_sk(self.rnd), SealItem(sealed_at=time.time()))
        records = self._reported
        # Records read before the seal are final when the round was already sealed then, or when
        # every worker had reported (each writes once); otherwise read them again.
        if records is None or not (was_sealed or len({r.worker for r in records}) >= self.spec.workers):
            records = self.table.workers(self.rnd)
        return sorted(records, key=lambda r: r.worker)

    def sealed_at(self) -> float | None:
        # read with the round's items, or written by seal()
        return self.seal_item.sealed_at if self.seal_item else None

    @property
    def model_digest(self) -> str | None:
        """The digest model r must have: recorded by round r-1's aggregator (ROUND r-1), or in
        round 0 by the first worker that held it (META); None for items older than digests."""
        if self.rnd == 0:
            return self.meta.model0_sha256 if self.meta else None
        return self.previous.model_sha256 if self.previous else None

    def model(self) -> bytes:
        """Model r's bytes, checked against its recorded digest (DigestMismatch naming the object
        and both digests)."""
        return verified_model(self.artifacts, self.run_id, self.rnd, self.model_digest).blob

    def update_key(self, worker: int) -> str:
        return keys.update_key(self.run_id, self.rnd, int(worker))

    def nonfinite_updates(self, workers: list[int]) -> list[int]:
        """Workers whose update has NaN or Inf (read one at a time; only on the divergence path)."""
        return [w for w in workers if not is_finite(decode(self.artifacts.get(self.update_key(w))))]

    def clear_sync(self) -> None:
        """Per-step mode: delete the round's gradient exchange objects."""
        if self.spec.job.training.mode == "sync":
            delete_prefix(self.settings.exchange_store(), keys.sync_prefix(self.run_id, self.rnd))

    def diverged(self, reason: str) -> None:
        """Fall back to the last good model (this round's) and halve the learning rate, once. A
        rate halved with no earlier round diverged is this round's own halving: an aggregation that
        died after it (before its ROUND item) runs again, and its divergence is still the first."""
        meta = self.table.meta()
        if (
            meta is not None
            and meta.lr_scale < 1.0
            and any(r.diverged for r in self.table.rounds() if r.round < self.rnd)
        ):
            name = self.spec.job.model.name
            own = (
                ""
                if name in BUILTIN_MODELS
                else f", or make model.name {name!r} finite for any weights training gives it (a log or sqrt of a "
                "parameter gone negative, a division by one gone to zero gives NaN whatever the learning rate)"
            )
            raise smlt_errors.Diverged(
                f"round {self.rnd}: {reason} again after halving the learning rate to "
                f"{self.spec.learning_rate:g}; lower training.learning_rate{own}"
            )
        self.table.update(keys.META, MetaItem, lr_scale=0.5)

    def evaluation_chain(self, records: list[WorkerItem]) -> list[WorkerItem]:
        """The records whose evaluations make this round's metric. A partial evaluation round is
        planned again with the same workers on the same model (an evaluation round writes model r as
        r+1), so each worker's slice is the same: a slice missing here is taken from the repeats
        before, read only when this one is partial too."""
        spec = self.spec
        if not spec.eval_only or spec.whole_split(sum(r.val_count for r in records)):
            return records
        by_worker = {r.worker: r for r in records}
        rnd, prev = self.rnd - 1, self.previous
        while prev is not None and prev.eval_only and prev.val_loss is None and prev.workers == spec.workers:
            for r in self.table.workers(rnd):
                by_worker.setdefault(r.worker, r)
            rnd -= 1
            prev = self.table.get(keys.round_sk(rnd), RoundItem) if rnd >= 0 else None
        return sorted(by_worker.values(), key=lambda r: r.worker)

    def val_metrics(self, evaluated: list[WorkerItem]) -> ValMetrics:
        """The round's metrics from the workers' sums, in the dataset's units (META's task and
        target scaling; a run without META is taken as classification, as before there was one)."""
        meta = self.meta
        k = max((len(r.val_class_count) for r in evaluated), default=0)
        return val_metrics(
            sum(r.val_loss_sum for r in evaluated),
            sum(r.val_correct for r in evaluated),
            sum(r.val_count for r in evaluated),
            task=meta.task if meta else "classification",
            outputs=meta.outputs if meta else 1,
            target=meta.target if meta else None,
            class_correct=[sum(r.val_class_correct[c] for r in evaluated if r.val_class_correct) for c in range(k)],
            class_count=[sum(r.val_class_count[c] for r in evaluated if r.val_class_count) for c in range(k)],
        )

    def record(
        self,
        records: list[WorkerItem],
        ledger: list[Accepted],
        diverged: str,
        n_params: int,
        aggregate_s: float,
        aggregators: int = 1,
        *,
        rejected: list[Rejected] | None = None,
        model_sha256: str | None = None,
    ) -> RoundAnswer:
        """Combine the workers' evaluation, price the round, decide whether to stop, write the
        ROUND item (once) and answer it."""
        spec, table, rnd = self.spec, self.table, self.rnd
        plan_item = self.plan_item
        failed = max(0, spec.workers - len(records))
        evaluated = self.evaluation_chain(records)
        val_count = sum(r.val_count for r in evaluated)
        measured = self.val_metrics(evaluated)
        whole = spec.whole_split(val_count)
        partial = {} if whole else {f"{k}_partial": v for k, v in measured.model_dump().items()}
        if not whole:  # a failed worker's slice is missing: not a metric of the split
            measured = ValMetrics()
        samples = sum(a.samples for a in ledger)
        losses = {r.worker: r.train_loss for r in records if r.train_loss is not None}  # an applied update's is
        train_loss = sum(losses[a.worker] * a.samples for a in ledger) / samples if samples else None

        if spec.eval_only and not whole:
            # Continue plans the evaluation again (model r+1 is model r): the final metric needs all rows.
            stop, reason = (
                False,
                f"final evaluation on {val_count} of {spec.val_rows} validation rows; evaluating again",
            )
        elif spec.eval_only:
            stop, reason = True, plan_item.stop_reason or "final evaluation"
        elif target_reached(spec.job.training, measured):
            stop, reason = True, f"target {spec.job.training.target_metric} {spec.job.training.target_value} reached"
        elif diverged:
            stop, reason = False, f"diverged: {diverged}; back to the last good model, learning rate halved"
        else:
            stop, reason = False, ""

        self.clear_sync()
        cost, late = _round_ledger(self, aggregators)
        item = RoundItem(
            round=rnd,
            workers=spec.workers,
            workers_ok=len(records),
            workers_failed=failed,
            memory_mb=spec.memory_mb,
            local_steps=spec.local_steps,
            batch_size=spec.job.training.batch_size,
            eval_only=spec.eval_only,
            diverged=bool(diverged),
            samples=samples,
            accepted=ledger,
            rejected=rejected or [],
            train_loss=train_loss,
            **measured.model_dump(),
            val_rows=val_count,
            val_rows_total=spec.val_rows,
            **partial,
            aggregate_s=aggregate_s,
            aggregators=aggregators,
            round_s=time.time() - spec.planned_at,
            cost_usd=cost,
            # the ledger so far, with what last round's stragglers have added since it was priced
            cost_total_usd=cost + late + (self.previous.cost_total_usd if self.previous else 0.0),
            param_count=n_params,
            stop=stop,
            reason=reason,
            plan_reason=spec.reason,
            time_limit_s=spec.compute_limit_s,
            finished_at=time.time(),
            timings=[RoundTiming.of(r) for r in records] + _failed_timings(self.outcomes, records, spec.memory_mb),
            flops_per_sample=next((r.flops_per_sample for r in records if r.flops_per_sample), None),
            activation_mb=max((r.activation_mb for r in records if r.activation_mb), default=None),
            model_sha256=model_sha256,
        )
        _, stored = table.put_once(keys.round_sk(rnd), item)
        # The dashboard's metrics of the round (smlt.runtime.metrics), published by the handler.
        metrics.add_round(self.run_id, stored, spec.job.constraints.budget_usd)
        return _answer(stored)


def _failed_timings(outcomes: list[dict], records: list[WorkerItem], memory_mb: int) -> list[RoundTiming]:
    """The workers the Map reports failed that left no record, as the planner reads them (its
    straggler tail counts those cut off at the limit; a tier that ran out of memory is dropped)."""
    reported = {r.worker for r in records}
    failed = {o.get("worker"): str(o.get("error") or "") for o in outcomes if not o.get("ok", True)}
    return [
        RoundTiming(worker=w, memory_mb=memory_mb, samples=0, error=_planner_error(e))
        for w, e in sorted(failed.items())
        if isinstance(w, int) and w not in reported
    ]


def _planner_error(error: str) -> str:
    if error in ledger.TIMEOUTS:
        return "TimeLimit"
    if "OutOfMemory" in error:
        return "OutOfMemory"
    return error or "Unknown"


def _round_ledger(r: _Round, aggregators: int) -> tuple[float, float]:
    """The round's bill from its ATTEMPT items (smlt.runtime.ledger; a worker that left none estimated,
    and its estimate stored), this invocation priced as it will end (the ROUND item still to
    write), and what round r-1's late attempts (stragglers) added since it was priced."""
    s, spec, rnd = r.settings, r.spec, r.rnd
    attempts = ledger.from_items(r.table.query(ledger.round_prefix(rnd)))
    missing = ledger.estimate_missing(spec.workers, spec.memory_mb, rnd, attempts, r.outcomes, s.worker_timeout_s)
    for m in missing:
        r.table.put_once(f"{ledger.round_prefix(rnd)}{m.request_id}", m)
    own = ledger.in_progress(s.aggregate_memory_mb, {"dynamodb.PutItem": 1}, "aggregate")
    priced = attempts + missing + ([own] if own else [])
    shape = ledger_round(r.settings, spec.workers, aggregators, spec.eval_only)
    cost = ledger.breakdown(priced, ledger.round_transitions(priced, shape), s.prices, s.architecture).total_usd
    late = 0.0
    if r.previous is not None:
        prev = ledger.from_items(r.table.query(ledger.round_prefix(rnd - 1)))
        shape = ledger_round(r.settings, r.previous.workers, r.previous.aggregators, r.previous.eval_only)
        bd = ledger.breakdown(prev, ledger.round_transitions(prev, shape), s.prices, s.architecture)
        late = bd.total_usd - r.previous.cost_usd
    return cost, late


def _ledger(accepted: list[WorkerItem]) -> list[Accepted]:
    return [Accepted(worker=a.worker, samples=a.samples) for a in accepted]


def aggregate_round(settings: Settings, event: AggregateEvent) -> RoundAnswer:
    """The single aggregator: everything in one invocation."""
    t0 = time.perf_counter()
    run_id, rnd = event.run_id, event.round
    r = _Round(settings, run_id, rnd)
    r.outcomes = event.outcomes
    if r.done is not None:  # a repeated aggregation returns the first one's answer
        return _answer(r.done)
    retry = r.quorum_retry()
    if retry is not None:
        return retry
    records = r.seal()
    spec = r.spec

    # Model r may be one object or slices (written by k aggregators last round).
    global_blob = r.model()
    global_state = decode(global_blob)
    accepted = [x for x in records if x.samples > 0]
    ledger: list[Accepted] = []
    rejected: list[Rejected] = []
    diverged = ""
    new_blob = global_blob
    if not spec.eval_only and accepted:
        reduced, ledger, rejected, diverged = _reduce(r, global_state, accepted)
        new_blob = reduced if reduced is not None else global_blob
    if diverged:
        r.diverged(diverged)
    r.artifacts.put(keys.model_key(run_id, rnd + 1), new_blob, if_absent=True)
    n_params, aggregate_s = param_count(global_state), time.perf_counter() - t0
    return r.record(
        records, ledger, diverged, n_params, aggregate_s, rejected=rejected, model_sha256=sha256_hex(new_blob)
    )


def _reduce(
    r: _Round, global_state: dict, accepted: list[WorkerItem]
) -> tuple[bytes | None, list[Accepted], list[Rejected], str]:
    """Model r+1 from the reported updates: (its bytes, None when model r carries over; the
    ledger; the refused updates; why the round diverged or ""). An update whose digest does not
    match its record, or far outside the round's norms, is refused first (`guard.screen_updates`);
    NaN/Inf rejects the round."""
    bad = [x.worker for x in accepted if not x.finite]
    if bad:
        return None, [], [], f"NaN/Inf loss or update from worker(s) {sorted(bad)}"
    screened = screen_updates(r.artifacts, accepted, r.update_key)
    if not screened.accepted:  # every update refused: model r carries over
        return None, [], screened.rejected, ""
    # From the bytes the guard read (one GET per update), summed blockwise, bit-identical to decoding all.
    chosen = screened.accepted
    avg = reduce_updates(screened.reader, [r.update_key(x.worker) for x in chosen], [float(x.samples) for x in chosen])
    new_state = apply_update(global_state, avg, r.spec.job.training.server_lr)
    if is_finite(new_state):
        return encode(new_state), _ledger(chosen), screened.rejected, ""
    bad = r.nonfinite_updates([x.worker for x in chosen])
    why = f"NaN/Inf loss or update from worker(s) {sorted(bad)}" if bad else "the averaged model has NaN/Inf"
    return None, [], screened.rejected, why


def prepare_round(settings: Settings, event: PrepareEvent) -> Prepared | NotPrepared:
    """Sharded aggregation, step 1: quorum check, seal, fix the accepted updates.

    Answers {"proceed": true, ...} when the slices should run, else (a quorum retry, or a round
    already aggregated) the aggregate answer with "proceed": false."""
    run_id, rnd = event.run_id, event.round
    r = _Round(settings, run_id, rnd)
    not_yet = _answer(r.done) if r.done is not None else r.quorum_retry()
    if not_yet is not None:
        return NotPrepared(**not_yet.model_dump())
    records = r.seal()
    accepted = [] if r.spec.eval_only else [x for x in records if x.samples > 0]
    committed = commit_accepted(r.artifacts, run_id, rnd, [a.model_dump() for a in _ledger(accepted)])
    return Prepared(round=rnd, accepted=len(committed), aggregators=r.spec.aggregators)


def slice_round(settings: Settings, event: SliceEvent) -> SliceAnswer:
    """Sharded aggregation, step 2 (one of k in parallel): slice j of model r+1."""
    run_id, rnd, j, k = event.run_id, event.round, event.slice, event.of
    r = _Round(settings, run_id, rnd)
    try:
        accepted = json.loads(r.artifacts.get(keys.accepted_key(run_id, rnd)))
    except NotFound:
        raise RuntimeError(
            f"round {rnd}: no accepted list ({keys.accepted_key(run_id, rnd)}); the prepare step must run first"
        ) from None
    _check_share(r, accepted, j, k)  # before the slice: a slice that exists has its check
    try:
        info = aggregate_slice(r.artifacts, run_id, rnd, j, k, accepted, r.spec.job.training.server_lr)
    except FloatingPointError:
        return SliceAnswer(slice=j, finite=False)  # nothing written: finish sees an incomplete model
    return SliceAnswer(slice=j, finite=True, seconds=round(info["seconds"], 4), skipped=info["skipped"])


def _check_share(r: _Round, accepted: list[dict], j: int, k: int) -> None:
    """Slice aggregator j's share of the update checks (`guard.check_share`), written once."""
    key = keys.check_key(r.run_id, r.rnd, j)
    if not accepted or r.artifacts.exists(key):
        return
    committed = {int(a["worker"]) for a in accepted}
    records = [x for x in r.table.workers(r.rnd) if x.worker in committed]
    r.artifacts.put(key, json.dumps(check_share(r.artifacts, records, r.update_key, j, k)).encode(), if_absent=True)


def _sharded_refusals(r: _Round, committed: list[Accepted]) -> dict[int, str]:
    """The refusals the slice aggregators' checks add up to (none when a check is missing: the
    round then has a missing slice too, which carries model r over)."""
    if not committed:
        return {}
    checks = []
    for j in range(r.spec.aggregators):
        try:
            checks.append(json.loads(r.artifacts.get(keys.check_key(r.run_id, r.rnd, j))))
        except NotFound:
            return {}
    return combine_checks(checks)


def _reduce_without(
    r: _Round, committed: list[Accepted], records: list[WorkerItem]
) -> tuple[list[Accepted], list[Rejected], str]:
    """A sharded round that refused an update: its slices averaged it, so model r+1 is made again
    from the others by the single aggregator's path, as ONE object (it wins over the slices). Slow
    (every update read whole here), and only when an update is refused."""
    chosen = {a.worker for a in committed}
    accepted = [x for x in records if x.worker in chosen]
    global_blob = r.model()
    reduced, ledger, rejected, diverged = _reduce(r, decode(global_blob), accepted)
    r.artifacts.put(keys.model_key(r.run_id, r.rnd + 1), reduced or global_blob, if_absent=True)
    return ledger, rejected, diverged


def finish_round(settings: Settings, event: FinishEvent) -> RoundAnswer:
    """Sharded aggregation, step 3: divergence check, metrics, ledger, stop decision."""
    run_id, rnd = event.run_id, event.round
    r = _Round(settings, run_id, rnd)
    if r.done is not None:
        return _answer(r.done)
    records = r.seal()  # normally sealed by prepare already: this only reads the records
    spec = r.spec
    try:
        committed = [Accepted.model_validate(a) for a in json.loads(r.artifacts.get(keys.accepted_key(run_id, rnd)))]
    except NotFound:
        raise RuntimeError(f"round {rnd}: finish without prepare (no {keys.accepted_key(run_id, rnd)})") from None
    diverged = ""
    nonfinite = {x.worker for x in records if not x.finite}
    if committed:
        bad = [a.worker for a in committed if a.worker in nonfinite]
        if not bad and not sliced_model_complete(r.artifacts, run_id, rnd + 1):
            # a slice refused to write NaN/Inf: name the workers whose update has them
            bad = r.nonfinite_updates([a.worker for a in committed])
            if not bad:
                diverged = "the averaged model has NaN/Inf"
        if bad:
            diverged = f"NaN/Inf loss or update from worker(s) {sorted(int(w) for w in bad)}"
    model_next = keys.model_key(run_id, rnd + 1)
    rejected: list[Rejected] = []
    if not diverged and sliced_model_complete(r.artifacts, run_id, rnd + 1) and _sharded_refusals(r, committed):
        committed, rejected, diverged = _reduce_without(r, committed, records)
    if diverged:
        r.diverged(diverged)
        # The last good model as ONE object: it wins over any slices that were written.
        r.artifacts.put(model_next, r.model(), if_absent=True)
    elif not sliced_model_complete(r.artifacts, run_id, rnd + 1) and not r.artifacts.exists(model_next):
        r.artifacts.put(model_next, r.model(), if_absent=True)
    ledger = [] if diverged else committed
    kind, src = model_source(r.artifacts, run_id, rnd)
    n_params = src.numel
    sealed = r.sealed_at()
    aggregate_s = max(0.0, time.time() - sealed) if sealed else 0.0
    digest = model_sha256(r.artifacts, run_id, rnd + 1)  # as stored: one object, or the slices' parts
    return r.record(
        records,
        ledger,
        diverged,
        n_params,
        aggregate_s,
        aggregators=spec.aggregators,
        rejected=rejected,
        model_sha256=digest,
    )


def _answer(item: RoundItem) -> RoundAnswer:
    """What Continue is told of an aggregated round: metrics to 6 decimals, None for NaN."""

    def num(v: float | None) -> float | None:
        return None if v is None or math.isnan(v) else round(float(v), 6)

    return RoundAnswer(
        round=item.round,
        stop=item.stop,
        reason=item.reason,
        val_accuracy=num(item.val_accuracy),
        val_loss=num(item.val_loss),
        cost_usd=num(item.cost_usd),
    )
