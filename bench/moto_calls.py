"""Per-call cost of moto's S3 and DynamoDB through the local engine's threaded moto server, with
and without smlt.local.speed's patches, in the same run.

Two servers run side by side, each in its own process (``SMLT_LOCAL_SPEEDUPS=0`` and ``=1``; the
patches are process-wide), holding the same data; this process is the client (as a handler
process is) and alternates every call between them, so machine noise hits both alike. Prints the
median of each call on each and the ratio (unpatched / patched).

    .venv/bin/python bench/moto_calls.py [--reps N] [--json PATH]
    .venv/bin/python bench/moto_calls.py --aggregation   # + sharded vs single on S3 (~5 min)
    .venv/bin/python bench/moto_calls.py --smoke         # every call once on small data, + 8 x 1M aggregation

``--aggregation`` also runs bench/aggregation_bench.py's store benchmark (single aggregator vs k
sharded reducers, ranged GETs; 8 and 32 updates of 11M parameters) against each of the two
servers in turn (aggregation_bench.py itself runs a stock ``moto_server``, without the patches).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402 - needs ROOT on the path
from bench.moto_server import start_server, stop_server  # noqa: E402
from smlt.runtime.records import create_run_table  # noqa: E402

BUCKET, TABLE = "bench", "runs"
BIG = 44 * 1024 * 1024  # one update/model blob of the sharded-aggregation bench
PART_ITEMS = 300  # items of ~2 KB in the queried partition
KINDS = ("PLAN#", "ROUND#", "SEAL#", "WORKER#")


def item(pk: str, sk: str, i: int) -> dict:
    """A ROUND-like item (~2 KB of DynamoDB JSON): scalars and a list of per-worker timing maps."""
    d = {
        "pk": {"S": pk},
        "sk": {"S": sk},
        "round": {"N": str(i)},
        "stop": {"BOOL": False},
        "reason": {"S": "plan: 8 x 1769 MB, 20 local steps"},
    }
    for j in range(16):
        d[f"m{j}"] = {"N": f"{i * 1.37 + j:.6f}"}
    d["timings"] = {
        "L": [
            {"M": {**{f"t{j}": {"N": f"{w + j / 3:.6f}"} for j in range(8)}, "cold": {"BOOL": w == 0}}}
            for w in range(8)
        ]
    }
    return d


def setup(s3, ddb, big: int = BIG, part_items: int = PART_ITEMS) -> None:
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="big", Body=os.urandom(1024 * 1024) * (big // (1024 * 1024)))
    s3.put_object(Bucket=BUCKET, Key="small", Body=os.urandom(4096))
    create_run_table(ddb, TABLE)
    # ACTIVE before the first write: moto's table is at once, another server's (dynalite,
    # bench/alt_servers.py) may be CREATING for a moment on a busy machine
    ddb.get_waiter("table_exists").wait(TableName=TABLE, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    for pk in ("RUN#a", "RUN#b"):  # two runs: moto's Query sorted the whole table
        for i in range(part_items):
            ddb.put_item(TableName=TABLE, Item=item(pk, f"{KINDS[i % 4]}{i // 4:04d}#{i % 8}", i))


def calls(s3, ddb, size: int = BIG):
    """name -> function; every call is idempotent or uses fresh keys. The names are the
    recorded sizes' (`--smoke` runs the same calls on smaller data)."""
    n = {"put": 0}
    small = os.urandom(4096)
    big = os.urandom(size)
    part = size // 8

    def fresh() -> str:
        n["put"] += 1
        return f"new#{n['put']}"

    def query(cond: str, **vals: str) -> int:
        values = {":pk": {"S": "RUN#a"}, **{f":{k}": {"S": v} for k, v in vals.items()}}
        resp = ddb.query(
            TableName=TABLE, ConsistentRead=True, KeyConditionExpression=cond, ExpressionAttributeValues=values
        )
        return len(resp["Items"])

    return {
        "s3 PutObject 4 KB": lambda: s3.put_object(Bucket=BUCKET, Key=fresh(), Body=small),
        "s3 GetObject 4 KB": lambda: s3.get_object(Bucket=BUCKET, Key="small")["Body"].read(),
        "s3 PutObject 44 MB": lambda: s3.put_object(Bucket=BUCKET, Key="big-put", Body=big),
        "s3 GetObject 44 MB": lambda: s3.get_object(Bucket=BUCKET, Key="big")["Body"].read(),
        "s3 GetObject 44 MB, Range 1/8": lambda: s3.get_object(
            Bucket=BUCKET, Key="big", Range=f"bytes={3 * part}-{4 * part - 1}"
        )["Body"].read(),
        "s3 GetObject 44 MB, Range 64 KB": lambda: s3.get_object(
            Bucket=BUCKET, Key="big", Range="bytes=1000000-1065535"
        )["Body"].read(),
        "ddb GetItem": lambda: ddb.get_item(
            TableName=TABLE, ConsistentRead=True, Key={"pk": {"S": "RUN#a"}, "sk": {"S": "ROUND#0007#5"}}
        ),
        "ddb PutItem (conditional)": lambda: ddb.put_item(
            TableName=TABLE, Item=item("RUN#b", fresh(), 1), ConditionExpression="attribute_not_exists(pk)"
        ),
        "ddb TransactWriteItems (check + put)": lambda: ddb.transact_write_items(
            TransactItems=[
                {
                    "ConditionCheck": {
                        "TableName": TABLE,
                        "Key": {"pk": {"S": "RUN#a"}, "sk": {"S": "SEAL#9999"}},
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {
                    "Put": {
                        "TableName": TABLE,
                        "Item": item("RUN#b", fresh(), 2),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
            ]
        ),
        "ddb BatchGetItem 8 keys": lambda: ddb.batch_get_item(
            RequestItems={
                TABLE: {
                    "ConsistentRead": True,
                    "Keys": [{"pk": {"S": "RUN#a"}, "sk": {"S": f"WORKER#{i:04d}#3"}} for i in range(8)],
                }
            }
        ),
        f"ddb Query begins_with, {PART_ITEMS} items -> 1": lambda: query(
            "pk = :pk AND begins_with(sk, :p)", p="PLAN#0040#"
        ),
        f"ddb Query begins_with, {PART_ITEMS} items -> 75": lambda: query(
            "pk = :pk AND begins_with(sk, :p)", p="ROUND#"
        ),
        f"ddb Query BETWEEN, {PART_ITEMS} items -> 10": lambda: query(
            "pk = :pk AND sk BETWEEN :a AND :b", a="ROUND#0065", b="ROUND#~"
        ),
    }


def aggregation(cases: list[tuple[int, str]]) -> dict:
    """aggregation_bench.bench_store on S3 through an unpatched, then a patched server."""
    sys.path.insert(0, str(ROOT))
    from bench import aggregation_bench

    out = {}
    for mode in ("0", "1"):
        p, url = start_server(mode)
        try:
            aggregation_bench.s3_client(url).create_bucket(Bucket="bench")
            print(f"SMLT_LOCAL_SPEEDUPS={mode}", flush=True)
            rows = aggregation_bench.bench_store("s3", ("s3", url), cases, repeats=1)
        finally:
            stop_server(p)
        out["patched" if mode == "1" else "unpatched"] = [
            {
                k: r[k]
                for k in (
                    "updates",
                    "size",
                    "aggregators",
                    "single_s",
                    "sharded_s",
                    "sharded_vs_single",
                    "one_reducer_s",
                    "full_get_s",
                    "range_get_s",
                    "range_fraction",
                )
            }
            for r in rows
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15, help="repetitions per call and server (at most)")
    ap.add_argument(
        "--budget",
        type=float,
        default=3.0,
        help="seconds of unpatched calls per measurement, fewer repetitions if slower",
    )
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument(
        "--aggregation", action="store_true", help="also aggregation_bench's S3 store benchmark on each server (~5 min)"
    )
    smoke.add_flag(ap)
    args = ap.parse_args()
    big, part_items = (2 * 1024 * 1024, 40) if args.smoke else (BIG, PART_ITEMS)

    import boto3
    from botocore.config import Config

    procs, clients = {}, {}
    try:
        for mode in ("0", "1"):
            procs[mode], url = start_server(mode)
            kw = dict(
                endpoint_url=url,
                region_name="us-east-1",
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                config=Config(retries={"max_attempts": 1}),
            )
            clients[mode] = (boto3.client("s3", **kw), boto3.client("dynamodb", **kw))
            setup(*clients[mode], big, part_items)
        fns = {mode: calls(*clients[mode], big) for mode in clients}
        out = {}
        t_start = time.perf_counter()
        print(f"{'call':42s} {'unpatched':>12s} {'patched':>12s}   ratio")
        for name in fns["0"]:
            for mode in ("0", "1"):  # warm up
                fns[mode][name]()
            times = {"0": [], "1": []}
            t = time.perf_counter()
            fns["0"][name]()  # slow calls (unpatched: up to ~1 s) get fewer repetitions
            reps = 1 if args.smoke else max(5, min(args.reps, int(args.budget / (time.perf_counter() - t))))
            for _ in range(reps):
                for mode in ("0", "1"):
                    t = time.perf_counter()
                    fns[mode][name]()
                    times[mode].append(time.perf_counter() - t)
            off, on = (statistics.median(times[m]) * 1e3 for m in ("0", "1"))
            out[name] = {
                "unpatched_ms": round(off, 2),
                "patched_ms": round(on, 2),
                "ratio": round(off / on, 2),
                "reps": reps,
            }
            print(f"{name:42s} {off:9.2f} ms {on:9.2f} ms   x{off / on:5.1f}   ({reps} reps)", flush=True)
        print(f"(medians of alternating calls; {time.perf_counter() - t_start:.0f} s)")
    finally:
        for p in procs.values():
            stop_server(p)
    results = {"calls": out}
    if args.aggregation or args.smoke:
        results["aggregation"] = aggregation([(8, "1M")] if args.smoke else [(8, "11M"), (32, "11M")])
        for mode, rows in results["aggregation"].items():
            for r in rows:
                print(
                    f"{mode:9s} {r['updates']:>2} x {r['size']}: single {r['single_s']:.2f} s, sharded "
                    f"k={r['aggregators']} {r['sharded_s']:.2f} s -> {r['sharded_vs_single']:.2f}x; ranged GET "
                    f"of 1/{round(1 / r['range_fraction'])} {r['range_get_s'] * 1e3:.0f} ms vs whole "
                    f"{r['full_get_s'] * 1e3:.0f} ms"
                )
    if args.smoke:
        smoke.report(results)
    elif args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
