"""One worker's round: evaluate the global model on a validation slice, take k local SGD steps
on the worker's shards, write the delta (safetensors) and the timings.

The shards stream through `smlt.runtime.data.loader` (the next one read while the current one trains),
so memory holds a few shards, not the worker's slice. Deterministic: the sample order is seeded
by (job seed, round, worker), so a retried or duplicated invocation computes the same update,
and the conditional writes keep the first.
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from botocore.exceptions import BotoCoreError, ClientError
from torch import Tensor, nn

from smlt.runtime import keys, ledger
from smlt.runtime.capacity import memory_needed_mb, shard_bytes_held, torch_threads
from smlt.runtime.config import Settings
from smlt.runtime.data.inputs import model_input
from smlt.runtime.data.loader import Arrays, Key, Prefetcher, ShardReader, eval_batches, first_train_key, train_batches
from smlt.runtime.data.manifest import Manifest, ShardInfo
from smlt.runtime.data.shards import ShardCache, check_pinned, load_manifest, manifest_sha256
from smlt.runtime.errors import (
    FIX_AND_START_AGAIN,
    AccessDenied,
    CorruptShard,
    DataError,
    DigestMismatch,
    InvalidDataset,
    InvalidJob,
    ModelTooLarge,
    StaleInvocation,
    StoreUnavailable,
    UserCodeError,
)
from smlt.runtime.evaluation import MAX_CLASS_SUMS
from smlt.runtime.exchange import Poll, ReduceScatter
from smlt.runtime.items import (
    ErrorItem,
    MetaItem,
    PlanItem,
    RoundTiming,
    SealItem,
    ShardRef,
    WorkerItem,
    data_error_message,
)
from smlt.runtime.job import BUILTIN_MODELS, Job
from smlt.runtime.model_store import StoredModel, fetch_model, verified_model
from smlt.runtime.records import RunTable
from smlt.runtime.roundspec import RoundSpec
from smlt.runtime.steps.events import TrainAnswer, TrainEvent
from smlt.runtime.store import NotFound, S3Store
from smlt.runtime.tensors.digest import check, sha256_hex
from smlt.runtime.tensors.torch_state import bytes_to_state, compress_torch_state, state_to_bytes, update_delta
from smlt.runtime.train.augment import build_augment
from smlt.runtime.train.leak import check_growth
from smlt.runtime.train.measure import Footprint, footprint
from smlt.runtime.train.models import build_model, check_trainable, form_difference, reset_torch_defaults, state_form
from smlt.runtime.train.watchdog import MIN_STALL_S, STALL_MARGIN, Stalled, Watchdog
from smlt.runtime.usercode import (
    activate_code,
    load_transform,
    model_failure,
    user_code_failure,
    user_trace,
)

_COLD = True  # first invocation in this process (a cold start on Lambda)


def _optimizer(params, spec: RoundSpec) -> torch.optim.Optimizer:
    t = spec.job.training
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.learning_rate, momentum=t.momentum, weight_decay=t.weight_decay)
    cls = torch.optim.Adam if t.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=spec.learning_rate, weight_decay=t.weight_decay)


def balanced_weights(counts: list[int], outputs: int) -> torch.Tensor:
    """Each class's weight in the training loss: train rows / (classes x its rows), 0 for a class
    without train rows (scikit-learn's "balanced": the weights average to 1 over the rows)."""
    n = torch.zeros(outputs, dtype=torch.float64)
    n[: len(counts)] = torch.tensor(counts[:outputs], dtype=torch.float64)
    present = int((n > 0).sum())
    return torch.where(n > 0, n.sum() / (present * n.clamp(min=1)), 0.0).float()


def _train_loss_fn(job: Job, manifest: Manifest) -> nn.Module:
    """The training loss: the task's, its classes weighed when the job says so."""
    if job.training.class_weights == "balanced" and manifest.train.class_counts is not None:
        weight = balanced_weights(manifest.train.class_counts, manifest.outputs)
        return nn.CrossEntropyLoss(weight=weight, reduction="sum")
    return _loss_fn(manifest.task)


def _loss_fn(task: str) -> nn.Module:
    return nn.CrossEntropyLoss(reduction="sum") if task == "classification" else nn.MSELoss(reduction="sum")


class ModelRaised(Exception):
    """The job's own model (not a built-in) raised in its forward or backward pass: the exception
    is this one's `__cause__`, the user's error even when none of its frames are in the user's
    files (a `nn.Sequential` of torch's layers given a batch of one row in training mode)."""


def _own(job: Job) -> bool:
    return job.model.name not in BUILTIN_MODELS


@contextmanager
def _model_runs(own: bool) -> Iterator[None]:
    """Around the model's own passes: what they raise is ModelRaised when the model is the user's."""
    if not own:
        yield
        return
    try:
        yield
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's model may raise anything
        if "can't allocate memory" in str(e):  # torch's allocator: the tier, not the code
            raise
        raise ModelRaised(f"{type(e).__name__}: {e}") from e


def _floating(out: Tensor, name: str) -> Tensor:
    """The model's output, when the loss can take it (the client's check names this in full)."""
    if not out.is_floating_point():
        raise InvalidJob(
            f"model.name: {name!r} gives {str(out.dtype).removeprefix('torch.')} outputs; the loss needs "
            "floating-point logits or values: return the last layer's output as it is"
        )
    return out


def _own_output(out: object, rows: int, manifest: Manifest, name: str, batch: str) -> Tensor:
    """The user's model's output for a batch of `rows`, when it is what the loss takes: (rows,
    outputs), floating point. The client's check saw it so on a few samples; a forward whose output
    changes with the batch or over the calls is the user's code (UserCodeError, not retried), not
    a shard's data that a loss error on the wrong shape blamed after three quorum attempts."""
    want = (rows, manifest.outputs)
    if isinstance(out, Tensor) and tuple(out.shape) == want:
        return _floating(out, name)
    got = f"outputs of shape {tuple(out.shape)}" if isinstance(out, Tensor) else f"a {type(out).__name__}"
    per = "class" if manifest.task == "classification" else "target"
    raise UserCodeError(
        f"model.name {name!r} gave {got} for a {batch} batch of {rows} rows; smlt needs {want}: one output per "
        f"{per} and sample (the client's check got (rows, {manifest.outputs}) from it: does its output's shape change "
        f"with the batch or over the calls?)\n{FIX_AND_START_AGAIN}"
    )


@dataclass
class _Evaluated:
    """Sums over a worker's validation rows, so the round's metrics weigh every row alike however
    the rows were batched; per class too (classification, up to MAX_CLASS_SUMS classes)."""

    loss: float = 0.0
    correct: int = 0
    count: int = 0
    class_correct: list[int] = field(default_factory=list)
    class_count: list[int] = field(default_factory=list)


def _evaluate(
    model: nn.Module,
    batches: Iterator[Arrays],
    manifest: Manifest,
    job: Job | None = None,
    watchdog: Watchdog | None = None,
) -> _Evaluated:
    """With `job`, what the user's own model raises is ModelRaised; with `watchdog`, a batch's
    forward that runs far past the job's measured steps is a UserCodeError (`_watched`)."""
    model.eval()
    loss_fn, classification = _loss_fn(manifest.task), manifest.task == "classification"
    k = manifest.outputs if classification and manifest.outputs <= MAX_CLASS_SUMS else 0
    sums = _Evaluated()
    per_class_correct, per_class_count = torch.zeros(k, dtype=torch.int64), torch.zeros(k, dtype=torch.int64)
    own, name = (job is not None and _own(job)), job.model.name if job is not None else ""
    with torch.no_grad():
        for x, y in batches:
            with _watched(watchdog, len(x), job, "validation"), _model_runs(own):
                out = model(torch.from_numpy(model_input(manifest, x)))
            if own:
                out = _own_output(out, len(x), manifest, name, "validation")
            target = torch.from_numpy(y)
            sums.loss += float(loss_fn(out, target))
            if classification:
                right = out.argmax(1) == target
                sums.correct += int(right.sum())
                if k:
                    per_class_count += torch.bincount(target, minlength=k)[:k]
                    per_class_correct += torch.bincount(target[right], minlength=k)[:k]
            sums.count += len(x)
    if k:
        sums.class_correct, sums.class_count = per_class_correct.tolist(), per_class_count.tolist()
    return sums


def _metadata(head: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file from its first bytes (the header)."""
    n = int.from_bytes(head[:8], "little")
    return json.loads(head[8 : 8 + n]).get("__metadata__", {})


def _check_fits(model: nn.Module, memory_mb: int, data_bytes: int, activation_mb: float = 0.0, batch: int = 0) -> None:
    """Raise ModelTooLarge when training cannot fit the function's memory
    (`smlt.runtime.capacity.memory_needed_mb`, the rule the planner and the simulator use too)."""
    params = sum(p.numel() for p in model.parameters())
    need_mb = memory_needed_mb(params, data_bytes=data_bytes, activation_mb=activation_mb)
    if memory_mb and need_mb > memory_mb:
        acts = f" ({activation_mb:,.0f} MB of it activations for a batch of {batch})" if activation_mb else ""
        smaller = ", a smaller training.batch_size" if activation_mb else ""
        raise ModelTooLarge(
            f"the model has {params / 1e6:.1f}M parameters; training it needs about "
            f"{need_mb:,.0f} MB{acts}, more than the {memory_mb} MB memory tier "
            f"(choose a larger workers.memory_mb{smaller}, or let the planner choose)"
        )


def _measure_and_check(
    spec: RoundSpec, model: nn.Module, manifest: Manifest, memory_mb: int, shards: list[ShardInfo]
) -> Footprint:
    """The model's measured footprint, checked against the memory tier: first the parameters
    alone (a model far too large is refused before measuring it), then with the activations of
    the job's batch. In memory at once: the shard in use and the next one (twice while it is
    parsed), never the whole slice."""
    data_bytes = int(shard_bytes_held(max((sh.bytes for sh in shards), default=0)))
    _check_fits(model, memory_mb, data_bytes)
    key = (
        spec.job.model.model_dump_json(),
        manifest.x.model_dump_json(),
        manifest.y.model_dump_json(),
        manifest.outputs,
        spec.job.code.sha256 if spec.job.code else None,  # the same model name in two code packages
    )
    with _model_runs(_own(spec.job)):
        fp = footprint(key, model, manifest, _loss_fn(manifest.task))
    batch = spec.job.training.batch_size
    _check_fits(model, memory_mb, data_bytes, fp.activation_mb(batch), batch)
    return fp


def _sync_exchange(
    settings: Settings, spec: RoundSpec, model: nn.Module, run_id: str, rnd: int, worker: int
) -> Callable[[int, int], None] | None:
    """Per-step synchronous mode: a function (step, weight) that replaces the parameters'
    gradients with their weighted mean over all workers (reduce-scatter through the store).
    None in local SGD mode."""
    t = spec.job.training
    if t.mode != "sync":
        return None
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    rs = ReduceScatter(
        settings.exchange_store(),
        keys.sync_prefix(run_id, rnd),
        spec.workers,
        worker,
        numel,
        codec=t.compression,
        poll=Poll(timeout=spec.time_limit_s or 120.0),
    )

    def exchange(step: int, weight: int) -> None:
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        avg = torch.from_numpy(rs.allreduce(step, flat.detach().numpy(), weight=float(weight)))
        pos = 0
        for p in params:
            n = p.numel()
            p.grad = avg[pos : pos + n].view_as(p).clone()
            pos += n

    return exchange


Transform = Callable[[Tensor], Tensor]  # a training batch's model input -> the input trained on


@contextmanager
def _watched(watchdog: Watchdog | None, rows: int, job: Job | None, batch: str) -> Iterator[None]:
    """Around one call into the user's code on a `batch` ("training": transform, forward and
    backward; "validation": forward) of `rows` rows: stopped when it runs far past the job's
    measured steps (`smlt.runtime.train.watchdog`), UserCodeError naming where it was."""
    if watchdog is None or job is None or not watchdog.enabled:  # smlt's own model: nothing to stop
        yield
        return
    basis = watchdog.per_row_s
    with watchdog.call(rows, batch == "training") as limit:
        try:
            yield
        except Stalled as e:
            raise _stalled(e, job, rows, batch, limit, basis) from None


def _stalled(e: Stalled, job: Job, rows: int, batch: str, limit: float | None, basis: float | None) -> UserCodeError:
    """The user's code stopped by the watchdog after `limit` s, as their error: where it was."""
    steps = "a training step's transform, forward and backward" if batch == "training" else "a validation forward"
    code = f"model.name {job.model.name!r}" + (
        f" (with code.transform {job.code.transform!r})" if job.code and job.code.transform else ""
    )
    if basis is not None:
        b = job.training.batch_size
        why = (
            f"{STALL_MARGIN:g}x the slowest training step this job measured ({basis * b:.3g} s for {b} rows), "
            f"at least {MIN_STALL_S:g} s"
        )
    else:
        why = "all this worker's invocation had left, less the time to record this (no step of the job measured yet)"
    trace = user_trace(e, job) or "  (stopped with no frame in your files: inside torch, or between your calls)"
    text = (
        f"your code hung: {steps} of {code} on {rows} rows did not finish in {limit or 0:.3g} s ({why}); "
        f"stopped at:\n{trace}\nan endless loop, a sleep or a read that waits, after some calls? "
        f"(the client's check ran it on a few samples only)\n{FIX_AND_START_AGAIN}"
    )
    error = UserCodeError(text)
    error.type = "Hung"
    return error


