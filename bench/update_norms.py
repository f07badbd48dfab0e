"""The spread of honest update norms within a round, which the aggregator's guard
(`smlt.runtime.aggregate.guard`: refuse an update above 10x the round's median norm) must never reach.

Drives the three handlers on moto (as tests/functional/handlers do) for digits' MLP and LeNet with
4 and 8 workers, and after every round reads the round's updates and takes their L2 norms. Also
times sha256 over a ResNet-50-sized (100 MB) blob. Writes bench/results/update_norms.json.

    nice -n 10 .venv/bin/python bench/update_norms.py [--rounds 15] [--smoke]

`--smoke`: the MLP with 2 workers for 2 rounds and the hash of 1 MB; printed, not written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import boto3
from moto import mock_aws

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import smoke  # noqa: E402 - needs ROOT on the path when run as a script

JOBS = {
    "digits-mlp": {"dataset": "sklearn:digits", "model": {"name": "mlp", "params": {"hidden": [128, 64]}}},
    "digits-lenet": {"dataset": "sklearn:digits?shape=1x8x8", "model": {"name": "lenet"}},
}


def _env(tmp: str) -> None:
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        SMLT_CACHE_DIR=tmp,
        SMLT_ARTIFACTS_BUCKET="smlt-artifacts",
        SMLT_DATA_BUCKET="smlt-data",
        SMLT_TABLE="smlt-runs",
        SMLT_TRAIN_FUNCTIONS=json.dumps({"1769": "smlt-train-1769"}),
        SMLT_MEMORY_MB="1769",
    )
    os.environ.pop("AWS_ENDPOINT_URL", None)


def _norms_of_run(name: str, workers: int, rounds: int) -> list[list[float]]:
    from lambdas.aggregate.handler import handler as aggregate
    from lambdas.planner.handler import handler as planner
    from lambdas.train_step.handler import handler as train_step
    from smlt.runtime import keys
    from smlt.runtime.data.prepare import prepare_dataset
    from smlt.runtime.tensors.digest import update_norm

    spec = JOBS[name]
    uri = f"s3://smlt-data/datasets/{name}/"
    prepare_dataset(spec["dataset"], uri, shards=8)
    job = {
        "name": name,
        "dataset": {"uri": uri},
        "model": spec["model"],
        "training": {
            "optimizer": "sgd",
            "learning_rate": 0.05,
            "momentum": 0.9,
            "batch_size": 32,
            "local_steps": 20,
            "max_rounds": rounds,
            "target_value": None,
        },
        "workers": {"initial": workers, "memory_mb": 1769, "planner": "fixed"},
    }
    s3, run_id, out = boto3.client("s3"), f"{name}-{workers}", []
    for _ in range(rounds):
        p = planner({"op": "plan", "job": job, "execution": run_id}, None)
        if p["action"] != "train":
            break
        for w in p["workers"]:
            train_step({"run_id": p["run_id"], "round": p["round"], "worker": w}, None)
        keys_ = [keys.update_key(p["run_id"], p["round"], w) for w in p["workers"]]
        out.append([update_norm(s3.get_object(Bucket="smlt-artifacts", Key=k)["Body"].read()) for k in keys_])
        if aggregate({"run_id": p["run_id"], "round": p["round"]}, None)["stop"]:
            break
    return out


def _hash_seconds(mb: int) -> float:
    blob = os.urandom(mb << 20)
    t0 = time.perf_counter()
    hashlib.sha256(blob).hexdigest()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    smoke.add_flag(ap)
    args = ap.parse_args()
    jobs, worker_counts, hash_mb = (list(JOBS)[:1], (2,), 1) if args.smoke else (list(JOBS), (4, 8), 100)
    if args.smoke:
        args.rounds = 2
    results: dict = {f"hash_{hash_mb}MB_s": round(min(_hash_seconds(hash_mb) for _ in range(3)), 4), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp, mock_aws():
        _env(tmp)
        from smlt.runtime.records import create_run_table

        boto3.client("s3").create_bucket(Bucket="smlt-artifacts")
        boto3.client("s3").create_bucket(Bucket="smlt-data")
        create_run_table(boto3.client("dynamodb"), "smlt-runs")
        for name in jobs:
            for workers in worker_counts:
                norms = _norms_of_run(name, workers, args.rounds)
                ratios = [max(r) / statistics.median(r) for r in norms]
                lows = [min(r) / statistics.median(r) for r in norms]
                results["runs"][f"{name} x{workers}"] = {
                    "rounds": len(norms),
                    "median_norm_first_last": [
                        round(statistics.median(norms[0]), 4),
                        round(statistics.median(norms[-1]), 4),
                    ],
                    "max_over_median": round(max(ratios), 4),
                    "min_over_median": round(min(lows), 4),
                }
                print(f"{name} x{workers}: {results['runs'][f'{name} x{workers}']}", flush=True)
    print(f"sha256 of {hash_mb} MB: {results[f'hash_{hash_mb}MB_s']} s")
    if args.smoke:
        smoke.report(results)
        return
    path = Path(__file__).parent / "results" / "update_norms.json"
    path.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
