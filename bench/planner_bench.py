"""Planner benchmark: smlt's planner against the oracle, a fair SMLT-style scheduler and its own
ablations, in a simulated world it did not write (smlt/sim: replayed curves, drawn platform
constants, injected faults), every scenario under several seeds and two worlds (calm, noisy).

Run:  nice -n 10 .venv/bin/python bench/planner_bench.py [--smoke] [--jobs N] [--seeds S] [--first-seed J] [--out F]
          [--config variant.json]
Writes bench/results/planner.json and the `## Planner` section of bench/README.md. `--config`: a
PlannerConfig variant (the fields it changes), its runs written to --out F with the variant recorded.

Scenarios: the four recorded workloads (digits MLP and CNN, ResNet-18, transformer) on their
recorded dataset (deadline and budget both tight or both loose) and on one 8x larger (2 deadlines
x 2 budgets), placed around what the best fixed plans achieve in a reference world (calm, seed 0);
deliberately infeasible ones; a few `objective: speed` ones. The planner reads only what the deployed system records (no FLOP count:
the workers measure it in round 0).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402
from smlt.runtime.job import parse_job  # noqa: E402
from smlt.runtime.planner import decide  # noqa: E402
from smlt.runtime.planner.config import PlannerConfig, PlannerConfigError, using  # noqa: E402
from smlt.runtime.prices import Prices  # noqa: E402
from smlt.sim.analytic import expected, grid  # noqa: E402
from smlt.sim.baselines import ablation, oracle, run_smlt  # noqa: E402
from smlt.sim.run import SimResult, simulate  # noqa: E402
from smlt.sim.workloads import WORKLOADS, Workload  # noqa: E402
from smlt.sim.world import KINDS, World  # noqa: E402

TIERS = [1024, 1769, 3008, 5120, 7168, 10240]
RESULTS = ROOT / "bench" / "results" / "planner.json"
README = ROOT / "bench" / "README.md"
MAX_ROUNDS = 4000
SEEDS = 3
SCALES = (1, 8)
EASY_ROUNDS = 4  # a job the oracle finishes in this many rounds is "easy": round 0 decides it
GIVE_FLOPS = False  # the deployed controller passes none; the workers measure them in round 0
ABLATIONS = ("workers_only", "static_plan")


def variants() -> list[Workload]:
    return [w if f == 1 else w.scaled(f) for w in WORKLOADS.values() for f in SCALES]


def workload_of(name: str) -> Workload:
    return next(w for w in variants() if w.name == name)


def _frontier(w: Workload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    world = World.draw(0, "calm", w.family)
    N, M, K = grid(w, TIERS)
    T, C, R, valid, first = expected(w, world, N, M, K, first_round=True)
    ok = valid & (R <= MAX_ROUNDS)
    return np.where(ok, T, np.inf), np.where(ok, C, np.inf), first


def _scenarios_of(w: Workload) -> list[dict[str, Any]]:
    T, C, first = _frontier(w)
    t_min, c_min = float(T.min()), float(C.min())
    t_cheap = float(T[np.argmin(C)])
    loose = 1.3 * t_cheap
    tight = max(1.4 * t_min, math.sqrt(t_min * t_cheap))
    if tight >= 0.8 * loose:
        tight = 0.5 * (1.4 * t_min + loose) if 1.4 * t_min < loose else 1.4 * t_min
    out = []
    for dname, D in (("tight", tight), ("loose", loose)):
        within = np.where(T <= D, C, np.inf)
        i = int(np.argmin(within))
        # tight: 1.5x the cheapest fixed cost, but never under it plus two of its first rounds
        # (the reserve a planner that must never overspend holds back on a 2-3-round job)
        cstar = float(within[i])
        tight_b = max(1.5 * cstar, cstar + 2 * float(first[i]))
        for bname, B in (("tight", tight_b), ("loose", 3.0 * cstar)):
            if w.scale == 1 and dname != bname:
                continue  # the recorded datasets' jobs are short: both tight or both loose
            out.append(dict(workload=w.name, deadline=D, budget=B, objective="cost", kind=f"D-{dname}/B-{bname}"))
    if w.name in ("digits-cnn", "resnet18"):
        out.append(
            dict(workload=w.name, deadline=0.3 * t_min, budget=3 * c_min, objective="cost", kind="infeasible deadline")
        )
    if w.name in ("transformer", "resnet18-x8"):
        out.append(
            dict(workload=w.name, deadline=3 * t_cheap, budget=0.3 * c_min, objective="cost", kind="infeasible budget")
        )
    if w.name in ("digits-cnn-x8", "resnet18-x8", "transformer-x8", "digits-mlp-x8"):
        out.append(
            dict(workload=w.name, deadline=None, budget=2.0 * c_min, objective="speed", kind="speed within budget")
        )
    return out


def scenarios(smoke: bool = False) -> list[dict[str, Any]]:
    """Every scenario; `smoke`: the first of each kind (tight, loose, infeasible, speed)."""
    out = [s for w in variants() for s in _scenarios_of(w)]
    for i, s in enumerate(out):
        s["id"] = i
    if smoke:
        first = {s["kind"]: s for s in reversed(out)}
        return sorted(first.values(), key=lambda s: s["id"])
    return out


def job_for(s: dict[str, Any], w: Workload, planner: str = "adaptive"):
    return parse_job(
        {
            "name": f"bench-{s['id']}",
            "dataset": {"uri": "s3://bench/data/"},
            "model": w.data["model"],  # the recorded model, as a user's job names it
            "training": {
                "target_metric": "val_accuracy",
                "target_value": w.target,
                "max_rounds": MAX_ROUNDS,
                "local_steps": 20,
                "batch_size": w.batch,
            },
            "constraints": {"deadline_seconds": s["deadline"], "budget_usd": s["budget"], "objective": s["objective"]},
            "workers": {"initial": 4, "min": 1, "max": 64, "planner": planner},
        }
    )


def summarize_run(r: SimResult, s: dict[str, Any]) -> dict[str, Any]:
    D, B = s["deadline"], s["budget"]
    changes = sum(
        1
        for a, b in zip(r.decisions, r.decisions[1:])
        if b["action"] == "train" and a["action"] == "train" and (a["n"], a["m"], a["k"]) != (b["n"], b["m"], b["k"])
    )
    first = r.decisions[0] if r.decisions else {}
    return {
        "cost_usd": round(float(r.cost_usd), 6),
        "elapsed_s": round(float(r.elapsed_s), 1),
        "reached": bool(r.reached),
        "deadline_met": bool(r.deadline_met(D)),
        "budget_ok": bool(r.budget_ok(B)),
        "rounds": int(r.rounds),
        "final_metric": None if r.final_metric is None else round(float(r.final_metric), 4),
        "infeasible_declared": bool(r.infeasible),
        "declared_first_plan": bool(first.get("action") == "stop" and r.infeasible),
        "stop": r.stop_reason[:300],
        "plan_changes": changes,
        "explore_rounds": sum(1 for d in r.decisions if d.get("explore")),
        "first_plan": first.get("reason", "")[:400],
        "plan_seconds": round(r.plan_wall_s, 3),
    }


# The decision rule's constants every run uses (`--config`): None keeps the deployed defaults. Set
# before the pool forks, so every worker process plans with it.
VARIANT: PlannerConfig | None = None


def run_case(case: tuple[dict[str, Any], int, str]) -> dict[str, Any]:
    """One scenario under one seed in one world: every planner meets the same world and luck."""
    with using(VARIANT):
        return _run_case(case)


def _run_case(case: tuple[dict[str, Any], int, str]) -> dict[str, Any]:
    s, seed, kind = case
    t0 = time.time()
    prices = Prices()
    w = workload_of(s["workload"])
    world = World.draw(seed, kind, w.family)  # type: ignore[arg-type]  # kind is one of KINDS
    job = job_for(s, w)
    rec: dict[str, Any] = dict(s, seed=seed, world=kind)

    def sim(planner, j=job) -> dict[str, Any]:
        return summarize_run(simulate(j, w, planner, TIERS, prices, seed=seed, world=world, give_flops=GIVE_FLOPS), s)

    rec["ours"] = sim(decide)
    rec["fixed"] = sim(decide, job_for(s, w, "fixed"))
    rec["smlt"] = summarize_run(run_smlt(job, w, TIERS, prices, seed, world), s)
    for name in ABLATIONS:
        rec[name] = sim(ablation(name))
    cfg, orc = oracle(job, w, TIERS, prices, seed, world)
    rec["oracle"] = _oracle_record(cfg, orc, s)
    rec["oracle_guarded"] = guarded_oracle(job, w, prices, seed, world, rec["oracle"], s)
    rec["wall_s"] = round(time.time() - t0, 2)
    return rec


GUARDED_TRIES = 24  # plans the guarded oracle may try (the oracle: 12); ten seeds, calm: 12 met 188, 24 191, 60 192


def _oracle_record(cfg, r: SimResult | None, s: dict[str, Any]) -> dict[str, Any] | None:
    """An oracle's plan and run as recorded; None when it found no plan."""
    return (
        None if cfg is None or r is None else {"config": {"n": cfg[0], "m": cfg[1], "k": cfg[2]}, **summarize_run(r, s)}
    )


