"""Aggregation benchmarks: the in-process reduce against numpy, sharded against a single aggregator
through a real store, and the accuracy cost of fp16/bf16 update compression.

1. reduce vs reference: n updates of P float32 parameters (an MLP's tensors), already in memory.
   reference = numpy adding the same arrays in place (`np.add(acc, a, out=acc)`, per tensor);
   reduce    = `smlt.runtime.aggregate.reduce.weighted_average` with unequal weights (the general case;
               local SGD's equal weights take a faster path, also reported).
   MB/s = n * P * 4 bytes / seconds, best of `repeats`, measured interleaved in one run.
2. sharded vs single through a store (a real redis-server and moto's S3 server, both on loopback
   in their own processes): the updates are written as the worker writes them (one safetensors
   object each, with its metadata), then
   single  = the current aggregator's path (`smlt/runtime/steps/aggregate.py`): GET + decode every update, weighted
             average, apply to the global model, encode, PUT model r+1;
   sharded = k = plan_slices(P * 4, n) warm reducer processes (like k warm Lambdas), each running
             `reduce.aggregate_slice` (header probe + one ranged GET per update, reduce, write
             its slice). Wall time from dispatch until every slice is written.
   The sharded model is checked to be bit-identical to the single one.
3. compression accuracy: digits, the example job's MLP, local SGD (4 workers x 20 steps) with the
   worker's exact training step and the aggregator's exact reduce, with none / fp16 / bf16 updates,
   same seeds.

    python bench/aggregation_bench.py [--smoke] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from smlt.runtime.data.manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402
from smlt.runtime import keys  # noqa: E402
from smlt.runtime.aggregate.reduce import (  # noqa: E402
    aggregate_slice,
    apply_update,
    commit_accepted,
    is_finite,
    weighted_average,
)
from smlt.runtime.fanout import plan_slices  # noqa: E402
from smlt.runtime.model_store import read_model  # noqa: E402
from smlt.runtime.tensors.format import decode, encode, views  # noqa: E402
from smlt.runtime.tensors.layout import flatten  # noqa: E402

MB = 1e6
RUN = "bench"

# MLP-shaped parameter sets: ~1.0M and ~11.0M float32 parameters.
SHAPES = {
    "1M": {
        "0.weight": (1024, 784),
        "0.bias": (1024,),
        "2.weight": (192, 1024),
        "2.bias": (192,),
        "4.weight": (10, 192),
        "4.bias": (10,),
    },
    "11M": {
        "0.weight": (2048, 4096),
        "0.bias": (2048,),
        "2.weight": (1280, 2048),
        "2.bias": (1280,),
        "4.weight": (10, 1280),
        "4.bias": (10,),
    },
}


def numel(shapes: dict) -> int:
    return sum(math.prod(s) for s in shapes.values())


def make_updates(n: int, shapes: dict, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """n distinct updates; one random base scaled per worker (cheap to make, realistic values)."""
    rng = np.random.default_rng(seed)
    base = {k: (rng.standard_normal(s, dtype=np.float32) * 1e-3) for k, s in shapes.items()}
    return [{k: v * np.float32(1.0 + 0.01 * i) for k, v in base.items()} for i in range(n)]


def _best(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


# ----------------------------------------------------------------------------- 1. in-process


def reference_sum(updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    out = {}
    for name in updates[0]:
        acc = updates[0][name].copy()
        for u in updates[1:]:
            np.add(acc, u[name], out=acc)
        out[name] = acc
    return out


def bench_in_process(cases: list[tuple[int, str]], repeats: int = 3) -> list[dict]:
    rows = []
    for n, size in cases:
        ups = make_updates(n, SHAPES[size])
        p = numel(SHAPES[size])
        nbytes = n * p * 4
        unequal = [float(32 * (i + 1)) for i in range(n)]
        equal = [640.0] * n
        blobs = [encode(u) for u in ups]

        ref, red, req, rblob = [], [], [], []
        # small cases take milliseconds: repeat them more so one scheduler hiccup does not decide
        once = _best(lambda: reference_sum(ups), 1)
        reps = int(min(50, max(repeats, 0.25 / max(once, 1e-4))))
        for _ in range(reps):  # interleaved so load changes hit all variants alike
            ref.append(_best(lambda: reference_sum(ups), 1))
            red.append(_best(lambda: weighted_average(ups, unequal), 1))
            req.append(_best(lambda: weighted_average(ups, equal), 1))
            rblob.append(_best(lambda: weighted_average([views(b)[0] for b in blobs], unequal), 1))
        r = {
            "updates": n,
            "params": p,
            "size": size,
            "bytes": nbytes,
            "repeats": reps,
            "reference_mb_s": nbytes / min(ref) / MB,
            "reduce_mb_s": nbytes / min(red) / MB,
            "reduce_equal_weights_mb_s": nbytes / min(req) / MB,
            "reduce_from_blobs_mb_s": nbytes / min(rblob) / MB,
        }
        r["reduce_vs_reference"] = r["reduce_mb_s"] / r["reference_mb_s"]
        rows.append(r)
        print(
            f"  in-process {n:>2} x {size:>3}: reference {r['reference_mb_s']:8.0f} MB/s, reduce "
            f"{r['reduce_mb_s']:8.0f} MB/s ({r['reduce_vs_reference']:.2f}x), equal weights "
            f"{r['reduce_equal_weights_mb_s']:.0f}, from blobs {r['reduce_from_blobs_mb_s']:.0f}",
            flush=True,
        )
        ups = blobs = []  # free the arrays before the next case
    return rows


# ----------------------------------------------------------------------------- 2. through a store


class MotoServer:
    """The local engine's moto server (smlt.local.server with smlt.local.speed's patches, as
    `smlt run --local` runs it) in its own process on a loopback port: like a remote S3, not in
    our GIL. SMLT_LOCAL_SPEEDUPS=0 in the environment measures stock moto instead."""

    def __init__(self):
        self.proc = None
        self.endpoint = ""

    def __enter__(self):
        from bench.moto_server import start_server

        self.proc, self.endpoint = start_server(os.environ.get("SMLT_LOCAL_SPEEDUPS", "1"))
        s3_client(self.endpoint).create_bucket(Bucket="bench")
        return self

    def __exit__(self, *exc):
        from bench.moto_server import stop_server

        if self.proc is not None:
            stop_server(self.proc)


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(max_pool_connections=32, retries={"max_attempts": 3}),
    )


def open_store(spec: tuple[str, str]):
    kind, where = spec
    if kind == "redis":
        from smlt.runtime.store import RedisStore

        return RedisStore(where)
    from smlt.runtime.store import S3Store

    return S3Store("bench", client=s3_client(where))


_STORE = None


def _reducer_init(spec):
    global _STORE
    _STORE = open_store(spec)


def _reducer_task(args):
    rnd, j, k, accepted = args
    return aggregate_slice(_STORE, RUN, rnd, j, k, accepted)


def _warm(_):
    return os.getpid()


def single_aggregate(store, rnd: int, accepted: list[dict]) -> bytes:
    """What smlt/runtime/steps/aggregate.py does with the updates: GET + decode each, average, apply, check, encode, PUT."""
    global_state = decode(store.get(keys.model_key(RUN, rnd)))
    updates = [decode(store.get(keys.update_key(RUN, rnd, a["worker"]))) for a in accepted]
    avg = weighted_average(updates, [a["samples"] for a in accepted])
    new = apply_update(global_state, avg, 1.0)
    if not is_finite(new):
        raise FloatingPointError("NaN")
    blob = encode(new)
    store.put(keys.model_key(RUN, rnd + 1), blob, if_absent=True)
    return blob


def _clear_round_output(store, rnd: int) -> None:
    for key in store.list(keys.round_prefix(RUN, rnd + 1)):
        store.delete(key)
    store.delete(keys.accepted_key(RUN, rnd))


def bench_store(backend: str, spec: tuple[str, str], cases: list[tuple[int, str]], repeats: int = 2) -> list[dict]:
    store = open_store(spec)
    rows = []
    ctx = mp.get_context("forkserver")
    for rnd, (n, size) in enumerate(cases):
        shapes = SHAPES[size]
        p = numel(shapes)
        k = plan_slices(p * 4, n)
        ups = make_updates(n, shapes, seed=rnd)
        glob = make_updates(1, shapes, seed=100 + rnd)[0]
        t = time.perf_counter()
        store.put(keys.model_key(RUN, rnd), encode(glob))

        def upload(w):
            store.put(
                keys.update_key(RUN, rnd, w),
                encode(ups[w], {"samples": str(640 + w), "worker": str(w), "train_loss": repr(0.1 + w / 7)}),
            )

        with ThreadPoolExecutor(4) as ex:
            list(ex.map(upload, range(n)))
        upload_s = time.perf_counter() - t
        # What one ranged GET of a 1/k slice costs against a whole-object GET on this store
        # (S3 serves a range in time proportional to the range; moto reads the whole object).
        probe_key = keys.update_key(RUN, rnd, 0)
        obj_size = len(store.get(probe_key))
        full_get_s = _best(lambda: store.get(probe_key), 3)
        range_get_s = _best(lambda: store.get_range(probe_key, 0, max(1, obj_size // max(k, 6))), 3)
        accepted = [{"worker": w, "samples": 640 + w} for w in range(n)]
        ups = []  # free the arrays before the next round
        nbytes = n * p * 4
        single_t, sharded_t, k1_t = [], [], []
        with ctx.Pool(k, initializer=_reducer_init, initargs=(spec,)) as pool:
            pool.map(_warm, range(k * 2))  # the reducers are warm, as warm Lambdas would be
            for rep in range(repeats):
                _clear_round_output(store, rnd)
                t = time.perf_counter()
                single_blob = single_aggregate(store, rnd, accepted)
                single_t.append(time.perf_counter() - t)
                store.delete(keys.model_key(RUN, rnd + 1))

                t = time.perf_counter()
                acc = commit_accepted(store, RUN, rnd, accepted)
                infos = pool.map(_reducer_task, [(rnd, j, k, acc) for j in range(k)])
                sharded_t.append(time.perf_counter() - t)
                assert not any(i["skipped"] for i in infos)
                if rep == 0:  # the sharded model is the single aggregator's, bit for bit
                    got = read_model(store, RUN, rnd + 1)
                    ref = decode(single_blob)
                    assert all(np.array_equal(got[name], ref[name]) for name in ref), "sharded != single"
                    del got, ref
                if k > 1 and rep == 0:  # the sharded code with one reducer (parallel fetch, no split)
                    _clear_round_output(store, rnd)
                    t = time.perf_counter()
                    acc = commit_accepted(store, RUN, rnd, accepted)
                    pool.map(_reducer_task, [(rnd, 0, 1, acc)])
                    k1_t.append(time.perf_counter() - t)
        del single_blob
        r = {
            "backend": backend,
            "updates": n,
            "params": p,
            "size": size,
            "bytes": nbytes,
            "aggregators": k,
            "upload_s": upload_s,
            "single_s": min(single_t),
            "sharded_s": min(sharded_t),
            "single_mb_s": nbytes / min(single_t) / MB,
            "sharded_mb_s": nbytes / min(sharded_t) / MB,
            "sharded_vs_single": min(single_t) / min(sharded_t),
            "one_reducer_s": min(k1_t) if k1_t else min(sharded_t),
            "full_get_s": full_get_s,
            "range_get_s": range_get_s,
            "range_fraction": 1 / max(k, 6),
        }
        rows.append(r)
        print(
            f"  {backend:5s} {n:>2} x {size:>3}: single {r['single_s']:6.2f} s ({r['single_mb_s']:5.0f} MB/s), "
            f"sharded k={k} {r['sharded_s']:6.2f} s ({r['sharded_mb_s']:5.0f} MB/s) -> "
            f"{r['sharded_vs_single']:.2f}x; one reducer {r['one_reducer_s']:.2f} s; ranged GET of "
            f"1/{round(1 / r['range_fraction'])} {r['range_get_s'] * 1e3:.0f} ms vs whole {r['full_get_s'] * 1e3:.0f} ms",
            flush=True,
        )
        for key in store.list(keys.round_prefix(RUN, rnd)) + store.list(keys.round_prefix(RUN, rnd + 1)):
            store.delete(key)
    return rows


# ----------------------------------------------------------------------------- per-step sync mode


def bench_sync(backend: str, spec: tuple[str, str], workers: int = 4, numel: int = 300_000, steps: int = 15) -> dict:
    """Per-step reduce-scatter latency: `workers` threads (the I/O is what is measured) exchanging a
    `numel` float32 gradient through the store, `steps` times; median step time."""
    import threading

    from smlt.runtime.exchange import Poll, ReduceScatter, delete_prefix

    store = open_store(spec)
    prefix = keys.sync_prefix(RUN + f"-sync-{backend}", 0)
    grads = np.random.default_rng(0).standard_normal((workers, numel)).astype(np.float32)
    times: dict[int, list[float]] = {}
    errors = []

    def worker(i):
        rs = ReduceScatter(
            open_store(spec), prefix, workers, i, numel, poll=Poll(first=0.001, longest=0.01, timeout=60)
        )
        ts = []
        try:
            for s in range(steps):
                t = time.perf_counter()
                rs.allreduce(s, grads[i])
                ts.append(time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        times[i] = ts

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    delete_prefix(store, prefix)
    step = [max(times[i][s] for i in range(workers)) for s in range(steps)] if not errors else []
    r = {
        "backend": backend,
        "workers": workers,
        "params": numel,
        "steps": steps,
        "median_step_s": float(np.median(step[1:])) if step else None,
        "errors": errors[:3],
    }
    print(
        f"  sync {backend:5s} {workers} workers x {numel:,} params: median step "
        f"{(r['median_step_s'] or float('nan')) * 1e3:.0f} ms",
        flush=True,
    )
    return r


# ----------------------------------------------------------------------------- 3. compression


def compression_accuracy(
    rounds: int = 25,
    seeds: tuple[int, ...] = (0, 1, 2),
    workers: int = 4,
    local_steps: int = 20,
    batch: int = 32,
    target: float = 0.96,
) -> dict:
    """Local SGD on digits with none / fp16 / bf16 updates: same seeds, same data order.

    Each simulated worker runs the worker's training step (fresh SGD with momentum from the global
    model, k steps on its shards, delta = trained - global), compresses the delta as the worker
    would (`compress_torch_state`), serialises it with safetensors; the aggregator's own
    decode + weighted_average + apply_update make the next global model.
    """
    import tempfile

    import torch
    from safetensors.torch import save as torch_save

    from smlt.runtime.data.prepare import prepare_dataset
    from smlt.runtime.job import ModelSpec
    from smlt.runtime.roundspec import shard_slice
    from smlt.runtime.tensors.torch_state import compress_torch_state
    from smlt.runtime.train.models import build_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        prepare_dataset("sklearn:digits", tmp, shards=16)
        from bench.baselines import load_prepared

        xt, yt, xv, yv, manifest = load_prepared(tmp)
    n_shards = 16
    shard_rows = np.array_split(np.arange(len(xt)), n_shards)
    XV, YV = torch.from_numpy(xv), torch.from_numpy(yv)
    spec = ModelSpec(name="mlp", params={"hidden": [128, 64]})
    results: dict[str, dict] = {}
    for codec in ("none", "fp16", "bf16"):
        per_seed = []
        for seed in seeds:
            model = build_model(spec, Manifest.model_validate(manifest).input_shape, manifest["outputs"], seed)
            gstate = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
            curve, losses, reached = [], [], None
            for rnd in range(rounds):
                model.load_state_dict({k: torch.from_numpy(v) for k, v in gstate.items()})
                with torch.no_grad():
                    logits = model(XV)
                    acc = float((logits.argmax(1) == YV).float().mean())
                    vloss = float(torch.nn.functional.cross_entropy(logits, YV))
                curve.append(round(acc, 5))
                losses.append(round(vloss, 6))
                if reached is None and acc >= target:
                    reached = rnd
                updates, weights = [], []
                for w in range(workers):
                    rows = np.concatenate([shard_rows[i] for i in shard_slice(n_shards, workers, w)])
                    x, y = torch.from_numpy(xt[rows]), torch.from_numpy(yt[rows])
                    model.load_state_dict({k: torch.from_numpy(v) for k, v in gstate.items()})
                    before = {k: v.clone() for k, v in model.state_dict().items()}
                    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
                    rng = np.random.default_rng([seed, rnd, w])
                    need = batch * local_steps
                    order = np.concatenate([rng.permutation(len(x)) for _ in range(math.ceil(need / len(x)))])[:need]
                    for s in range(local_steps):
                        idx = torch.from_numpy(order[s * batch : (s + 1) * batch])
                        opt.zero_grad(set_to_none=True)
                        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="sum")
                        (loss / len(idx)).backward()
                        opt.step()
                    delta = {k: v - before[k] for k, v in model.state_dict().items()}
                    blob = torch_save(compress_torch_state(delta, codec), metadata={"samples": str(need)})
                    updates.append(decode(blob))
                    weights.append(need)
                gstate = apply_update(gstate, weighted_average(updates, weights), 1.0)
            per_seed.append(
                {
                    "seed": seed,
                    "rounds_to_target": reached,
                    "final_accuracy": curve[-1],
                    "final_val_loss": losses[-1],
                    "best_accuracy": max(curve),
                    "curve": curve,
                    "val_loss_curve": losses,
                    "final_state": gstate,
                }
            )
        finals = [s["final_accuracy"] for s in per_seed]
        rtt = [s["rounds_to_target"] for s in per_seed]
        results[codec] = {
            "final_accuracy_mean": float(np.mean(finals)),
            "final_val_loss_mean": float(np.mean([s["final_val_loss"] for s in per_seed])),
            "rounds_to_target": rtt,
            "update_bytes_per_param": {"none": 4, "fp16": 2, "bf16": 2}[codec],
            "per_seed": per_seed,
        }
    base = results["none"]["final_accuracy_mean"]
    for codec in ("fp16", "bf16"):
        results[codec]["accuracy_cost"] = base - results[codec]["final_accuracy_mean"]
        results[codec]["val_loss_cost"] = results[codec]["final_val_loss_mean"] - results["none"]["final_val_loss_mean"]
        # how far the compressed run's final model drifted from the float32 run's (same seed)
        drift = []
        for a, b in zip(results["none"]["per_seed"], results[codec]["per_seed"]):
            fa = flatten(a["final_state"])
            fb = flatten(b["final_state"])
            drift.append(float(np.linalg.norm(fa - fb) / np.linalg.norm(fa)))
        results[codec]["final_model_relative_drift"] = float(np.mean(drift))
    for r in results.values():
        for s in r["per_seed"]:
            s.pop("final_state", None)
    summary = {c: {k: v for k, v in r.items() if k != "per_seed"} for c, r in results.items()}
    for c, r in summary.items():
        print(
            f"  compression {c:4s}: final accuracy {r['final_accuracy_mean']:.4f} "
            f"(cost {r.get('accuracy_cost', 0.0):+.4f}), val loss {r['final_val_loss_mean']:.4f}, "
            f"model drift {r.get('final_model_relative_drift', 0.0):.2e}, rounds to {target}: {r['rounds_to_target']}",
            flush=True,
        )
    return {
        "dataset": "digits",
        "workers": workers,
        "local_steps": local_steps,
        "batch_size": batch,
        "rounds": rounds,
        "seeds": list(seeds),
        "target": target,
        "codecs": results,
    }


# ----------------------------------------------------------------------------- all


def run(smoke: bool = False) -> dict:
    from smlt.local.redis_server import LocalRedisServer

    cases = [(8, "1M"), (32, "1M"), (8, "11M"), (32, "11M")]
    store_cases = [(8, "1M"), (32, "1M"), (8, "11M"), (32, "11M")]
    if smoke:  # every path once, on the small model
        cases = store_cases = [(8, "1M")]
    out: dict = {"load_average_start": os.getloadavg()}
    print("in-process reduce vs numpy reference", flush=True)
    out["in_process"] = bench_in_process(cases, repeats=3)
    print("sharded vs single through a store", flush=True)
    out["store"] = []
    out["sync"] = []
    with LocalRedisServer() as srv:
        out["store"] += bench_store("redis", ("redis", srv.url), store_cases, repeats=2)
        out["sync"].append(bench_sync("redis", ("redis", srv.url), steps=3 if smoke else 15))
    with MotoServer() as moto:
        out["store"] += bench_store("s3", ("s3", moto.endpoint), store_cases, repeats=1)
        out["sync"].append(bench_sync("s3", ("s3", moto.endpoint), steps=3 if smoke else 15))
    print("compression accuracy (digits, local SGD)", flush=True)
    out["compression"] = compression_accuracy(rounds=3 if smoke else 25, seeds=(0,) if smoke else (0, 1, 2))
    out["load_average_end"] = os.getloadavg()
    return out


def summarize(res: dict) -> dict:
    ratios = [r["reduce_vs_reference"] for r in res["in_process"]]
    big = [r for r in res["store"] if r["updates"] == 32 and r["size"] == "11M"]
    return {
        "reduce_vs_reference": min(ratios),
        # The worse of the two stores (Redis, and the local engine's S3), each also reported.
        "sharded_vs_single": min((r["sharded_vs_single"] for r in big), default=None),
        "sharded_vs_single_by_backend": {r["backend"]: r["sharded_vs_single"] for r in big},
        "compression_accuracy_cost": {
            c: res["compression"]["codecs"][c].get("accuracy_cost") for c in ("fp16", "bf16")
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    smoke.add_flag(ap)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()
    res = run(a.smoke)
    res["summary"] = summarize(res)
    if a.smoke:
        smoke.report(res)
        return
    print(json.dumps(res["summary"], indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
