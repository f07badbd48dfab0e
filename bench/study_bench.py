"""Studies: ASHA against the same trials run to completion (a grid search without kills, as
Cirrus runs it) and against random search, over 3 seeds.

For each seed, on the local engine (the real stack: study machine, training machine, controller):
  - `full`: the example study with search "random" (the same sampled trials as ASHA: the
    sampler is seeded), no trial stopped: every trial to completion;
  - `asha`: the example study as written (ASHA, reduction factor 3).
From the `full` study's recorded curves (ROUND items: cost and accuracy after each round):
  - `random`: the same trials in a random order, one at a time, until one reaches the best
    accuracy of the whole study (the cost and time a random search needs to find it);
  - `asha_replay`: ASHA replayed on the recorded curves (the rule of smlt.runtime.study.asha, trials in
    order, a stopped trial charged up to its rung plus one evaluation round).
Cost is the sum of the trials' ledgers; time is wall seconds on this machine (local engine) or
the sum of recorded round seconds (replays). "Reaches the best accuracy": the study's best is at
least the `full` study's best less 0.005.

    nice -n 10 python bench/study_bench.py            # ~5 minutes; writes bench/results/study.json
    python bench/study_bench.py --smoke               # one seed, 4 trials of 4 rounds; nothing written
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402
from smlt import studies as tuning  # noqa: E402
from smlt.runtime.records import RunTable  # noqa: E402
from smlt.runtime.study import asha  # noqa: E402
from smlt.runtime.study.spec import parse_study  # noqa: E402

EXAMPLE = ROOT / "examples/digits-study.json"
OUT = ROOT / "bench/results/study.json"
SEEDS = (0, 1, 2)
TOLERANCE = 0.005
SMOKE = {"trials": 4, "max_rounds": 4}


def curves(engine, names, trials) -> list[dict]:
    out = []
    for t in trials:
        rounds = RunTable(names.table, t.run_id, client=engine.client("dynamodb")).rounds()
        out.append(
            {
                "trial": t.trial,
                "acc": [r.val_accuracy for r in rounds],
                "cost": [r.cost_total_usd for r in rounds],
                "seconds": [r.round_s for r in rounds],
                "final": t.metric,
                "total": t.cost_usd,
            }
        )
    return out


def reach(engine, names, trials, target: float, t0: float) -> dict:
    """Cost and time until a trial of the study first measured `target` (less TOLERANCE): the
    ledgers of every trial's rounds finished by then (what the study had spent at that moment)."""
    rounds = [
        (r.finished_at, t.trial, r)
        for t in trials
        for r in RunTable(names.table, t.run_id, client=engine.client("dynamodb")).rounds()
    ]
    hits = [at for at, _, r in rounds if r.val_accuracy is not None and r.val_accuracy >= target - TOLERANCE]
    if not hits:
        return {"cost_usd": None, "seconds": None}
    when = min(hits)
    spent: dict[int, float] = {}
    for at, trial, r in sorted(rounds, key=lambda x: x[0]):
        if at <= when:
            spent[trial] = r.cost_total_usd
    return {"cost_usd": sum(spent.values()), "seconds": when - t0}


def random_search(cs: list[dict], best: float, seed: int) -> dict:
    order = np.random.default_rng(seed).permutation(len(cs))
    cost = seconds = 0.0
    for i in order:
        cost += cs[i]["total"]
        seconds += sum(cs[i]["seconds"])
        if cs[i]["final"] is not None and cs[i]["final"] >= best - TOLERANCE:
            return {"cost_usd": cost, "seconds": seconds, "trials_run": int(list(order).index(i)) + 1}
    return {"cost_usd": cost, "seconds": seconds, "trials_run": len(cs)}


def asha_replay(cs: list[dict], rungs: list[int], eta: int) -> dict:
    recorded: dict[int, list[float]] = {r: [] for r in rungs}
    cost = seconds = 0.0
    best = -1.0
    stopped = 0
    for c in cs:
        end = len(c["acc"]) - 1
        kept_final = c["final"]
        for rung in rungs:
            curve = dict(enumerate(c["acc"]))
            v = asha.value_at(curve, rung)
            if v is None:
                break
            verdict = asha.judge(v, rung, recorded[rung], eta, True)
            recorded[rung].append(v)
            if not verdict.keep:
                end = min(rung + 1, len(c["acc"]) - 1)  # the stop costs one evaluation round
                kept_final = c["acc"][end]
                stopped += 1
                break
        cost += c["cost"][end]
        seconds += sum(c["seconds"][: end + 1])
        best = max(best, kept_final or 0.0)
    return {"cost_usd": cost, "seconds": seconds, "best": best, "stopped": stopped}


