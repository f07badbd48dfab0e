"""The planner benchmark's accounting (bench/planner_bench.py): what counts as a met deadline, a
miss, an easy job and a declared infeasible one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pb():
    spec = importlib.util.spec_from_file_location("planner_bench", ROOT / "bench" / "planner_bench.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["planner_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(cost, elapsed, reached=True, deadline=None, first=False, rounds=5):
    return {
        "cost_usd": cost,
        "elapsed_s": elapsed,
        "reached": reached,
        "deadline_met": reached and (deadline is None or elapsed <= deadline),
        "budget_ok": True,
        "rounds": rounds,
        "final_metric": 0.9 if reached else 0.5,
        "infeasible_declared": first,
        "declared_first_plan": first,
        "stop": "",
        "plan_changes": 0,
    }


def _rec(pb, i, world, deadline, ours, oracle, objective="cost"):
    w = pb.variants()[0]
    plain = _run(1.0, 10.0, deadline=deadline)
    return {
        "id": i,
        "seed": 1,
        "world": world,
        "workload": w.name,
        "kind": "k",
        "deadline": deadline,
        "budget": 1.0,
        "objective": objective,
        "ours": ours,
        "oracle": oracle,
        **{name: plain for name in ("smlt", "fixed", "workers_only", "static_plan")},
    }


def test_deadline_met_counts_only_runs_with_a_deadline_the_oracle_meets(pb):
    recs = [
        _rec(pb, 0, "calm", 100.0, _run(1.0, 90.0, deadline=100.0), _run(1.0, 80.0, deadline=100.0, rounds=2)),
        _rec(pb, 1, "calm", 100.0, _run(1.0, 120.0, deadline=100.0), _run(1.0, 80.0, deadline=100.0)),
        # no deadline (objective speed): not counted, though it "met" nothing
        _rec(pb, 2, "calm", None, _run(1.0, 500.0), _run(1.0, 100.0), objective="speed"),
        # the oracle misses too: not counted
        _rec(pb, 3, "calm", 100.0, _run(1.0, 150.0, deadline=100.0), _run(1.0, 110.0, deadline=100.0)),
        _rec(pb, 0, "noisy", 100.0, _run(1.0, 95.0, deadline=100.0), _run(1.0, 80.0, deadline=100.0)),
        _rec(pb, 4, "noisy", 50.0, _run(0.0, 0.0, reached=False, first=True), None),
    ]
    s = pb.summarize(recs, 1.0, seeds=1)
    assert s["deadline_met_when_feasible"] == 0.5  # 1 of the 2 calm runs the oracle meets
    assert s["deadline_met_when_feasible_noisy"] == 1.0
    assert s["infeasible_declared_first_plan"] == 1.0 and s["flops_given"] is False
    assert s["speed_vs_oracle_median"] == 5.0
    misses = s["details"]["misses"]
    assert [(m["id"], m["late_s"]) for m in misses] == [(1, 20.0)]  # its margin: 20 s late
    assert s["details"]["easy"]["runs"] == 1  # the oracle's 2-round job


def test_deadline_met_where_the_guarded_oracle_meets_it(pb):
    """The guarded oracle (smlt's budget guard on the oracle's plans) meets fewer deadlines; smlt is
    counted over those it meets, and the runs smlt meets without it are counted apart."""
    met = _run(1.0, 80.0, deadline=100.0)
    late = _run(1.0, 120.0, deadline=100.0)
    recs = [
        dict(_rec(pb, 0, "calm", 100.0, met, met), oracle_guarded=met),
        dict(_rec(pb, 1, "calm", 100.0, late, met), oracle_guarded=met),
        dict(_rec(pb, 2, "calm", 100.0, met, met), oracle_guarded=None),  # the guard leaves no fixed plan
        dict(_rec(pb, 3, "calm", 100.0, late, met), oracle_guarded=late),
        _rec(pb, 0, "noisy", 100.0, met, met),  # a record made before the guarded oracle existed
    ]
    s = pb.summarize(recs, 1.0, seeds=1)
    assert s["deadline_met_when_feasible"] == 0.5  # 2 of the 4 the oracle meets
    assert s["deadline_met_when_guarded_feasible"] == 0.5  # 1 of the 2 the guarded oracle meets
    assert s["deadline_met_when_guarded_feasible_noisy"] is None
    price = s["details"]["guard_price"]
    assert price["calm"] == {"oracle_met": 4, "guarded_oracle_met": 2, "ours_met_guarded_oracle_not": 1}
    assert price["noisy"]["guarded_oracle_met"] == 0
    assert "the guarded oracle meets 2 of the oracle's 4" in pb.markdown({"summary": s, "scenarios": recs})