def _local_steps(
    spec: RoundSpec,
    model: nn.Module,
    batches: Iterator[Arrays],
    manifest: Manifest,
    sync: Callable[[int, int], None] | None,
    t0: float,
    transform: Transform | None = None,
    watchdog: Watchdog | None = None,
) -> tuple[int, float, bool]:
    """Local SGD steps, one per batch (`transform`, e.g. augmentation, applied to each training
    batch after `model_input`): (samples trained on, mean train loss, whether the compute limit
    cut the steps short). With `watchdog`, a step's transform, forward and backward that run far
    past the job's measured steps are a UserCodeError naming where they were (`_watched`)."""
    model.train()
    opt = _optimizer(model.parameters(), spec)
    loss_fn = _train_loss_fn(spec.job, manifest)
    # Stop early rather than be cut off: Step Functions abandoning a straggler does not stop
    # its Lambda's bill, so the worker keeps to the planner's limit itself (not in sync mode,
    # where every worker must take every step).
    stop_at = t0 + 0.8 * spec.compute_limit_s if spec.compute_limit_s and sync is None else math.inf
    samples, train_loss, cut = 0, 0.0, False
    own, name = _own(spec.job), spec.job.model.name
    for step, (x, y) in enumerate(batches):
        with _watched(watchdog, len(x), spec.job, "training"):
            xb = torch.from_numpy(model_input(manifest, x))
            if transform is not None:
                xb = transform(xb)
            opt.zero_grad(set_to_none=True)
            with _model_runs(own):
                out = model(xb)
            if own:
                out = _own_output(out, len(x), manifest, name, "training")
            loss = loss_fn(out, torch.from_numpy(y))
            with _model_runs(own):
                (loss / len(x)).backward()
        if sync is not None:  # per-step mode: every worker steps with the averaged gradient
            sync(step, len(x))
        opt.step()
        train_loss += loss.item()
        samples += len(x)
        if time.perf_counter() > stop_at and step + 1 < spec.local_steps:  # before the next batch is read
            cut = True
            break
    return samples, train_loss / samples if samples else 0.0, cut


