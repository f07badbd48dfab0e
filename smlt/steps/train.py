"""One worker's round: evaluate the global model on a validation slice, take k local SGD steps
on the worker's shards, write the delta (safetensors) and the timings.

Deterministic: the sample order is seeded by (job seed, round, worker), so a retried or
duplicated invocation computes the same update, and the conditional writes keep the first.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from smlt import keys
from smlt.aggregate.model_store import read_model_blob
from smlt.aggregate.sync import Poll, ReduceScatter
from smlt.config import Settings
from smlt.data.manifest import SplitInfo
from smlt.data.shards import is_cached, load_manifest, load_shards
from smlt.errors import AccessDenied, CorruptShard, InvalidDataset, InvalidJob, ModelTooLarge, StaleInvocation
from smlt.items import ErrorItem, PlanItem, SealItem, ShardRef, WorkerItem
from smlt.records import RunTable
from smlt.roundspec import RoundSpec
from smlt.steps.events import TrainAnswer, TrainEvent
from smlt.store import NotFound, S3Store
from smlt.tensors.torch_state import bytes_to_state, compress_torch_state, state_to_bytes, update_delta
from smlt.train.models import build_model
from smlt.usercode import activate_code

_COLD = True  # first invocation in this process (a cold start on Lambda)


def _optimizer(params, spec: RoundSpec) -> torch.optim.Optimizer:
    t = spec.job.training
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.learning_rate, momentum=t.momentum, weight_decay=t.weight_decay)
    cls = torch.optim.Adam if t.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=spec.learning_rate, weight_decay=t.weight_decay)


def _loss_fn(task: str) -> nn.Module:
    return nn.CrossEntropyLoss(reduction="sum") if task == "classification" else nn.MSELoss(reduction="sum")


def _evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, task: str) -> tuple[float, int, int]:
    """(loss sum, correct, count) on x, y."""
    if len(x) == 0:
        return 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(x))
        target = torch.from_numpy(y)
        loss = float(_loss_fn(task)(out, target))
        correct = int((out.argmax(1) == target).sum()) if task == "classification" else 0
    return loss, correct, len(x)


def _metadata(head: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file from its first bytes (the header)."""
    n = int.from_bytes(head[:8], "little")
    return json.loads(head[8 : 8 + n]).get("__metadata__", {})


def _check_fits(model: nn.Module, memory_mb: int, data_bytes: int) -> None:
    """Raise ModelTooLarge when training cannot fit the function's memory.

    Weights, gradients, two optimizer buffers, the global copy and the delta: ~6 copies of the
    parameters, plus the data and ~450 MB for Python + torch themselves.
    """
    params = sum(p.numel() for p in model.parameters())
    need_mb = (6 * params * 4 + data_bytes) / 2**20 + 450
    if memory_mb and need_mb > memory_mb:
        raise ModelTooLarge(
            f"the model has {params / 1e6:.1f}M parameters; training it needs about "
            f"{need_mb:,.0f} MB, more than the {memory_mb} MB memory tier "
            "(choose a larger workers.memory_mb, or let the planner choose)"
        )


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


def _local_steps(
    spec: RoundSpec,
    model: nn.Module,
    xt: np.ndarray,
    yt: np.ndarray,
    task: str,
    sync: Callable[[int, int], None] | None,
    rnd: int,
    worker: int,
    t0: float,
) -> tuple[int, float]:
    """k local SGD steps on the worker's shards (sample order seeded by seed, round, worker):
    (samples trained on, mean train loss)."""
    model.train()
    opt = _optimizer(model.parameters(), spec)
    loss_fn = _loss_fn(task)
    rng = np.random.default_rng([spec.job.seed, rnd, worker])
    b, k = spec.job.training.batch_size, spec.local_steps
    need = b * k
    order = np.concatenate([rng.permutation(len(xt)) for _ in range(math.ceil(need / len(xt)))])[:need]
    xt_t, yt_t = torch.from_numpy(xt), torch.from_numpy(yt)
    # Stop early rather than be cut off: Step Functions abandoning a straggler does not stop
    # its Lambda's bill, so the worker keeps to the planner's limit itself (not in sync mode,
    # where every worker must take every step).
    stop_at = t0 + 0.8 * spec.compute_limit_s if spec.compute_limit_s and sync is None else math.inf
    done_steps, train_loss = 0, 0.0
    for step in range(k):
        if step and time.perf_counter() > stop_at:
            break
        done_steps += 1
        idx = torch.from_numpy(order[step * b : (step + 1) * b])
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xt_t[idx]), yt_t[idx])
        (loss / len(idx)).backward()
        if sync is not None:  # per-step mode: every worker steps with the averaged gradient
            sync(step, len(idx))
        opt.step()
        train_loss += loss.item()
    samples = done_steps * b
    return samples, train_loss / samples


