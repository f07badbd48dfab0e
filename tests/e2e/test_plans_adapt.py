"""The adaptive planner on the local engine: the digits CNN with a deadline and a budget. Each
plan after the first says what changed since the last round (the step time measured against
what was predicted, the round's time and cost, the metric, the plan before), those numbers are
the ones the workers recorded, and the plans change between rounds."""

import json
import re
from pathlib import Path

from smlt.datasets import stage_dataset
from smlt.runner import execute
from smlt.runtime.records import RunTable

ROOT = Path(__file__).resolve().parents[2]
SINCE = re.compile(
    r"since round (\d+): step time measured ([\d.]+) ms at (\d+) MB vs ([\d.]+) ms predicted.*?"
    r"round took ([\d.]+) s and \$([\d.]+), val_accuracy [\d.]+(?: -> ([\d.]+))?, "
    r"(plan kept|plan changed from (\d+) workers x (\d+) MB x (\d+) steps)"
)


def test_digits_cnn_plans_change_for_the_reasons_they_state(local, tmp_path):
    engine, names = local
    job = json.loads((ROOT / "examples/digits-cnn.json").read_text())
    job["workers"] = {"initial": 2, "min": 1, "max": 8, "planner": "adaptive"}
    job["training"].update(max_rounds=6, target_value=0.99)
    job["constraints"] = {"deadline_seconds": 900, "budget_usd": 0.05}
    job["dataset"] = {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))}
    execute(engine, names, "plans-adapt", job, tmp_path)

    table = RunTable(names.table, "plans-adapt", client=engine.client("dynamodb"))
    rounds = {r.round: r for r in table.rounds()}
    plans = [p for p in table.plans() if p.action == "train" and p.local_steps > 0]
    assert len(plans) >= 3, [p.reason for p in plans]
    assert "since round" not in plans[0].reason  # round 0 is planned on the priors
    shapes = []
    for p in plans:
        print(f"\nround {p.round}: {p.reason}")
        shapes.append((p.workers, p.memory_mb, p.local_steps))
        if p.round == 0:
            continue
        m = SINCE.search(p.reason)
        assert m, p.reason
        last = rounds[p.round - 1]
        assert int(m.group(1)) == last.round and int(m.group(3)) == last.memory_mb
        # the step time it states is the one the workers recorded (over the steps they took)
        taken = [t.compute_s / (t.steps or last.local_steps) for t in last.timings if t.compute_s > 0]
        step = sum(taken) / len(taken)
        assert abs(float(m.group(2)) - 1e3 * step) <= 0.05 + 1e-3 * 1e3 * step
        assert abs(float(m.group(5)) - last.round_s) <= 0.05 + 1e-3 * last.round_s
        assert m.group(7) is None or abs(float(m.group(7)) - last.val_accuracy) < 1e-4
        was = (last.workers, last.memory_mb, last.local_steps)
        if m.group(8) == "plan kept":
            assert shapes[-1] == was
        else:
            assert (int(m.group(9)), int(m.group(10)), int(m.group(11))) == was != shapes[-1]
        assert "left" in p.reason  # the time and the budget left
    assert len(set(shapes)) >= 2, shapes  # the plans changed between rounds
