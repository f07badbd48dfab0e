"""The worker's memory while it streams ~2 GB of shards (#11: bounded by a few shards, not by
the worker's slice).

A moto server (in its own process) holds a dataset of uint8 images, 3x32x32, in 64 MB shards;
the planner plans one worker whose k steps of batch 512 read every row once, and that worker
runs the real train_step handler in a child process. The child's peak RSS (`ru_maxrss` from
`os.wait4`) is compared with the same worker on two 1 MB shards of the same shape: the
difference is what the data costs. Results: bench/results/loader_memory.json.

    .venv/bin/python bench/loader_memory.py            # ~2 GB (32 x 64 MB)
    .venv/bin/python bench/loader_memory.py --shards 4 # a quick look
    .venv/bin/python bench/loader_memory.py --smoke    # 2 x 1 MB against 2 x 1 MB, nothing written
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402
from bench.moto_server import start_server, stop_server  # noqa: E402

SAMPLE = (3, 32, 32)
BATCH = 512
BUCKET, TABLE = "smlt-data", "smlt-runs"


def environment(endpoint: str, cache: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "SMLT_ARTIFACTS_BUCKET": "smlt-artifacts",
        "SMLT_DATA_BUCKET": BUCKET,
        "SMLT_TABLE": TABLE,
        "SMLT_TRAIN_FUNCTIONS": json.dumps({"1769": "smlt-train-1769"}),
        "SMLT_MEMORY_MB": "1769",
        "SMLT_CACHE_DIR": cache,
    }


def create_stack(boto3) -> None:
    from smlt.runtime.records import create_run_table

    s3 = boto3.client("s3")
    for b in ("smlt-artifacts", BUCKET):
        s3.create_bucket(Bucket=b)
    create_run_table(boto3.client("dynamodb"), TABLE)


def put_dataset(boto3, prefix: str, shards: int, shard_mb: int) -> dict:
    """Random uint8 images in `shards` train shards of ~`shard_mb` MB and one validation shard."""
    from safetensors.numpy import save

    s3 = boto3.client("s3")
    rows = (shard_mb << 20) // math.prod(SAMPLE)
    rng = np.random.default_rng(0)

    def put(key: str, n: int) -> dict:
        blob = save({"x": rng.integers(0, 256, (n, *SAMPLE), np.uint8), "y": rng.integers(0, 10, n).astype(np.int64)})
        s3.put_object(Bucket=BUCKET, Key=prefix + key, Body=blob)
        return {"key": key, "rows": n, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}

    train = [put(f"train-{i:05d}.safetensors", rows) for i in range(shards)]
    val = [put("validation-00000.safetensors", 2048)]
    manifest = {
        "format": "smlt-dataset/2",
        "name": "images",
        "source": "bench",
        "task": "classification",
        "x": {"shape": list(SAMPLE), "dtype": "uint8"},
        "y": {"shape": [], "dtype": "int64"},
        "outputs": 10,
        "train": {"rows": rows * shards, "shards": train},
        "validation": {"rows": 2048, "shards": val},
        "normalization": {"applied": "on_load", "axis": "channel", "mean": [127.5] * 3, "std": [73.9] * 3},
    }
    s3.put_object(Bucket=BUCKET, Key=prefix + "manifest.json", Body=json.dumps(manifest))
    return manifest


def plan(run: str, uri: str, steps: int) -> dict:
    from lambdas.planner.handler import handler as planner

    job = {
        "name": run,
        "dataset": {"uri": uri},
        "model": {"name": "logreg"},
        "training": {"batch_size": BATCH, "local_steps": steps, "max_rounds": 1, "target_value": None},
        "workers": {"initial": 1, "max": 1, "memory_mb": 1769},
    }
    return planner({"op": "plan", "job": job, "execution": run}, None)


def worker(run: str) -> None:
    """Child: worker 0 of round 0, the real handler; prints its record."""
    from lambdas.train_step.handler import handler as train_step
    from smlt.runtime.records import RunTable

    train_step({"run_id": run, "round": 0, "worker": 0}, None)
    print(RunTable(TABLE, run).workers(0)[0].model_dump_json())


def run_child(run: str, env: dict[str, str]) -> dict:
    t = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, __file__, "--worker", run], env={**os.environ, **env}, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"worker {run} failed ({p.returncode})")
    record = json.loads(out.strip().splitlines()[-1])
    return {"peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "wall_s": round(time.perf_counter() - t, 2), **record}


def measure(shards: int, shard_mb: int) -> dict:
    proc, endpoint = start_server("1")
    try:
        with tempfile.TemporaryDirectory() as cache:
            env = environment(endpoint, cache)
            os.environ.update(env)
            import boto3

            create_stack(boto3)
            results = {}
            # The baseline: the same worker, model and sample shape on two 1 MB shards.
            for name, n, mb in (("baseline", 2, 1), ("streaming", shards, shard_mb)):
                t = time.perf_counter()
                manifest = put_dataset(boto3, f"{name}/", n, mb)
                upload_s = time.perf_counter() - t
                steps = math.ceil(manifest["train"]["rows"] / BATCH)  # every row once
                plan(name, f"s3://{BUCKET}/{name}/", steps)
                r = run_child(name, {**env, "SMLT_CACHE_DIR": os.path.join(cache, name)})
                r.update(
                    shards=n,
                    shard_mb=round(manifest["train"]["shards"][0]["bytes"] / 2**20, 1),
                    slice_mb=round(sum(s["bytes"] for s in manifest["train"]["shards"]) / 2**20, 1),
                    rows=manifest["train"]["rows"],
                    dataset_upload_s=round(upload_s, 1),
                )
                results[name] = r
                print(f"{name}: {json.dumps(r)}", flush=True)
    finally:
        stop_server(proc)
    base, big = results["baseline"], results["streaming"]
    results["data_cost_mb"] = round(big["peak_rss_mb"] - base["peak_rss_mb"], 1)
    results["data_cost_shards"] = round(results["data_cost_mb"] / big["shard_mb"], 2)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--shard-mb", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "loader_memory.json"))
    smoke.add_flag(ap)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    if a.smoke:
        smoke.report(measure(2, 1))
        return None
    res = measure(a.shards, a.shard_mb)
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, dict)}))
    if a.shards >= 32:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