def guarded_oracle(
    job, w: Workload, prices: Prices, seed: int, world: World, orc, s: dict[str, Any], tries: int = GUARDED_TRIES
):
    """The oracle under smlt's budget guard (`baselines.GuardedStatic`): what keeping the budget
    promise leaves possible with hindsight. The oracle's own record where no budget is set (the
    guard never binds) or the oracle found no plan (a guard only stops runs sooner)."""
    if orc is None or s["budget"] is None:
        return orc
    cfg, r = oracle(job, w, TIERS, prices, seed, world, max_tries=tries, guard=True)
    return _oracle_record(cfg, r, s)


# ----------------------------------------------------------------------------- summary
def ratio(a: float, b: float) -> float:
    return a / b if b else math.inf


def _median(xs: list[float]) -> float | None:
    return round(float(statistics.median(xs)), 4) if xs else None


def _frac(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def _oracle_met(records: list[dict[str, Any]], oracle: str = "oracle") -> list[dict[str, Any]]:
    """The runs with a deadline the oracle (or the guarded oracle) meets."""
    return [r for r in records if r["deadline"] is not None and r.get(oracle) and r[oracle]["deadline_met"]]


def _met_when_feasible(records: list[dict[str, Any]], who: str = "ours", oracle: str = "oracle") -> float | None:
    """Deadline met, over runs that have a deadline the oracle (or the guarded oracle) meets."""
    base = _oracle_met(records, oracle)
    return _frac(sum(1 for r in base if r[who]["deadline_met"]), len(base))


def _guard_price(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per world: runs whose deadline the oracle meets, how many of them the guarded oracle meets,
    and how many smlt meets that the guarded oracle does not (adaptivity beyond any fixed plan)."""
    out: dict[str, Any] = {}
    for world in sorted({r["world"] for r in records}):
        met = _oracle_met([r for r in records if r["world"] == world])
        g = _oracle_met(met, "oracle_guarded")
        ids = {id(r) for r in g}
        out[world] = {
            "oracle_met": len(met),
            "guarded_oracle_met": len(g),
            "ours_met_guarded_oracle_not": sum(1 for r in met if r["ours"]["deadline_met"] and id(r) not in ids),
        }
    return out


def _cost_ratios(records: list[dict[str, Any]], who: str = "ours") -> list[float]:
    return [
        ratio(r[who]["cost_usd"], r["oracle"]["cost_usd"]) for r in records if r["oracle"] and r["objective"] == "cost"
    ]


def misses(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run with a deadline the oracle met and ours did not, with its margin."""
    out = []
    for r in records:
        if r["deadline"] is None or not (r["oracle"] and r["oracle"]["deadline_met"]) or r["ours"]["deadline_met"]:
            continue
        o = r["ours"]
        out.append(
            {
                "id": r["id"],
                "seed": r["seed"],
                "world": r["world"],
                "workload": r["workload"],
                "kind": r["kind"],
                "late_s": round(o["elapsed_s"] - r["deadline"], 1) if o["reached"] else None,
                "late_fraction": round(o["elapsed_s"] / r["deadline"] - 1, 3) if o["reached"] else None,
                "metric": o["final_metric"],
                "target": workload_of(r["workload"]).target,
                "stop": o["stop"][:160],
            }
        )
    return out


def _jobs_declared(records: list[dict[str, Any]]) -> str:
    """'declared of jobs': the scenarios made infeasible by design whose every run was refused at
    the first plan."""
    by_job: dict[int, list[bool]] = {}
    for r in records:
        if r["kind"].startswith("infeasible"):
            by_job.setdefault(r["id"], []).append(r["ours"]["declared_first_plan"])
    return f"{sum(1 for v in by_job.values() if all(v))} of {len(by_job)}"


def summarize(records: list[dict[str, Any]], wall: float, seeds: int) -> dict[str, Any]:
    calm = [r for r in records if r["world"] == "calm"]
    noisy = [r for r in records if r["world"] == "noisy"]
    feas = [r for r in records if r["oracle"] is not None]
    infeasible = [r for r in records if r["oracle"] is None]
    easy = [r for r in feas if r["oracle"]["rounds"] <= EASY_ROUNDS]
    hard = [r for r in feas if r["oracle"]["rounds"] > EASY_ROUNDS]
    both = [r for r in feas if r["ours"]["deadline_met"] and r["smlt"]["deadline_met"]]
    speed = [r for r in feas if r["objective"] == "speed"]
    ratios = _cost_ratios(records)
    return {
        "scenarios": len({r["id"] for r in records}),
        "budget_exceeded": sum(1 for r in records if not r["ours"]["budget_ok"]),
        "deadline_met_when_feasible": _met_when_feasible(calm),
        # the same, where the oracle under smlt's budget guard meets the deadline (docs/planner.md,
        # "The budget guard's price")
        "deadline_met_when_guarded_feasible": _met_when_feasible(calm, oracle="oracle_guarded"),
        "deadline_met_when_guarded_feasible_noisy": _met_when_feasible(noisy, oracle="oracle_guarded"),
        "median_cost_vs_oracle": _median(ratios),
        "cheaper_than_smlt_fraction": _frac(
            sum(1 for r in both if r["ours"]["cost_usd"] < r["smlt"]["cost_usd"]), len(both)
        ),
        "seeds": seeds,
        "worlds": sorted({r["world"] for r in records}),
        "runs": len(records),
        "flops_given": GIVE_FLOPS,
        "deadline_met_when_feasible_noisy": _met_when_feasible(noisy),
        "infeasible_declared_first_plan": _frac(
            sum(1 for r in infeasible if r["ours"]["declared_first_plan"]), len(infeasible)
        ),
        "speed_vs_oracle_median": _median([ratio(r["ours"]["elapsed_s"], r["oracle"]["elapsed_s"]) for r in speed]),
        # The "3 of 4": the jobs made infeasible by design, each declared in every seed and world
        "infeasible_jobs_declared_first_plan": _jobs_declared(records),
        "ablations_median_cost_vs_oracle": {name: _median(_cost_ratios(records, name)) for name in ABLATIONS},
        "details": {
            "oracle_feasible": len(feas),
            "guard_price": _guard_price(records),
            "oracle_infeasible": len(infeasible),
            "median_cost_vs_oracle_by_world": {
                k: _median(_cost_ratios([r for r in records if r["world"] == k])) for k in KINDS
            },
            "ours_cost_vs_oracle_p25_p75_max": [round(float(np.percentile(ratios, q)), 3) for q in (25, 75, 100)]
            if ratios
            else None,
            "easy": {
                "runs": len(easy),
                "deadline_met_when_feasible": _met_when_feasible(easy),
                "median_cost_vs_oracle": _median(_cost_ratios(easy)),
            },
            "hard": {
                "runs": len(hard),
                "deadline_met_when_feasible_calm": _met_when_feasible([r for r in hard if r["world"] == "calm"]),
                "deadline_met_when_feasible_noisy": _met_when_feasible([r for r in hard if r["world"] == "noisy"]),
                "median_cost_vs_oracle": _median(_cost_ratios(hard)),
            },
            "both_met_deadline": len(both),
            "ours_better_than_smlt_fraction": _frac(
                sum(
                    1
                    for r in feas
                    if r["ours"]["deadline_met"] > r["smlt"]["deadline_met"]
                    or (
                        r["ours"]["deadline_met"] == r["smlt"]["deadline_met"]
                        and r["ours"]["cost_usd"] < r["smlt"]["cost_usd"]
                    )
                ),
                len(feas),
            ),
            "ours_reached_target_when_feasible": sum(1 for r in feas if r["ours"]["reached"]),
            "smlt_median_cost_vs_oracle": _median(_cost_ratios(records, "smlt")),
            "smlt_deadline_met_when_feasible": _met_when_feasible(calm, "smlt"),
            "smlt_deadline_met_when_feasible_noisy": _met_when_feasible(noisy, "smlt"),
            "smlt_budget_exceeded": sum(1 for r in records if not r["smlt"]["budget_ok"]),
            "fixed_median_cost_vs_oracle": _median(_cost_ratios(records, "fixed")),
            "fixed_deadline_met_when_feasible": _met_when_feasible(calm, "fixed"),
            "fixed_budget_exceeded": sum(1 for r in records if not r["fixed"]["budget_ok"]),
            **{f"{a}_deadline_met_when_feasible": _met_when_feasible(calm, a) for a in ABLATIONS},
            **{f"{a}_budget_exceeded": sum(1 for r in records if not r[a]["budget_ok"]) for a in ABLATIONS},
            "infeasible_declared_at_round0": sum(1 for r in infeasible if r["ours"]["declared_first_plan"]),
            "infeasible_by_design_declared_first_plan": _frac(
                sum(1 for r in records if r["kind"].startswith("infeasible") and r["ours"]["declared_first_plan"]),
                sum(1 for r in records if r["kind"].startswith("infeasible")),
            ),
            "infeasible_spent_usd": [round(r["ours"]["cost_usd"], 4) for r in infeasible],
            "speed_time_vs_oracle": [round(ratio(r["ours"]["elapsed_s"], r["oracle"]["elapsed_s"]), 3) for r in speed],
            "ours_plan_changes_median": statistics.median([r["ours"]["plan_changes"] for r in records]),
            "misses": misses(records),
            "wall_s": round(wall, 1),
        },
    }


# ----------------------------------------------------------------------------- README
def fmt_cost(c: float) -> str:
    return f"${c:.4f}" if c < 1 else f"${c:.2f}"


def fmt_t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f} s" if s < 600 else (f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def _spent(costs: list[float]) -> str:
    paid = sorted(c for c in costs if c > 0)
    if not paid:
        return "none spent anything"
    return f"{len(costs) - len(paid)} spent nothing, the others {fmt_cost(paid[0])}-{fmt_cost(paid[-1])}"


def _spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    q = np.percentile(xs, [0, 50, 100])
    return f"{len(xs)} runs, median {q[1]:.2f}, range {q[0]:.2f}-{q[2]:.2f}"


def _scenario_rows(records: list[dict[str, Any]]) -> list[str]:
    """One row per scenario: over its seeds and worlds, how often each planner met the deadline
    (or, without one, reached the target) and its median cost / oracle."""
    rows = []
    for sid in sorted({r["id"] for r in records}):
        rs = [r for r in records if r["id"] == sid]
        s = rs[0]
        feas = [r for r in rs if r["oracle"]]

        def col(who: str) -> str:
            met = sum(1 for r in feas if r[who]["deadline_met"])
            med = _median([ratio(r[who]["cost_usd"], r["oracle"]["cost_usd"]) for r in feas])
            return f"{met}/{len(feas)}, {med if med is not None else '-'}x"

        orc = f"{len(feas)}/{len(rs)}" + (
            f", {statistics.median(r['oracle']['rounds'] for r in feas):.0f} rounds" if feas else ""
        )
        decl = sum(1 for r in rs if r["ours"]["declared_first_plan"])
        ours = (
            col("ours")
            if feas
            else f"declared {decl}/{len(rs)}, spent {fmt_cost(max(r['ours']['cost_usd'] for r in rs))}"
        )
        rows.append(
            f"| {sid} | {s['workload']} | {s['kind']} | {fmt_t(s['deadline'])} | {fmt_cost(s['budget'])} | {orc} | "
            f"{ours} | {col('smlt') if feas else '-'} | {col('workers_only') if feas else '-'} | "
            f"{col('static_plan') if feas else '-'} |"
        )
    return rows


def _seed_span(records: list[dict[str, Any]]) -> str:
    """The seeds (0-9) the records cover, as `cases` numbers them: 1000 + 10 x scenario + seed."""
    seeds = sorted({r["seed"] - 1000 - 10 * r["id"] for r in records})
    if not seeds:
        return "none"
    return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))


