"""The sharded aggregation path (prepare / slice / finish) dying right after each of its writes.

In-process on moto (as tests/functional/handlers/test_sharded.py drives it): the digits MLP with
plan_slices' thresholds lowered (8 aggregators in rounds 1 and 2), max_rounds 3. One op
invocation of round R dies right after its k-th successful S3/DynamoDB write (the botocore call
returned, then a BaseException nothing in the step catches), the state machine's retry runs the
op again, then the run goes on to its end. Compared with the uncrashed run: every model r (bit for
bit), the final model's sha256, the ROUND items (accepted, rejected, workers_ok, model_sha256,
stop), and smlt.reconcile's findings (none).

usage: python shard_sweep.py            # the whole sweep
       python shard_sweep.py slice 1 0+7  # ops (a+b, or any), round, slices
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.getcwd())
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "SMLT_ARTIFACTS_BUCKET": "smlt-artifacts",
        "SMLT_DATA_BUCKET": "smlt-data",
        "SMLT_TABLE": "smlt-runs",
        "SMLT_TRAIN_FUNCTIONS": json.dumps({"1769": "smlt-train-1769", "3008": "smlt-train-3008"}),
        "SMLT_MEMORY_MB": "1769",
        "SMLT_CACHE_DIR": "/tmp/shardsweep-cache",
        "SMLT_AGGREGATOR_READ_BYTES": "1",
        "SMLT_MIN_SLICE_BYTES": os.environ.get("SMLT_MIN_SLICE_BYTES", "8192"),
    }
)
# SWEEP_MODEL=tests.functional.handlers.test_buffers:bn_cnn (with SMLT_MIN_SLICE_BYTES=1024): a
# model with batch norms, whose integer counters travel in the sliced model's `rest` object.
MODEL = os.environ.get("SWEEP_MODEL")
os.environ.pop("AWS_ENDPOINT_URL", None)

import boto3  # noqa: E402
import botocore.client  # noqa: E402
from moto import mock_aws  # noqa: E402

WRITES = {"PutObject", "DeleteObject", "DeleteObjects", "PutItem", "UpdateItem", "DeleteItem"} | {
    "TransactWriteItems",
    "BatchWriteItem",
}


class Died(BaseException):
    pass


class Crash:
    """Counts writes while armed; raises Died right after the k-th (k None: only counts)."""

    def __init__(self):
        self.k = None
        self.armed = False
        self.n = 0
        self.names: list[str] = []  # the writes counted, as "Operation key-or-item"
        real = botocore.client.BaseClient._make_api_call
        me = self

        def call(client, name, params):
            out = real(client, name, params)
            if me.armed and name in WRITES:
                me.n += 1
                what = params.get("Key") or (params.get("Item") or {}).get("sk") or params.get("Key", "")
                me.names.append(f"{name} {str(what)[-48:]}")
                if me.k is not None and me.n == me.k:
                    me.armed = False
                    raise Died(f"after write {me.n}: {name} {params.get('Key') or params.get('TableName')}")
            return out

        botocore.client.BaseClient._make_api_call = call


CRASH = Crash()


def one_run(target=None, k=None):
    """target: (op, round, slice or None). Returns the run's outcome."""
    from smlt.runtime import clients, keys
    from smlt.runtime.data.prepare import prepare_dataset
    from smlt.runtime.data.shards import read_manifest

    with mock_aws():
        clients.reset(), read_manifest.cache_clear()
        s3 = boto3.client("s3")
        for b in ("smlt-artifacts", "smlt-data"):
            s3.create_bucket(Bucket=b)
        from smlt.runtime.records import create_run_table

        create_run_table(boto3.client("dynamodb"), "smlt-runs")
        prepare_dataset("sklearn:digits", "s3://smlt-data/datasets/digits/", shards=8)
        from lambdas.aggregate.handler import handler as aggregate
        from lambdas.planner.handler import handler as planner
        from lambdas.train_step.handler import handler as train_step

        j = {
            "name": "t",
            "run_id": "s",
            "dataset": {"uri": "s3://smlt-data/datasets/digits/"},
            "training": {"local_steps": 20, "max_rounds": 3, "target_value": None},
            "workers": {"initial": 4, "memory_mb": 1769},
            **({"model": {"name": MODEL}} if MODEL else {}),
        }
        writes, names, died = {}, {}, []

        def op(ev, name, rnd, sl=None):
            hit = target is not None and target == (name, rnd, sl)
            CRASH.n, CRASH.armed, CRASH.k, CRASH.names = 0, True, (k if hit else None), []
            try:
                out = aggregate(ev, None)
            except Died as e:
                died.append(str(e))
                CRASH.n, CRASH.armed, CRASH.k = 0, False, None
                out = aggregate(ev, None)  # the state machine's retry
            writes[(name, rnd, sl)] = CRASH.n
            names[(name, rnd, sl)] = CRASH.names
            CRASH.armed = False
            return out

        aggs = []
        for _ in range(10):
            p = planner({"op": "plan", "job": j, "execution": "s"}, None)
            if p["action"] == "stop":
                break
            aggs.append(p.get("aggregators", 1))
            for w in p["workers"]:
                train_step({"run_id": "s", "round": p["round"], "worker": w}, None)
            ev = {"run_id": "s", "round": p["round"]}
            if p.get("aggregators", 1) <= 1:
                a = op({**ev, "outcomes": []}, "aggregate", p["round"])
            else:
                prep = op({**ev, "op": "prepare"}, "prepare", p["round"])
                if not prep["proceed"]:
                    a = prep
                else:
                    for sl in p["slices"]:
                        op({**ev, "op": "slice", "slice": sl, "of": p["aggregators"]}, "slice", p["round"], sl)
                    a = op({**ev, "op": "finish"}, "finish", p["round"])
            if a["stop"]:
                break
        final = planner({"op": "finalize", "run_id": "s"}, None)
        from smlt.reconcile import reconcile
        from smlt.runtime.items import RoundItem
        from smlt.runtime.model_store import read_model
        from smlt.runtime.records import RunTable
        from smlt.runtime.store import S3Store

        store = S3Store("smlt-artifacts")
        models = {}
        for r in range(1, 5):
            try:
                m = read_model(store, "s", r)
            except Exception:
                continue
            models[r] = hashlib.sha256(b"".join(m[n].tobytes() for n in sorted(m))).hexdigest()[:12]
        table = RunTable("smlt-runs", "s")
        rounds = {}
        for r in range(0, 5):
            it = table.get(keys.round_sk(r), RoundItem)
            if it is not None:
                rounds[r] = (
                    [(a.worker, a.samples) for a in it.accepted],
                    sorted(it.rejected or {}) if isinstance(it.rejected, dict) else it.rejected,
                    it.workers_ok,
                    it.model_sha256,
                    it.stop,
                    it.aggregators,
                )
        blob = s3.get_object(Bucket="smlt-artifacts", Key=keys.final_model_key("s"))["Body"].read()
        findings = reconcile(s3, boto3.client("dynamodb"), "smlt-artifacts", "smlt-runs", "s").findings
        return {
            "aggs": aggs,
            "final_sha": hashlib.sha256(blob).hexdigest()[:12],
            "val": final.get("val_accuracy"),
            "models": models,
            "rounds": rounds,
            "findings": [str(f)[:200] for f in findings],
            "writes": writes,
            "names": names,
            "died": died,
        }