# The newest global model this process read, by (bucket, run, round, plan time). Model r never
# changes once written (first writer wins), and one process runs several workers of a round (the
# local engine's pool, a warm Lambda container), so each reads it once. The plan time tells a
# run recreated under the same id apart.
_MODEL_CACHE: dict[tuple[str, str, int, float], bytes] = {}


def _global_model(
    artifacts: S3Store, table: RunTable, spec: RoundSpec, model: nn.Module, expected: str | None
) -> bytes:
    """Model rnd's bytes, checked against the digest recorded when it was written (`expected`:
    the previous ROUND item's `model_sha256`, META's `model0_sha256` in round 0). Round 0 starts
    from a deterministic initialisation that every worker can build; the first writer stores it
    and everyone then uses the stored one. A model written by sharded aggregators is assembled from
    its slices (fetched in parallel)."""
    run_id, rnd = spec.run_id, spec.round
    key = (artifacts.bucket, run_id, rnd, spec.planned_at)
    if key in _MODEL_CACHE:
        return _MODEL_CACHE[key]
    try:
        stored = verified_model(artifacts, run_id, rnd, expected)
    except NotFound:
        if rnd != 0:
            raise
        artifacts.put(keys.model_key(run_id, 0), state_to_bytes(model.state_dict()), if_absent=True)
        stored = fetch_model(artifacts, run_id, 0)
    if rnd == 0 and expected is None:
        _record_model0(table, stored)
    _MODEL_CACHE.clear()  # keep one model: they can be large
    _MODEL_CACHE[key] = stored.blob
    return stored.blob


