"""crash=K at each control-step invocation of an upload-triggered pipeline version."""

import hashlib
import json
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from harness import World, crash_nth

from smlt.runtime import keys
from smlt.runtime.store import S3Store

w = World()
pipe = "sw"
art = S3Store(w.names.artifacts_bucket)


def promotions():
    s3 = w.engine.client("s3")
    r = s3.list_objects_v2(Bucket=w.names.artifacts_bucket, Prefix=f"pipelines/{pipe}/promotions/")
    return r.get("KeyCount", 0)


def check(v, desc, before_promotions):
    o = w.outcome(pipe, v, desc)
    bad = []
    if o["status"] != "SUCCEEDED":
        bad.append(f"execution {o['status']} {o.get('error')}")
    if o.get("rec_status") not in ("promoted", "rejected"):
        bad.append(f"record {o.get('rec_status')}")
    if o["messages"] != [o.get("rec_status")]:
        bad.append(f"messages {o['messages']}")
    if (o["latest"] == v) != bool(o.get("promoted")):
        bad.append(f"latest {o['latest']} promoted {o.get('promoted')}")
    d = promotions() - before_promotions
    if d != (1 if o.get("promoted") else 0):
        bad.append(f"promotion entries +{d}")
    if o.get("meta") != "SUCCEEDED":
        bad.append(f"META {o.get('meta')}")
    if o.get("rounds") != 2:
        bad.append(f"rounds {o.get('rounds')}")
    try:
        rec = json.loads(art.get(keys.pipeline_version_key(pipe, v)))
        run = rec["run_id"]
        blob = art.get(keys.final_model_key(run))
        m = json.loads(art.get(keys.final_metrics_key(run)))["final"]
        if hashlib.sha256(blob).hexdigest() != m["model_sha256"] or rec.get("model_sha256") != m["model_sha256"]:
            bad.append("final model sha differs from metrics/record")
        ddb = w.engine.client("dynamodb")
        items = ddb.query(
            TableName=w.names.table,
            KeyConditionExpression="pk = :p",
            ExpressionAttributeValues={":p": {"S": f"RUN#{run}"}},
        )["Items"]
        plans = [i for i in items if i["sk"]["S"].startswith("PLAN#")]
        if any(int(p.get("attempts", {"N": "0"})["N"]) for p in plans):
            bad.append("PLAN attempts > 0")
        rounds = [i for i in items if i["sk"]["S"].startswith("ROUND#")]
        if len(rounds) != 3:
            bad.append(f"{len(rounds)} ROUND items")
        errs = [i["sk"]["S"] for i in items if i["sk"]["S"].startswith(("ERROR#", "FATAL"))]
        if errs:
            bad.append(f"errors {errs}")
        if m.get("trained_fraction") != 1.0:
            bad.append(f"trained_fraction {m.get('trained_fraction')}")
    except Exception as e:
        bad.append(f"read: {e!r}"[:120])
    return o, bad


cases = [(None, 0, 0)]
for kind, n in [
    ("prepare_data", 1),
    ("plan", 1),
    ("plan", 2),
    ("plan", 3),
    ("plan", 4),
    ("aggregate", 1),
    ("aggregate", 2),
    ("aggregate", 3),
    ("finalize", 1),
]:
    cases += [(kind, n, k) for k in range(1, 3 if kind == "prepare_data" else 13)]
only = sys.argv[1:]  # kinds to sweep
i = 0
w.version(pipe, "v1")  # the first champion
skip = set()
for kind, n, k in cases:
    if kind is not None and ((kind, n) in skip or (only and kind not in only)):
        continue
    i += 1
    v = f"c{i}"
    before_inv, before_p = len(w.engine.invocations), promotions()
    filt = crash_nth(kind, n, k) if kind else None
    w.trigger.seen.pop(f"incoming/{pipe}/{v}/_SUCCESS", None)
    # each case: the v2 data as a new version
    import harness

    (harness.TMP / f"{v}.csv").write_bytes((harness.TMP / "v2.csv").read_bytes())
    desc = w.version(pipe, v, filt)
    died = [c for c in w.engine.invocations[before_inv:] if c[2] in ("Runtime.ExitError",)]
    o, bad = check(v, desc, before_p)
    if kind is not None and not died:
        skip.add((kind, n))
        print(f"{kind}#{n} k={k}: no crash (fewer writes)", flush=True)
        if bad:
            print("   (no crash but:", bad, ")")
        continue
    print(
        f"{kind}#{n} k={k}: {'OK' if not bad else 'BAD ' + '; '.join(bad)}  [{o.get('rec_status')} val={o.get('val')} msgs={o['messages']}]",
        flush=True,
    )
w.engine.stop()
