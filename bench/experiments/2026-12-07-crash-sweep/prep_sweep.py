"""PrepareData dying after its k-th write, k = 1, 2, ... until it ends first (the retry taking
over), then dying on both attempts: outcome, dataset and messages against the uncrashed run."""

import json

from harness import World, crash_nth
from prep_sweep_lib import dataset

w = World()
base = w.version("pbase", "v1")
ref = dataset(w, base)
print("base", base["status"], w.outcome("pbase", "v1", base)["messages"], len(ref[0]), ref[1], flush=True)
for k in range(1, 30):
    pipe = f"pk{k}"
    seen = []
    inner = crash_nth("prepare_data", 1, k)

    def filt(function, payload, inner=inner, seen=seen):
        if isinstance(payload, dict) and str(payload.get("op", "")).startswith("prepare_"):
            seen.append(payload["op"])
        return inner(function, payload)

    desc = w.version(pipe, "v1", filt)
    out = w.outcome(pipe, "v1", desc)
    same = desc["status"] == "SUCCEEDED" and dataset(w, desc) == ref
    print(
        k,
        desc["status"],
        seen,
        "same dataset" if same else "DIFFERENT",
        out.get("rec_status"),
        out["messages"],
        flush=True,
    )
    if seen == ["prepare_data"]:
        break  # it ended before write k: no more writes to crash after
count = {"n": 0}


def twice(function, payload):
    if isinstance(payload, dict) and payload.get("op") == "prepare_data":
        count["n"] += 1
        return "crash:1"
    return "ok"


desc = w.version("ptwice", "v1", twice)
out = w.outcome("ptwice", "v1", desc)
print(
    "twice",
    desc["status"],
    desc.get("error"),
    count["n"],
    out["messages"],
    json.loads(desc["cause"])["errorMessage"][:120],
)