def _record_model0(table: RunTable, stored: StoredModel) -> None:
    """Round 0's model is written first-writer-wins by its workers (or copied by the warm start),
    before any ROUND item: the first worker to hold it records its digest in META, every later
    reader (workers, the aggregator, finalize, a resume) checks against that."""
    cond = "attribute_not_exists(#model0_sha256)"
    if not table.update(keys.META, MetaItem, model0_sha256=stored.sha256, only_if=cond):
        meta = table.meta()
        check(stored.key, stored.sha256, meta.model0_sha256 if meta else None, "model 0")


@dataclass
class _Where:
    """What a failing worker was doing, for its ERROR item: the job (whose code may be the cause),
    the shard it read last, the round's quorum attempt."""

    job: Job | None = None
    manifest: Manifest | None = None
    shard: Key | None = None
    attempt: int = 0
    manifest_sha256: str | None = None  # the dataset's manifest as the run started on it (META)
    # The previous round's workers' training steps: (slowest seconds per row, their memory MB).
    steps_before: list[tuple[float, int]] = field(default_factory=list)

    def step_per_row_s(self, memory_mb: int) -> float | None:
        """The slowest seconds per row of a training step measured before this round, on
        `memory_mb` (a smaller tier has fewer vCPUs: slower in proportion at most)."""
        if not self.steps_before:
            return None
        return max(s * max(1.0, m / memory_mb) for s, m in self.steps_before)

    def shard_ref(self) -> ShardRef | None:
        if self.shard is None or self.manifest is None:
            return None
        split, index = self.shard
        infos = self.manifest.train.shards if split == "train" else self.manifest.validation.shards
        key = infos[index].key if 0 <= index < len(infos) else ""
        return ShardRef(split=split, index=index, key=key, reason="error")


