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
    one = {"curves": "smlt/sim/curves", "workloads": [recs[0]["workload"]], "summary": s, "scenarios": recs}
    text = pb.markdown({"tuning": one, "held_out": dict(one, curves="bench/curves/held-out")})
    assert "the guarded oracle meets 2 of the oracle's 4" in text
    assert "### Held-out curves" in text and "(curves: `bench/curves/held-out`" in text


def test_the_quotes_coverage_counts_runs_that_reached_the_target_inside_the_quoted_range(pb):
    """`smlt quote`'s calibration: of the runs that reached the target with a quoted range, those
    whose time (cost) lies in [p10, p90]; a p90 of "never" (None) covers anything above p10; and
    the quote's feasibility against the oracle's."""

    def quote(seconds, cost, feasible=True):
        return {"feasible": feasible, "seconds": seconds, "cost_usd": cost}

    q = quote([10.0, 20.0, 40.0], [1.0, 2.0, 4.0])
    recs = [
        dict(_rec(pb, 0, "calm", None, _run(2.0, 30.0), _run(1.0, 20.0)), quote=q),  # both inside
        dict(_rec(pb, 1, "calm", None, _run(5.0, 50.0), _run(1.0, 20.0)), quote=q),  # both above
        dict(_rec(pb, 2, "calm", None, _run(0.5, 5.0), _run(1.0, 20.0)), quote=q),  # both below
        dict(
            _rec(pb, 3, "calm", None, _run(9.0, 90.0), _run(1.0, 20.0)),
            quote=quote([10.0, 20.0, None], [1.0, 2.0, None]),
        ),
        # not reached: not counted for coverage; admitted where the oracle found no plan
        dict(_rec(pb, 4, "calm", None, _run(9.0, 90.0, reached=False), None), quote=q),
        # refused, though the oracle met it
        dict(
            _rec(pb, 5, "noisy", 100.0, _run(0.0, 0.0, reached=False, first=True), _run(1.0, 20.0)),
            quote=quote(None, None, feasible=False),
        ),
        _rec(pb, 6, "noisy", None, _run(2.0, 30.0), _run(1.0, 20.0)),  # a record made before quotes: skipped
    ]
    cal = pb.summarize(recs, 1.0, seeds=1)["quote_calibration"]
    assert cal["calm"]["reached_and_quoted"] == 4
    assert cal["calm"]["quote_time_coverage"] == 0.5 and cal["calm"]["quote_cost_coverage"] == 0.5
    assert cal["calm"]["quote_time_below_p10"] == 1 and cal["calm"]["quote_time_above_p90"] == 1
    assert cal["calm"]["quote_feasible_oracle_infeasible"] == 1
    assert cal["calm"]["quote_infeasible_oracle_feasible"] == 0
    assert cal["noisy"]["runs"] == 1 and cal["noisy"]["quote_time_coverage"] is None
    assert cal["noisy"]["quote_infeasible_oracle_feasible"] == 1
    one = {"curves": "smlt/sim/curves", "workloads": [recs[0]["workload"]], "scenarios": recs}
    one["summary"] = pb.summarize(recs, 1.0, seeds=1)
    assert "calm 50 % / 50 % of 4" in pb.markdown(
        {"tuning": one, "held_out": dict(one, curves="bench/curves/held-out")}
    )


def test_the_infeasible_and_speed_scenarios_follow_the_flops_order_not_names(pb):
    """On the tuning curves the rule gives the picks the benchmark always had."""
    pb.use_curves(pb.CURVES)
    extra = {(s["workload"], s["kind"]) for s in pb.scenarios() if not s["kind"].startswith("D-")}
    assert extra == {
        ("digits-cnn", "infeasible deadline"),
        ("resnet18", "infeasible deadline"),
        ("transformer", "infeasible budget"),
        ("resnet18-x8", "infeasible budget"),
        *((f"{n}-x8", "speed within budget") for n in ("digits-mlp", "digits-cnn", "resnet18", "transformer")),
    }


def test_a_curves_folder_with_a_bad_file_is_refused_naming_it(pb, tmp_path):
    import json

    data = json.loads((pb.CURVES / "digits-mlp.json").read_text())
    del data["family"]
    (tmp_path / "digits-mlp.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit) as e:
        pb.main(["--curves", str(tmp_path), "--out", str(tmp_path / "out.json")])
    assert f"{tmp_path / 'digits-mlp.json'}: field 'family'" in str(e.value)
    with pytest.raises(SystemExit, match="--curves: its runs go to --out F"):
        pb.main(["--curves", str(tmp_path)])


def test_each_users_baseline_is_summarised_against_ours(pb):
    """Per users' baseline: deadlines met where the guarded oracle meets them, budget overruns,
    and how often ours is cheaper where both met the deadline (over how many runs)."""
    met = _run(1.0, 80.0, deadline=100.0)
    dear = _run(2.0, 90.0, deadline=100.0)
    late = dict(_run(0.5, 120.0, deadline=100.0), budget_ok=False)
    recs = [
        dict(_rec(pb, 0, "calm", 100.0, met, met), oracle_guarded=met, profiled=dear),
        dict(_rec(pb, 1, "calm", 100.0, dear, met), oracle_guarded=met, profiled=met),
        dict(_rec(pb, 2, "calm", 100.0, met, met), oracle_guarded=met, profiled=late),
        dict(_rec(pb, 0, "noisy", 100.0, met, met), oracle_guarded=met, profiled=dear),
    ]
    summary = pb.summarize(recs, 1.0, seeds=1)
    b = summary["baselines"]["profiled"]
    # one source per baseline: nothing of SMLT-style's is repeated outside `baselines`
    assert not [k for k in [*summary, *summary["details"]] if k.startswith(("smlt_", "cheaper_than_smlt"))]
    assert b["deadline_met_when_guarded_feasible"] == round(2 / 3, 4)
    assert b["deadline_met_when_guarded_feasible_noisy"] == 1.0
    assert b["budget_exceeded"] == 1
    assert (b["both_met_deadline"], b["ours_cheaper_when_both_met"]) == (3, round(2 / 3, 4))
    one = {"curves": "smlt/sim/curves", "workloads": [recs[0]["workload"]], "scenarios": recs}
    one["summary"] = pb.summarize(recs, 1.0, seeds=1)
    text = pb.markdown({"tuning": one, "held_out": dict(one, curves="bench/curves/held-out")})
    assert "fixed from a profile" in text and "67 % of 3" in text
