"""Re-run smlt's planner alone against a recorded planner benchmark, and trace single runs.

`bench/planner_bench.py` simulates every scenario-seed-world for smlt's planner, the oracle (up to
12 fixed plans), the SMLT-style scheduler and two ablations: ~150-300 s on 2 cores. A change to the
planner moves only smlt's own runs, so this tool keeps the recorded oracle and baselines and
re-simulates smlt's planner alone (same scenarios, seeds, worlds and luck: ~30 s), then prints the
benchmark's summary and every run whose deadline verdict changed. The benchmark is deterministic:
replaying an unchanged planner reproduces the recorded summary exactly.

    .venv/bin/python bench/planner_replay.py                                  # against bench/results/planner.json
    .venv/bin/python bench/planner_replay.py --base F.json --out G.json       # a --first-seed 5 record, keep the runs
    .venv/bin/python bench/planner_replay.py --only 27,28                     # some scenarios only
    .venv/bin/python bench/planner_replay.py --trace 27 1271 calm             # one run, round by round, with reasons
    .venv/bin/python bench/planner_replay.py --set held_out                   # the held-out curves' runs
    .venv/bin/python bench/planner_replay.py --smoke                          # scenario 0 replayed and traced, nothing written

Tune on seeds 5-7 (`planner_bench.py --first-seed 5 --out F.json`, then `--base F.json`), report on
0-2, and re-run the full benchmark before recording numbers (`make bench-planner`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import planner_bench as pb  # noqa: E402

from bench import smoke  # noqa: E402
from smlt.runtime.planner import decide  # noqa: E402
from smlt.runtime.prices import Prices  # noqa: E402
from smlt.sim.run import SimResult, simulate  # noqa: E402
from smlt.sim.world import World  # noqa: E402

SCENARIO_KEYS = ("workload", "deadline", "budget", "objective", "kind", "id")
HEADLINE = (
    "budget_exceeded",
    "deadline_met_when_feasible",
    "deadline_met_when_feasible_noisy",
    "deadline_met_when_guarded_feasible",
    "deadline_met_when_guarded_feasible_noisy",
    "median_cost_vs_oracle",
    "speed_vs_oracle_median",
    "infeasible_jobs_declared_first_plan",
)


def _simulate(rec: dict[str, Any], keep_history: bool = False) -> tuple[dict[str, Any], SimResult]:
    s = {k: rec[k] for k in SCENARIO_KEYS}
    w = pb.workload_of(s["workload"])
    world = World.draw(rec["seed"], rec["world"], w.family)
    r = simulate(
        pb.job_for(s, w),
        w,
        decide,
        pb.TIERS,
        Prices(),
        seed=rec["seed"],
        world=world,
        give_flops=pb.GIVE_FLOPS,
        keep_history=keep_history,
    )
    return s, r


def replay_one(rec: dict[str, Any]) -> dict[str, Any]:
    s, r = _simulate(rec)
    return pb.summarize_run(r, s)


def _feasible(r: dict[str, Any]) -> bool:
    return r["deadline"] is not None and bool(r["oracle"]) and bool(r["oracle"]["deadline_met"])


def replay(base: dict[str, Any], only: set[int] | None, jobs: int) -> tuple[list[dict[str, Any]], float]:
    recs = [r for r in base["scenarios"] if only is None or r["id"] in only]
    t0 = time.time()
    if jobs > 1:
        with get_context("fork").Pool(jobs) as pool:
            outs = pool.map(replay_one, recs, chunksize=1)
    else:
        outs = [replay_one(r) for r in recs]
    return [dict(r, ours=o, ours_recorded=r["ours"]) for r, o in zip(recs, outs)], time.time() - t0


def report(records: list[dict[str, Any]], wall: float, seeds: int) -> dict[str, Any]:
    summary = pb.summarize(records, wall, seeds)
    print(json.dumps({k: summary[k] for k in HEADLINE}), f"wall {wall:.1f} s")
    for kind in ("calm", "noisy"):
        feas = [r for r in records if _feasible(r) and r["world"] == kind]
        now = sum(r["ours"]["deadline_met"] for r in feas)
        was = sum(r["ours_recorded"]["deadline_met"] for r in feas)
        print(f"deadline met, {kind}: {now} of {len(feas)} (recorded {was})")
    for r in records:
        if _feasible(r) and r["ours"]["deadline_met"] != r["ours_recorded"]["deadline_met"]:
            verdict = "gained" if r["ours"]["deadline_met"] else "lost"
            print(f"  {verdict}: scenario {r['id']} seed {r['seed']} {r['world']} {r['workload']} {r['kind']}")
    return summary


def trace(base: dict[str, Any], sid: int, seed: int, world: str, width: int) -> None:
    """One run, round by round: the plan, its predicted and actual round, the metric it measured."""
    rec = next(
        (r for r in base["scenarios"] if r["id"] == sid and r["seed"] == seed and r["world"] == world),
        None,
    )
    if rec is None:
        raise SystemExit(f"no run of scenario {sid} with seed {seed} in the {world} world in the base record")
    s, r = _simulate(rec, keep_history=True)
    o = rec.get("oracle")
    print(json.dumps(s))
    print("oracle:", o and {k: o[k] for k in ("config", "cost_usd", "elapsed_s", "rounds")})
    rounds = r.history.rounds if r.history else []
    for i, d in enumerate(r.decisions):
        plan = f"{d['n']} x {d['m']} MB x {d['k']}" if d["action"] == "train" else "stop"
        line = f"round {d['round']:>3}  {plan:<22}"
        if i < len(rounds):
            rr = rounds[i]
            pred = d["pred_round_s"]
            line += (
                f" predicted {pred if pred is None else round(pred, 1)} s, took {rr.round_s:.1f} s,"
                f" ${rr.cost_usd:.5f}, reported {rr.workers_ok}/{rr.workers}, metric of its start {rr.val_accuracy}"
            )
        print(line)
        print("      " + d["reason"][:width])
    print(f"result: reached {r.reached} in {r.elapsed_s:.1f} s (deadline {s['deadline']}), ${r.cost_usd:.5f}")
    print("stop:", r.stop_reason)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, default=pb.RESULTS, help="a recorded planner_bench.py result")
    ap.add_argument("--set", default="tuning", help="the recorded set of curves to replay (tuning, held_out)")
    ap.add_argument("--only", default="", help="scenario ids, comma-separated")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, help="write the replayed runs here (planner_bench.py's format)")
    ap.add_argument("--trace", nargs=3, metavar=("SCENARIO", "SEED", "WORLD"), help="trace one run")
    ap.add_argument("--width", type=int, default=600, help="characters of each reason to print (--trace)")
    smoke.add_flag(ap)
    args = ap.parse_args(argv)
    recorded = pb.sections(json.loads(args.base.read_text()))
    if len(recorded) > 1 and args.set not in recorded:
        raise SystemExit(f"--set {args.set}: {args.base} holds {', '.join(recorded)}")
    base = recorded[args.set] if len(recorded) > 1 else next(iter(recorded.values()))
    pb.use_curves(pb.curves_of(base))  # before the pool forks
    if args.smoke:  # the first scenario's runs replayed, and one of them traced
        records, wall = replay(base, {0}, 1)
        first = records[0]
        trace(base, first["id"], first["seed"], first["world"], 80)
        smoke.report(report(records, wall, base["summary"]["seeds"]))
        return
    if args.trace:
        sid, seed, world = args.trace
        trace(base, int(sid), int(seed), world, args.width)
        return
    only = {int(x) for x in args.only.split(",") if x} or None
    records, wall = replay(base, only, args.jobs)
    summary = report(records, wall, base["summary"]["seeds"])
    if args.out:
        curves = {"curves": base["curves"]} if "curves" in base else {}
        args.out.write_text(
            json.dumps({**curves, "summary": summary, "tiers_mb": pb.TIERS, "scenarios": records}) + "\n"
        )


if __name__ == "__main__":
    main()