# The exchange store's and AWS clients' own errors, and the engine's injected failure (raised in
# botocore's request hooks): the platform failed, not the run; the invocation may be retried.
_PLATFORM_MODULES = ("botocore", "boto3", "s3transfer", "urllib3", "redis", "http", "socket", "ssl")


def _transient(e: BaseException) -> bool:
    """A platform fault: a lost connection, a timeout, a service error, a store outage (never a
    recorded error: a retry may well succeed)."""
    if isinstance(e, (ConnectionError, TimeoutError, StoreUnavailable, BotoCoreError, ClientError)):
        return True
    for f in traceback.extract_tb(e.__traceback__):
        module = f.filename.replace(os.sep, "/")
        if any(f"/{m}/" in module or module.endswith(f"/{m}.py") for m in _PLATFORM_MODULES):
            return True
    return False


# The round's other workers read it with their spec (no extra request) and stop before doing any work.
FATAL_SK = keys.FATAL


def run_worker(
    settings: Settings, event: TrainEvent, *, transform: Transform | None = None, deadline: float | None = None
) -> TrainAnswer:
    """One worker's round. `deadline`: the time.monotonic() at which the invocation ends (Lambda's
    `context.get_remaining_time_in_millis()`), the watchdog's last limit on the user's code."""
    table = RunTable(settings.table, event.run_id)
    where = _Where()
    try:
        return _run_worker(settings, table, event.run_id, event.round, event.worker, transform, where, deadline)
    except StaleInvocation:
        raise
    except (InvalidDataset, InvalidJob, ModelTooLarge, AccessDenied, DigestMismatch, DataError) as e:
        user = user_code_failure(e, where.job)  # the builder's own TypeError, an import inside the user's code
        if user is not None:
            _record_user_error(table, event, user)
            raise user from None
        # Not worth retrying: leave the reason (and the shard it names) where the aggregator and
        # the next plan can read it.
        shard = (
            _shard_ref(e) if isinstance(e, CorruptShard) else where.shard_ref() if isinstance(e, DataError) else None
        )
        item = ErrorItem(error=type(e).__name__, message=str(e), shard=shard, worker=event.worker, round=event.round)
        table.put_once(keys.error_sk(event.round, event.worker), item)
        raise
    except ModelRaised as e:
        user = model_failure(e.__cause__ or e, where.job)
        _record_user_error(table, event, user)
        raise user from None
    except UserCodeError as e:  # what the user's model gave, named here (`_own_output`)
        _record_user_error(table, event, e)
        raise
    except Exception as e:
        if _transient(e):
            raise
        user = user_code_failure(e, where.job)
        if user is not None:
            _record_user_error(table, event, user)
            raise user from None
        repeated = _record_worker_error(table, event, e, where)
        if repeated is not None:
            raise repeated from None
        raise


def _record_user_error(table: RunTable, event: TrainEvent, e: UserCodeError) -> None:
    """The user's error, for the aggregator (which fails the run with it, without a quorum retry)
    and for the round's workers still to start (FATAL: they stop at once)."""
    item = ErrorItem(
        error="UserCodeError", message=str(e), exception=e.type or None, worker=event.worker, round=event.round
    )
    table.put_once(keys.error_sk(event.round, event.worker), item)
    table.put_once(FATAL_SK, item)