def study_raw(seed: int, search: dict, study_id: str, is_smoke: bool = False) -> dict:
    raw = json.loads(EXAMPLE.read_text())
    raw.update(seed=seed, search=search, study_id=study_id)
    if is_smoke:
        raw["trials"] = SMOKE["trials"]
        raw["job"]["training"]["max_rounds"] = SMOKE["max_rounds"]
    return raw


def run_study(target, tmp: Path, raw: dict) -> tuple[dict, float]:
    path = tmp / f"{raw['study_id']}.json"
    path.write_text(json.dumps(raw))
    t0 = time.time()
    meta, trials = tuning.run(target, path, tmp / raw["study_id"])
    return {"meta": meta, "trials": trials, "t0": t0}, time.time() - t0


def main() -> None:
    import tempfile

    from smlt.runner import start_engine
    from smlt.runtime.progress import progress

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    smoke.add_flag(ap)
    is_smoke = ap.parse_args().smoke
    progress.disabled = True
    example = parse_study(study_raw(0, json.loads(EXAMPLE.read_text())["search"], "rungs", is_smoke))
    rungs, eta = example.asha_rungs(), example.search.reduction_factor  # type: ignore[union-attr]
    engine, names, _ = start_engine(None)
    results = []
    try:
        target = tuning.local_target(engine)
        with tempfile.TemporaryDirectory() as tmp:
            for seed in SEEDS[:1] if is_smoke else SEEDS:
                full, full_s = run_study(
                    target, Path(tmp), study_raw(seed, {"kind": "random"}, f"bench-full-{seed}", is_smoke)
                )
                ash, ash_s = run_study(
                    target, Path(tmp), study_raw(seed, example.search.model_dump(), f"bench-asha-{seed}", is_smoke)
                )
                cs = curves(engine, names, full["trials"])
                best = full["meta"].best_metric
                ash_reach = reach(engine, names, ash["trials"], best, ash["t0"])
                row = {
                    "seed": seed,
                    "trials": len(cs),
                    "best_accuracy_full": best,
                    "full": {
                        "cost_usd": full["meta"].spent_usd,
                        "seconds": full_s,
                        "reach": reach(engine, names, full["trials"], best, full["t0"]),
                        # every trial trained to max_rounds (none stopped by its budget share)
                        "rounds": [t.rounds for t in full["trials"]],
                    },
                    "asha": {
                        "cost_usd": ash["meta"].spent_usd,
                        "seconds": ash_s,
                        "best": ash["meta"].best_metric,
                        "stopped": sum(t.status == "STOPPED" for t in ash["trials"]),
                        "reach": ash_reach,
                    },
                    "random": random_search(cs, best, seed),
                    "asha_replay": asha_replay(cs, rungs, eta),
                }
                full_cost = row["full"]["cost_usd"]
                row["asha_total_cost_ratio"] = row["asha"]["cost_usd"] / full_cost
                row["asha_reach_cost_ratio"] = (
                    None if ash_reach["cost_usd"] is None else ash_reach["cost_usd"] / full_cost
                )
                row["asha_replay_cost_ratio"] = row["asha_replay"]["cost_usd"] / full_cost
                row["asha_reaches_best"] = row["asha"]["best"] >= best - TOLERANCE
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        engine.stop()
    summary = {
        "what": "ASHA vs every trial to completion vs random search, examples/digits-study.json, local engine",
        "command": "nice -n 10 python bench/study_bench.py",
        "tolerance": TOLERANCE,
        "seeds": results,
        # the criterion: ASHA reaches the best accuracy at <= 0.5x the cost of every trial to completion
        "done": all(
            r["asha_reaches_best"] and r["asha_reach_cost_ratio"] is not None and r["asha_reach_cost_ratio"] <= 0.5
            for r in results
        ),
    }
    if is_smoke:
        smoke.report(summary)
        return
    OUT.write_text(json.dumps(summary, indent=2) + "\n")
    print("done:", summary["done"])


if __name__ == "__main__":
    main()