# The newest global model this process read, by (bucket, run, round, plan time). Model r never
# changes once written (first writer wins), and one process runs several workers of a round (the
# local engine's pool, a warm Lambda container), so each reads it once. The plan time tells a
# run recreated under the same id apart.
_MODEL_CACHE: dict[tuple[str, str, int, float], bytes] = {}


def _global_model(artifacts: S3Store, spec: RoundSpec, model: nn.Module) -> bytes:
    """Model rnd's bytes. Round 0 starts from a deterministic initialisation that every worker
    can build; the first writer stores it and everyone then uses the stored one. A model written
    by sharded aggregators is assembled from its slices (fetched in parallel)."""
    run_id, rnd = spec.run_id, spec.round
    key = (artifacts.bucket, run_id, rnd, spec.planned_at)
    if key in _MODEL_CACHE:
        return _MODEL_CACHE[key]
    try:
        blob = read_model_blob(artifacts, run_id, rnd)
    except NotFound:
        if rnd != 0:
            raise
        artifacts.put(keys.model_key(run_id, 0), state_to_bytes(model.state_dict()), if_absent=True)
        blob = artifacts.get(keys.model_key(run_id, 0))
    _MODEL_CACHE.clear()  # keep one model: they can be large
    _MODEL_CACHE[key] = blob
    return blob


def run_worker(settings: Settings, event: TrainEvent) -> TrainAnswer:
    table = RunTable(settings.table, event.run_id)
    try:
        return _run_worker(settings, table, event.run_id, event.round, event.worker)
    except (InvalidDataset, InvalidJob, ModelTooLarge, AccessDenied) as e:
        # Not worth retrying: leave the reason (and the shard it names) where the aggregator and
        # the next plan can read it.
        shard = _shard_ref(e) if isinstance(e, CorruptShard) else None
        item = ErrorItem(error=type(e).__name__, message=str(e), shard=shard)
        table.put_once(keys.error_sk(event.round, event.worker), item)
        raise


def _shard_ref(e: CorruptShard) -> ShardRef | None:
    if e.split not in ("train", "validation") or e.index is None:
        return None
    return ShardRef.model_validate({"split": e.split, "index": e.index, "key": e.key, "reason": e.reason})


