import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from harness import World, crash_nth

w = World()


def promos(pipe):
    r = w.engine.client("s3").list_objects_v2(Bucket=w.names.artifacts_bucket, Prefix=f"pipelines/{pipe}/promotions/")
    return r.get("KeyCount", 0)


for k in ["none"] + list(range(1, 12)):
    pipe = f"f{k}"
    before = len(w.engine.invocations)
    d = w.version(pipe, "v1", None if k == "none" else crash_nth("finalize", 1, k))
    died = sum(c[2] == "Runtime.ExitError" for c in w.engine.invocations[before:])
    o = w.outcome(pipe, "v1", d)
    bad = []
    if o["status"] != "SUCCEEDED":
        bad.append(f"execution {o['status']}")
    if o.get("rec_status") != "promoted" or o["latest"] != "v1":
        bad.append(f"record {o.get('rec_status')} latest {o['latest']}")
    if o["messages"] != ["promoted"]:
        bad.append(f"messages {o['messages']}")
    if promos(pipe) != 1:
        bad.append(f"promotions {promos(pipe)}")
    if o.get("meta") != "SUCCEEDED":
        bad.append(f"META {o.get('meta')}")
    print(f"finalize(v1, promoted) k={k}: died={died} {'OK' if not bad else 'BAD ' + '; '.join(bad)}", flush=True)
    if k != "none" and not died:
        break
w.engine.stop()