def _record_worker_error(table: RunTable, event: TrainEvent, e: Exception, where: _Where) -> DataError | None:
    """Record any other exception (type, message, worker, shard, round) as a WorkerError; a
    DataError when this worker's earlier attempt of the round failed the same way on the same
    shard (a quorum retry of a deterministic error)."""
    text = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
    item = ErrorItem(
        error="WorkerError",
        message=text,
        exception=type(e).__name__,
        shard=where.shard_ref(),
        worker=event.worker,
        round=event.round,
        attempt=where.attempt,
    )
    sk = keys.error_sk(event.round, event.worker)
    written, stored = table.put_once(sk, item)
    if written or stored.error != "WorkerError" or stored.attempt >= where.attempt:
        return None
    if stored.exception != item.exception or stored.shard != item.shard:
        return None
    err = DataError(data_error_message(item, stored))
    table.update(sk, ErrorItem, error="DataError", message=str(err), attempt=where.attempt)
    return err


def _shard_ref(e: CorruptShard) -> ShardRef | None:
    if e.split not in ("train", "validation") or e.index is None:
        return None
    return ShardRef.model_validate({"split": e.split, "index": e.index, "key": e.key, "reason": e.reason})


def _round_spec(
    table: RunTable, run_id: str, rnd: int, worker: int, where: _Where | None = None
) -> tuple[RoundSpec, str | None] | TrainAnswer:
    """The round's spec and the digest model r must have, or the answer of a finished invocation
    (a duplicate: same answer, no new writes); StaleInvocation when there is nothing to do. One
    request for the items (the digest: ROUND r-1's `model_sha256`, META's in round 0)."""
    seal_sk, worker_sk, plan_sk = keys.seal_sk(rnd), keys.worker_sk(rnd, worker), keys.plan_sk(rnd)
    digest_sk = keys.round_sk(rnd - 1) if rnd > 0 else keys.META
    items = table.get_many(seal_sk, worker_sk, plan_sk, digest_sk, keys.META, FATAL_SK)
    fatal = items.item(FATAL_SK, ErrorItem)
    if fatal is not None:
        raise StaleInvocation(
            f"run {run_id} stopped: worker {fatal.worker} of round {fatal.round} hit a {fatal.error}; "
            f"worker {worker} does nothing"
        )
    if items.item(seal_sk, SealItem) is not None:
        raise StaleInvocation(f"round {rnd} of run {run_id} is already aggregated; worker {worker} is late")
    done = items.item(worker_sk, WorkerItem)
    if done is not None:
        return TrainAnswer(worker=worker, samples=done.samples, duplicate=True)
    plan = items.item(plan_sk, PlanItem)
    if plan is None or plan.spec is None:
        raise StaleInvocation(f"round {rnd} of run {run_id} has no training plan; worker {worker} has nothing to do")
    raw = items[digest_sk] or {}
    if where is not None:
        where.attempt = plan.attempts
        where.manifest_sha256 = (items[keys.META] or {}).get("manifest_sha256")
        if rnd > 0:  # ROUND r-1: its workers' timings (read anyway for its model's digest)
            b = max(plan.spec.job.training.batch_size, 1)
            timings = [RoundTiming.model_validate(t) for t in raw.get("timings") or []]
            where.steps_before = [(t.compute_s / (t.steps * b), t.memory_mb) for t in timings if t.steps > 0]
    return plan.spec, raw.get("model_sha256" if rnd > 0 else "model0_sha256")


def _start_from(
    artifacts: S3Store, table: RunTable, spec: RoundSpec, model: nn.Module, manifest: Manifest, expected: str | None
) -> dict[str, Tensor]:
    """Load model r into `model`; a copy of its state (the update is the difference to it)."""
    global_blob = _global_model(artifacts, table, spec, model, expected)
    stored = bytes_to_state(global_blob)
    if _own(spec.job):
        diff = form_difference(state_form(stored), state_form(model.state_dict()))
        if diff:
            raise UserCodeError(
                f"model.name {spec.job.model.name!r} built {diff}, unlike the run's stored model {spec.round}, so this "
                "worker's model cannot take the run's weights: its builder builds another architecture from one call "
                "to the next (Python's random, numpy.random, the time or a file deciding sizes or layer counts), or "
                "its forward pass adds parameters on a first call; decide sizes from the builder's arguments "
                "(model.params, input_shape, output_dim) and create every parameter in __init__\n"
                f"{FIX_AND_START_AGAIN}"
            )
    try:
        model.load_state_dict(stored)
    except RuntimeError as e:
        raise InvalidDataset(
            f"the model does not match the dataset (samples of shape {manifest.x.shape}, "
            f"{manifest.outputs} outputs): {str(e).splitlines()[0]}"
        ) from None
    return {k: v.clone() for k, v in model.state_dict().items()}