def compare(base, got):
    bad = []
    for key in ("aggs", "final_sha", "val", "models", "rounds"):
        if base[key] != got[key]:
            bad.append(f"{key}: {got[key]} != {base[key]}")
    if got["findings"]:
        bad.append(f"reconcile: {got['findings']}")
    return bad


if __name__ == "__main__":
    base = one_run()
    again = one_run()
    print("deterministic:", compare(base, again) or "yes", "final", base["final_sha"], "aggs", base["aggs"])
    print("writes:", {f"{o}{r}{'' if s is None else '/' + str(s)}": n for (o, r, s), n in base["writes"].items()})
    for t in (("prepare", 1, None), ("slice", 1, 0), ("slice", 1, 1), ("finish", 1, None)):
        print("writes of", t, base["names"][t])
    targets = [t for t in base["writes"] if t[0] in ("prepare", "slice", "finish")]
    only = sys.argv[1:]
    if only:
        ops = only[0].split("+")  # e.g. prepare+finish, or any
        targets = [t for t in targets if "any" in ops or t[0] in ops]
        if len(only) > 1:
            targets = [t for t in targets if t[1] == int(only[1])]
        if len(only) > 2:
            targets = [t for t in targets if t[2] in {int(x) for x in only[2].split("+")}]
    rows = []
    for t in targets:
        for k in range(1, base["writes"][t] + 1):
            got = one_run(t, k)
            bad = compare(base, got) if got["died"] else ["did not die"]
            line = f"{t[0]} r{t[1]}{'' if t[2] is None else ' s' + str(t[2])} k={k}: " + (
                "OK" if not bad else "; ".join(bad)
            )
            print(line, flush=True)
            rows.append(line)
