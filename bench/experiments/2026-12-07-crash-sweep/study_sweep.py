import json
import os
import sys

sys.path.insert(0, os.getcwd())
os.environ.setdefault("SMLT_HOME", "/tmp/faults/home")
from pathlib import Path

from smlt import studies as tune
from smlt.runner import start_engine
from smlt.runtime.study.items import StudyTable

engine, names, _ = start_engine(None)
target = tune.local_target(engine)
raw = json.loads(Path("examples/digits-study.json").read_text())
raw["job"]["training"]["max_rounds"] = 2
raw["job"]["training"]["local_steps"] = 5
raw.update(trials=2, concurrency=2, search={"kind": "random"}, deadline_seconds=120, budget_usd=0.05, poll_seconds=3)
path = Path("/tmp/faults/study.json")
path.write_text(json.dumps(raw))


def crash(op, nth, k):
    n = {"c": 0}

    def filt(function, payload):
        if isinstance(payload, dict) and payload.get("op") == op and ("study_id" in payload or "study" in payload):
            n["c"] += 1
            if n["c"] == nth:
                return f"crash:{k}"
        return "ok"

    return filt


def one(sid, filt):
    engine.invoke_filter = filt
    before = len(engine.invocations)
    err = None
    try:
        tune.run(target, path, Path(f"/tmp/faults/sout/{sid}"), study_id=sid)
    except Exception as e:
        err = f"{type(e).__name__}: {str(e)[:150]}"
    finally:
        engine.invoke_filter = None
    died = sum(c[2] == "Runtime.ExitError" for c in engine.invocations[before:])
    t = StudyTable(names.table, sid, client=engine.client("dynamodb"))
    m = t.study()
    trials = t.trials()
    bad = []
    if err:
        bad.append(err)
    if m is None:
        return died, ["no META"]
    if m.status != "SUCCEEDED":
        bad.append(f"status {m.status}")
    if m.started != 2:
        bad.append(f"started {m.started}")
    if sorted(m.settled) != [0, 1]:
        bad.append(f"settled {m.settled}")
    spent = sum(tr.cost_usd for tr in trials)
    if abs(m.reserved_usd - spent) > 1e-9:
        bad.append(f"reserved {m.reserved_usd:.6f} != spent {spent:.6f}")
    if [tr.status for tr in trials] != ["SUCCEEDED", "SUCCEEDED"]:
        bad.append(f"trials {[tr.status for tr in trials]}")
    if m.best_model_key is None:
        bad.append("no best model")
    return died, bad


i = 0
if len(sys.argv) > 1:
    for j, spec in enumerate(sys.argv[1:]):
        op, nth, k = spec.split(":")
        print(spec, one(f"re-{j}", crash(op, int(nth), int(k))), flush=True)
    engine.stop()
    sys.exit()
print("none", one("st-none", None), flush=True)
for op, nth in [("init", 1), ("admit", 1), ("admit", 2), ("ended", 1), ("ended", 2), ("watch", 1), ("finish", 1)]:
    for k in range(1, 8):
        i += 1
        died, bad = one(f"st-{i}", crash(op, nth, k))
        if not died:
            print(f"{op}#{nth} k={k}: no crash (fewer writes)", "" if not bad else bad, flush=True)
            break
        print(f"{op}#{nth} k={k}: {'OK' if not bad else 'BAD ' + '; '.join(bad)}", flush=True)
engine.stop()