def _load_split(uri: str, split: SplitInfo, name: str, indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The shards `indices` of one split; a CorruptShard says which split and index it was."""
    shards = [split.shards[i] for i in indices]
    try:
        return load_shards(uri, shards)
    except CorruptShard as e:
        index = next(i for i, sh in zip(indices, shards, strict=True) if sh.key == e.key)
        raise CorruptShard(str(e), key=e.key, reason=e.reason, split=name, index=index) from None


def _round_spec(table: RunTable, run_id: str, rnd: int, worker: int) -> RoundSpec | TrainAnswer:
    """The round's spec, or the answer of a finished invocation (a duplicate: same answer, no new
    writes); StaleInvocation when there is nothing to do. One request for the three items."""
    seal_sk, worker_sk, plan_sk = keys.seal_sk(rnd), keys.worker_sk(rnd, worker), keys.plan_sk(rnd)
    items = table.get_many(seal_sk, worker_sk, plan_sk)
    if items.item(seal_sk, SealItem) is not None:
        raise StaleInvocation(f"round {rnd} of run {run_id} is already aggregated; worker {worker} is late")
    done = items.item(worker_sk, WorkerItem)
    if done is not None:
        return TrainAnswer(worker=worker, samples=done.samples, duplicate=True)
    plan = items.item(plan_sk, PlanItem)
    if plan is None or plan.spec is None:
        raise StaleInvocation(f"round {rnd} of run {run_id} has no training plan; worker {worker} has nothing to do")
    return plan.spec


def _run_worker(settings: Settings, table: RunTable, run_id: str, rnd: int, worker: int) -> TrainAnswer:
    global _COLD
    cold, _COLD = _COLD, False
    t0 = time.perf_counter()
    artifacts = S3Store(settings.artifacts_bucket)
    spec = _round_spec(table, run_id, rnd, worker)
    if isinstance(spec, TrainAnswer):
        return spec
    manifest = load_manifest(spec.job.dataset.uri)
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, (settings.memory_mb or spec.memory_mb) // 1769)))

    activate_code(spec.job)  # the user's code (`--code`) first on sys.path, fetched and verified once
    model = build_model(
        spec.job.model, manifest.input_shape, manifest.outputs, spec.job.seed, vocab_size=manifest.vocab_size
    )
    train_idx = spec.train_shards(worker, len(manifest.train.shards))
    train_shards = [manifest.train.shards[i] for i in train_idx]
    _check_fits(model, settings.memory_mb or spec.memory_mb, sum(sh.bytes for sh in train_shards))
    global_blob = _global_model(artifacts, spec, model)
    try:
        model.load_state_dict(bytes_to_state(global_blob))
    except RuntimeError as e:
        raise InvalidDataset(
            f"the model does not match the dataset ({manifest.features} features, "
            f"{manifest.outputs} outputs): {str(e).splitlines()[0]}"
        ) from None
    global_state = {k: v.clone() for k, v in model.state_dict().items()}

    n_val = len(manifest.validation.shards)
    val_idx = spec.val_shards(worker, n_val)
    val_shards = [manifest.validation.shards[i] for i in val_idx]
    cache_miss = not all(is_cached(sh) for sh in val_shards + train_shards)
    uri = spec.job.dataset.uri
    xv, yv = (
        _load_split(uri, manifest.validation, "validation", val_idx)
        if val_shards
        else (np.zeros((0, manifest.features), np.float32), np.zeros(0))
    )
    xt, yt = _load_split(uri, manifest.train, "train", train_idx)
    if xt.shape[1] != manifest.features:
        raise InvalidDataset(f"shards have {xt.shape[1]} features, the manifest says {manifest.features}")
    t_load = time.perf_counter()

    val_loss, val_correct, val_count = _evaluate(model, xv, yv, manifest.task)
    t_eval = time.perf_counter()

    samples, train_loss = 0, 0.0
    if not spec.eval_only:
        sync = _sync_exchange(settings, spec, model, run_id, rnd, worker)
        samples, train_loss = _local_steps(spec, model, xt, yt, manifest.task, sync, rnd, worker, t0)
    finite = math.isfinite(train_loss)
    t_compute = time.perf_counter()

    update_bytes = 0
    if not spec.eval_only:
        delta = update_delta(model.state_dict(), global_state)
        meta = {"samples": str(samples), "train_loss": repr(train_loss), "worker": str(worker)}
        codec = spec.job.training.compression
        if codec != "none":
            meta["compression"] = codec
        blob = state_to_bytes(compress_torch_state(delta, codec), metadata=meta)
        update_bytes = len(blob)
        # Tagged so the bucket's lifecycle rule expires per-round updates (infra/stacks/storage.py).
        key = keys.update_key(run_id, rnd, worker)
        if not artifacts.put(key, blob, if_absent=True, tagging=keys.UPDATE_TAG):
            # Another invocation of this worker stored its update first: report what it stored,
            # so the record always describes the update that will be averaged.
            stored = _metadata(artifacts.get_range(key, 0, 65536))
            samples, train_loss = int(stored["samples"]), float(stored["train_loss"])
            finite = math.isfinite(train_loss)
    t_upload = time.perf_counter()

    record = WorkerItem(
        worker=worker,
        samples=samples,
        train_loss=train_loss if finite else None,
        finite=finite,
        val_loss_sum=val_loss,
        val_correct=val_correct,
        val_count=val_count,
        memory_mb=spec.memory_mb,
        cold=cold,
        update_bytes=update_bytes,
        load_s=t_load - t0,
        eval_s=t_eval - t_load,
        compute_s=t_compute - t_eval,
        upload_s=t_upload - t_compute,
        total_s=time.perf_counter() - t0,
        finished_at=time.time(),
        cache_miss=cache_miss,
        steps=samples // spec.job.training.batch_size,
    )
    outcome = table.put_unless_sealed(keys.worker_sk(rnd, worker), record, keys.seal_sk(rnd))
    if outcome == "sealed":
        raise StaleInvocation(
            f"round {rnd} of run {run_id} closed before worker {worker} finished; its update is ignored"
        )
    return TrainAnswer(worker=worker, samples=samples)