def _training_transform(spec: RoundSpec, manifest: Manifest, seed: tuple[int, int, int]) -> Transform | None:
    """What the training batches go through: the user's per-sample `code.transform`, then
    `training.augment` (seeded by job seed, round and worker, so a retried worker is identical)."""
    per_sample = load_transform(spec.job)
    augment = build_augment(spec.job.training.augment, manifest.input_shape, seed)
    if per_sample is None:
        return augment
    name = spec.job.code.transform if spec.job.code else None

    def transform(batch: torch.Tensor) -> torch.Tensor:
        out = torch.stack([_same_form(per_sample(x), x, name) for x in batch])
        return augment(out) if augment is not None else out

    return transform


def _same_form(got: object, sample: Tensor, name: str | None) -> Tensor:
    """A sample through the user's transform, when it kept the sample's shape and dtype (the client's
    check saw it do so on a few samples): one that changes some samples only is the user's code
    (UserCodeError, not retried), not the shard's data that torch.stack's error blamed after retries."""
    if isinstance(got, Tensor) and got.shape == sample.shape and got.dtype == sample.dtype:
        return got
    what = (
        f"{tuple(got.shape)} ({str(got.dtype).removeprefix('torch.')})"
        if isinstance(got, Tensor)
        else type(got).__name__
    )
    raise UserCodeError(
        f"code.transform {name!r} turned a training sample of shape {tuple(sample.shape)} "
        f"({str(sample.dtype).removeprefix('torch.')}) into {what}; it must keep each sample's shape and dtype "
        f"(the client's check saw it do so on a few samples: does it change some samples only?)\n{FIX_AND_START_AGAIN}"
    )


def _track_reads(shards: Prefetcher, where: _Where) -> None:
    """Note in `where` the shard the batches come from (the last one read): the shard an exception
    while training is recorded against."""
    get = shards.get

    def tracked(key: Key) -> Arrays:
        where.shard = key
        return get(key)

    shards.get = tracked  # type: ignore[method-assign]