def _guarded(price: dict[str, Any]) -> str:
    return "; ".join(
        f"{w}: the guarded oracle meets {p['guarded_oracle_met']} of the oracle's {p['oracle_met']}, smlt "
        f"{p['ours_met_guarded_oracle_not']} it does not"
        for w, p in price.items()
    )


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    d = s["details"]
    ab = s["ablations_median_cost_vs_oracle"]
    lines = [
        "## Planner",
        "",
        "`make bench-planner` (`bench/planner_bench.py`) runs smlt's planner (`smlt.runtime.planner.decide`) in a simulated",
        'world it did not write (`smlt/sim`, docs/planner.md "The benchmark\'s world"): learning curves replayed',
        "from runs recorded here (`bench/record_curves.py`, `smlt/sim/curves/`), platform constants drawn per",
        "scenario-seed around ../shared/facts.md, retries, duplicates and overruns injected and billed. Every",
        f"scenario runs under {s['seeds']} seeds in {len(s['worlds'])} worlds ({', '.join(s['worlds'])}: 4x timing noise,",
        "10 % stragglers, slower cold starts). The planner gets no FLOP count (`flops_given` false): the",
        "workers measure it in round 0. Compared with the oracle (the best fixed plan with hindsight, searched",
        "in the same world), SMLT's scheduler made fair (GP-UCB over workers, kappa 5, per epoch, at the smallest",
        "tier that fits, stopping at the deadline and the budget) and two ablations of smlt's planner (workers",
        "only; round 0's plan held). Results: `bench/results/planner.json`.",
        "",
        f"**Seeds: every number in this section covers seeds {_seed_span(result['scenarios'])} of each scenario**, on the",
        "four recorded curves the planner's constants were tuned on (tuning seeds 5-7; no held-out curve yet).",
        "Seeds 0-2 are the luckiest triple of ten: over seeds 0-9 smlt met 88.9 % (calm) and 81.9 % (noisy) of",
        "the oracle's deadlines, 97.9 % and 93.3 % of the guarded oracle's (docs/planner.md, \"Where it stands\").",
        "",
        "| target | required | result |",
        "| --- | --- | --- |",
        f"| scenario-seed-worlds | - | {s['runs']} ({s['scenarios']} scenarios; {d['oracle_infeasible']} infeasible for the oracle) |",
        f"| budget exceeded (bills include retries, duplicates, overruns) | 0 | {s['budget_exceeded']} |",
        f"| deadline met where the oracle meets it, calm | >= 95 % | {_pct(s['deadline_met_when_feasible'])} |",
        f"| deadline met where the oracle meets it, noisy | >= 90 % | {_pct(s['deadline_met_when_feasible_noisy'])} |",
        f"| ... where the oracle under smlt's budget guard meets it, calm / noisy | - | "
        f"{_pct(s['deadline_met_when_guarded_feasible'])} / {_pct(s['deadline_met_when_guarded_feasible_noisy'])} "
        f"({_guarded(d['guard_price'])}) |",
        f"| median cost / oracle (cost objective) | <= 1.15 | {s['median_cost_vs_oracle']} |",
        f"| cheaper than SMLT-style where both meet the deadline | >= 80 % | {_pct(s['cheaper_than_smlt_fraction'])} of {d['both_met_deadline']} |",
        f"| infeasible jobs declared at the first plan | >= 3 of 4 | {s['infeasible_jobs_declared_first_plan']} "
        f"(in every run; {_pct(s['infeasible_declared_first_plan'])} of the {d['oracle_infeasible']} runs no fixed plan meets) |",
        f"| speed objective: time / oracle's (median) | <= 1.5 | {s['speed_vs_oracle_median'] or '-'} |",
        "",
        f"Easy jobs (the oracle needs <= {EASY_ROUNDS} rounds: {d['easy']['runs']} runs): deadline met "
        f"{_pct(d['easy']['deadline_met_when_feasible'])}, median cost / oracle {d['easy']['median_cost_vs_oracle']}. "
        f"The rest ({d['hard']['runs']} runs): deadline met {_pct(d['hard']['deadline_met_when_feasible_calm'])} calm, "
        f"{_pct(d['hard']['deadline_met_when_feasible_noisy'])} noisy, median cost / oracle {d['hard']['median_cost_vs_oracle']}. "
        f"By world, median cost / oracle: {', '.join(f'{k} {v}' for k, v in d['median_cost_vs_oracle_by_world'].items())}.",
        "",
        f"Baselines, median cost / oracle: SMLT-style {d['smlt_median_cost_vs_oracle']} (deadline met "
        f"{_pct(d['smlt_deadline_met_when_feasible'])} calm, {_pct(d['smlt_deadline_met_when_feasible_noisy'])} noisy, budget "
        f"exceeded {d['smlt_budget_exceeded']}x); workers-only {ab['workers_only']} (deadline met "
        f"{_pct(d['workers_only_deadline_met_when_feasible'])}); round-0 plan held {ab['static_plan']} (deadline met "
        f"{_pct(d['static_plan_deadline_met_when_feasible'])}); fixed default {d['fixed_median_cost_vs_oracle']} "
        f"(deadline met {_pct(d['fixed_deadline_met_when_feasible'])}). Better than SMLT-style (met a deadline it "
        f"missed, or as met and cheaper) in {_pct(d['ours_better_than_smlt_fraction'])} of the oracle-feasible runs. "
        f"Infeasible runs (no fixed plan works): {d['infeasible_declared_at_round0']} of {d['oracle_infeasible']} "
        f"declared at the first plan ({_pct(d['infeasible_by_design_declared_first_plan'])} of the runs of the "
        f"scenarios made infeasible); {_spent(d['infeasible_spent_usd'])}. Speed runs, time / oracle's: "
        f"{_spread(d['speed_time_vs_oracle'])}. Wall time {d['wall_s']} s.",
        "",
        f"Misses (deadline met by the oracle, not by smlt): {len(d['misses'])}.",
        "",
    ]
    if d["misses"]:
        lines += [
            "| # | seed | world | workload | kind | late by | final metric / target | stop |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for m in d["misses"]:
            late = (
                "target not reached" if m["late_s"] is None else f"{m['late_s']} s ({100 * m['late_fraction']:.0f} %)"
            )
            lines.append(
                f"| {m['id']} | {m['seed']} | {m['world']} | {m['workload']} | {m['kind']} | {late} | "
                f"{m['metric']} / {m['target']} | {m['stop'][:100]} |"
            )
        lines.append("")
    lines += [
        "Per scenario over its seeds and worlds: deadline met (of the runs the oracle finds feasible), median cost /",
        "oracle. Deadlines and budgets are placed in the reference world (calm, seed 0): deadline tight ~1.4x the",
        "fastest fixed plan's time, loose 1.3x the cheapest's; budget tight 1.5x the cheapest fixed cost within it (at",
        "least that cost plus two of its first rounds), loose 3x.",
        "",
        "| # | workload | kind | deadline | budget | oracle feasible | ours | SMLT-style | workers only | round 0 held |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *_scenario_rows(result["scenarios"]),
        "",
    ]
    return "\n".join(lines)


def _jsonable(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o).__name__)