def _run_worker(
    settings: Settings,
    table: RunTable,
    run_id: str,
    rnd: int,
    worker: int,
    transform: Transform | None,
    where: _Where | None = None,
    deadline: float | None = None,
) -> TrainAnswer:
    global _COLD
    cold, _COLD = _COLD, False
    t0 = time.perf_counter()
    artifacts = S3Store(settings.artifacts_bucket)
    where = where or _Where()
    got = _round_spec(table, run_id, rnd, worker, where)
    if isinstance(got, TrainAnswer):
        return got
    spec, model_digest = got
    where.job = spec.job
    manifest = load_manifest(spec.job.dataset.uri)
    check_pinned(where.manifest_sha256, manifest_sha256(spec.job.dataset.uri), spec.job.dataset.uri)
    where.manifest = manifest
    memory_mb = settings.memory_mb or spec.memory_mb
    torch.set_num_threads(torch_threads(memory_mb))  # every vCPU the tier pays for
    reset_torch_defaults()  # as a user's forward in an earlier call of this process may have left them

    activate_code(spec.job, settings.artifacts_bucket)  # the user's code (`--code`) first on sys.path, fetched once
    model = build_model(
        spec.job.model, manifest.input_shape, manifest.outputs, spec.job.seed, vocab_size=manifest.vocab_size
    )
    if not spec.eval_only:
        check_trainable(model, spec.job.model.name)  # named here too: measuring its step would fail unnamed
    val_idx = spec.val_shards(worker, len(manifest.validation.shards))
    train_idx = [] if spec.eval_only else spec.train_shards(worker, len(manifest.train.shards))
    used = [manifest.validation.shards[i] for i in val_idx] + [manifest.train.shards[i] for i in train_idx]
    fp = _measure_and_check(spec, model, manifest, memory_mb, used)
    global_state = _start_from(artifacts, table, spec, model, manifest, model_digest)

    cache = ShardCache(cap_bytes=settings.shard_cache_mb << 20)
    cache_miss = not all(cache.has(sh.sha256) for sh in used)
    seed = (spec.job.seed, rnd, worker)
    if transform is None:
        transform = _training_transform(spec, manifest, seed)
    # The user's code (their model, their transform) is watched: a call far past its measured steps ends the run.
    users = _own(spec.job) or bool(spec.job.code and spec.job.code.transform)
    watchdog = Watchdog(deadline, where.step_per_row_s(memory_mb), enabled=users)
    t_setup = time.perf_counter()
    reader = ShardReader(spec.job.dataset.uri, manifest, cache)
    with cache.in_use([sh.sha256 for sh in used]), Prefetcher(reader) as shards:
        _track_reads(shards, where)
        batches = eval_batches(shards, val_idx, then=first_train_key(train_idx, seed))
        evaluated = _evaluate(model, batches, manifest, spec.job, watchdog)
        t_eval, eval_wait = time.perf_counter(), shards.wait_s

        samples, train_loss, cut = 0, 0.0, False
        if not spec.eval_only:
            sync = _sync_exchange(settings, spec, model, run_id, rnd, worker)
            b, k = spec.job.training.batch_size, spec.local_steps
            batches = train_batches(shards, train_idx, b, k, seed)
            # The compute limit counts from here: not the process's one-off setup (a cold worker
            # measures its model's footprint, seconds on the first call) nor model r's download.
            samples, train_loss, cut = _local_steps(spec, model, batches, manifest, sync, t_setup, transform, watchdog)
        t_compute, train_wait = time.perf_counter(), shards.wait_s - eval_wait
        if _own(spec.job):  # a warm container runs the user's model again: is it keeping memory?
            check_growth(run_id, spec.job.model.name, memory_mb)
        if cache_miss:  # the rest of the slice, for the rounds to come (leaving the `with` waits)
            rest: list[Key] = [("validation", i) for i in val_idx] + [("train", i) for i in train_idx]
            shards.background(lambda: reader.warm(rest))
    finite = math.isfinite(train_loss)
    t_warm = time.perf_counter()

    update_bytes, update_sha256 = 0, None
    if not spec.eval_only:
        delta = update_delta(model.state_dict(), global_state)
        meta = {"samples": str(samples), "train_loss": repr(train_loss), "worker": str(worker)}
        codec = spec.job.training.compression
        if codec != "none":
            meta["compression"] = codec
        blob = state_to_bytes(compress_torch_state(delta, codec), metadata=meta)
        update_bytes, update_sha256 = len(blob), sha256_hex(blob)
        # Tagged so the bucket's lifecycle rule expires per-round updates (infra/stacks/storage.py).
        key = keys.update_key(run_id, rnd, worker)
        if not artifacts.put(key, blob, if_absent=True, tagging=keys.UPDATE_TAG):
            # Another invocation of this worker stored its update first: report what it stored,
            # so the record always describes the update that will be averaged (its digest too).
            stored_blob = artifacts.get(key)
            stored, update_sha256 = _metadata(stored_blob), sha256_hex(stored_blob)
            samples, train_loss = int(stored["samples"]), float(stored["train_loss"])
            finite = math.isfinite(train_loss)
    t_upload = time.perf_counter()

    record = WorkerItem(
        worker=worker,
        samples=samples,
        train_loss=train_loss if finite else None,
        finite=finite,
        val_loss_sum=evaluated.loss,
        val_correct=evaluated.correct,
        val_count=evaluated.count,
        val_class_correct=evaluated.class_correct,
        val_class_count=evaluated.class_count,
        memory_mb=spec.memory_mb,
        cold=cold,
        init_s=ledger.init_s(),  # process start to this first call (the handler's meter), cold only
        update_bytes=update_bytes,
        update_sha256=update_sha256,
        # Waiting for shards is loading; a read that overlapped compute is not counted twice.
        load_s=t_setup - t0 + shards.wait_s + (t_warm - t_compute),
        eval_s=t_eval - t_setup - eval_wait,
        compute_s=t_compute - t_eval - train_wait,
        upload_s=t_upload - t_warm,
        total_s=time.perf_counter() - t0,
        finished_at=time.time(),
        cache_miss=cache_miss,
        steps=samples // spec.job.training.batch_size,
        cut=cut,
        flops_per_sample=fp.flops_per_sample or None,
        activation_mb=fp.activation_mb(spec.job.training.batch_size),
    )
    outcome = table.put_unless_sealed(keys.worker_sk(rnd, worker), record, keys.seal_sk(rnd))
    if outcome == "sealed":
        raise StaleInvocation(
            f"round {rnd} of run {run_id} closed before worker {worker} finished; its update is ignored"
        )
    return TrainAnswer(worker=worker, samples=samples)