OTHERS = ("fixed", "smlt", *ABLATIONS, "oracle")


def write_results(result: dict[str, Any]) -> None:
    """The summary indented, one line per run (only ours keeps its first plan and its whole stop reason)."""
    for r in result["scenarios"]:
        for who in OTHERS:
            if r.get(who):
                r[who].pop("first_plan", None)
                r[who]["stop"] = r[who]["stop"][:120]
    runs = ",\n".join("  " + json.dumps(r, default=_jsonable) for r in result["scenarios"])
    summary = json.dumps(result["summary"], indent=1, default=_jsonable).replace("\n", "\n ")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        f'{{\n "summary": {summary},\n "tiers_mb": {json.dumps(result["tiers_mb"])},\n "scenarios": [\n{runs}\n ]\n}}\n'
    )


def write_readme(section: str) -> None:
    text = README.read_text() if README.exists() else "# Benchmarks\n\n"
    start = text.find("## Planner")
    if start == -1:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + 1)
        text = text[:start] + section + ("" if nxt == -1 else text[nxt + 1 :])
    README.write_text(text.rstrip("\n") + "\n")


def cases(sc: list[dict[str, Any]], seeds: int, first: int = 0) -> list[tuple[dict[str, Any], int, str]]:
    """Every scenario x seed x world, the big workloads first (the pool's tail stays short).

    `first` shifts the seeds: tune the planner on seeds 5-7 (`--first-seed 5`) and report on 0-2, so a
    change is not judged on the very luck it was tuned to."""
    if not 0 <= first <= 10 - seeds:
        raise SystemExit(f"--first-seed {first} with --seeds {seeds}: the seeds of a scenario are 0-9")
    out = [(s, 1000 + 10 * s["id"] + first + j, kind) for s in sc for j in range(seeds) for kind in KINDS]
    return sorted(
        out,
        key=lambda c: (
            -workload_of(c[0]["workload"]).curves.samples_scale * workload_of(c[0]["workload"]).flops_per_sample
        ),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    smoke.add_flag(ap)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--first-seed", type=int, default=0, help="seed offset per scenario (tune on 5, report on 0)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--out", type=Path, help="write every run's record here instead (bench/README.md untouched)")
    ap.add_argument("--render", action="store_true", help="re-summarise the recorded results, run nothing")
    ap.add_argument(
        "--config",
        type=Path,
        help="a PlannerConfig variant (JSON: the fields it changes, smlt/runtime/planner/config.py); needs --out F",
    )
    args = ap.parse_args(argv)
    global VARIANT
    if args.config:
        if not (args.out or args.no_write):
            raise SystemExit("--config: a variant's runs go to --out F (bench/results/ holds the deployed planner's)")
        try:
            VARIANT = PlannerConfig.from_file(args.config)
        except PlannerConfigError as e:
            raise SystemExit(f"--config: {e}") from None
    if args.render:
        old = json.loads(RESULTS.read_text())
        recs, s = old["scenarios"], old["summary"]
        old["summary"] = summarize(recs, s["details"]["wall_s"], s["seeds"])
        write_results(old)
        write_readme(markdown(old))
        return
    t0 = time.time()
    seeds = 1 if args.smoke else args.seeds
    todo = cases(scenarios(args.smoke), seeds, args.first_seed)
    if args.jobs > 1:
        with get_context("fork").Pool(args.jobs) as pool:
            records = pool.map(run_case, todo, chunksize=1)
    else:
        records = [run_case(c) for c in todo]
    records.sort(key=lambda r: (r["id"], r["seed"], r["world"]))
    wall = time.time() - t0
    result: dict[str, Any] = {"summary": summarize(records, wall, seeds), "tiers_mb": TIERS, "scenarios": records}
    if VARIANT is not None:
        result["config"] = VARIANT.model_dump(mode="json", exclude_defaults=True)
    print(json.dumps({k: v for k, v in result["summary"].items() if k != "details"}, indent=1))
    if args.smoke:
        smoke.report(result["summary"])
    elif args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    elif not args.no_write:
        write_results(result)
        write_readme(markdown(result))
        print(f"wrote {RESULTS.relative_to(ROOT)} and the Planner section of {README.relative_to(ROOT)}")
    print(f"wall {wall:.1f} s")


if __name__ == "__main__":
    main()
