# ruff: noqa: E402, E701, E702, E731
# Scratch tool of bench/experiments/2026-12-07-plateau-per-setting.md; run from the repository root with PYTHONPATH=$PWD.
"""Fast scorer (bench/experiments/2026-12-06-held-out-mechanisms.md): re-run only our planner; the
oracle, guarded oracle and baselines are read from bench/results/planner.json.

usage: score.py SET SEEDS [--config variant.json] [--jobs N] [--out F] [--workload SUBSTR]
  SET: tuning | held_out | held_out_2 ; SEEDS: e.g. 5,6,7 (seed index j: seed = 1000 + 10 id + j)
"""

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from functools import partial
from multiprocessing import get_context
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))
import bench.planner_bench as pb
from smlt.runtime.config import FunctionSizes
from smlt.runtime.planner import decide
from smlt.runtime.planner.config import PlannerConfig, using
from smlt.runtime.prices import Prices
from smlt.sim.run import simulate
from smlt.sim.world import World

VARIANT = None


def run_ours(rec):
    with using(VARIANT):
        s = {k: rec[k] for k in ("workload", "deadline", "budget", "objective", "kind", "id")}
        w = pb.workload_of(s["workload"])
        world = World.draw(rec["seed"], rec["world"], w.family)
        job = pb.job_for(s, w)
        sizes = FunctionSizes()
        r = simulate(
            job,
            w,
            partial(decide, sizes=sizes),
            pb.TIERS,
            Prices(),
            seed=rec["seed"],
            world=world,
            give_flops=pb.GIVE_FLOPS,
            sizes=sizes,
        )
        return pb.summarize_run(r, s)


def headline(records):
    calm = [r for r in records if r["world"] == "calm"]
    noisy = [r for r in records if r["world"] == "noisy"]

    def met(rs):
        base = pb._oracle_met(rs, "oracle_guarded")
        return sum(1 for r in base if r["ours"]["deadline_met"]), len(base)

    ratios = pb._cost_ratios(records)
    return {
        "calm": met(calm),
        "noisy": met(noisy),
        "budget_exceeded": sum(1 for r in records if not r["ours"]["budget_ok"]),
        "median_cost_vs_oracle": round(statistics.median(ratios), 4) if ratios else None,
    }


def main():
    global VARIANT
    ap = argparse.ArgumentParser()
    ap.add_argument("set")
    ap.add_argument("seeds")
    ap.add_argument("--config")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--workload", default="")
    a = ap.parse_args()
    if a.config:
        VARIANT = PlannerConfig.from_file(Path(a.config))
    results = json.loads((ROOT / "bench/results/planner.json").read_text())
    if a.set not in results:  # e.g. held_out_2: bench/results/planner-held-out-2.json
        results = json.loads((ROOT / f"bench/results/planner-{a.set.replace('_', '-')}.json").read_text())
    doc = results[a.set]
    pb.use_curves(ROOT / doc["curves"])
    seeds = {int(x) for x in a.seeds.split(",")}
    recs = [r for r in doc["scenarios"] if (r["seed"] - 1000 - 10 * r["id"]) in seeds and a.workload in r["workload"]]
    recs.sort(
        key=lambda r: (
            -pb.workload_of(r["workload"]).curves.samples_scale * pb.workload_of(r["workload"]).flops_per_sample
        )
    )
    t0 = time.time()
    c0 = os.times()
    if a.jobs > 1:
        with get_context("fork").Pool(a.jobs) as pool:
            ours = pool.map(run_ours, recs, chunksize=1)
    else:
        ours = [run_ours(r) for r in recs]
    c1 = os.times()
    base = headline(recs)
    new = [dict(r, ours=o) for r, o in zip(recs, ours)]
    hv = headline(new)
    print(
        f"{a.set} seeds {sorted(seeds)} config {a.config}: {len(recs)} runs, wall {time.time() - t0:.0f} s, "
        f"cpu {c1.user + c1.children_user - c0.user - c0.children_user:.0f} s"
    )
    print("recorded:", base)
    print("variant: ", hv)
    by = defaultdict(lambda: [0, 0, 0])
    diffs = []
    for r, o in zip(recs, ours):
        if r["deadline"] is not None and r.get("oracle_guarded") and r["oracle_guarded"]["deadline_met"]:
            b = by[(r["workload"], r["world"])]
            b[0] += r["ours"]["deadline_met"]
            b[1] += o["deadline_met"]
            b[2] += 1
        if o["deadline_met"] != r["ours"]["deadline_met"]:
            diffs.append(
                (r["id"], r["seed"], r["world"], r["workload"], r["kind"], r["ours"]["deadline_met"], o["deadline_met"])
            )
    for k in sorted(by):
        if by[k][0] != by[k][1]:
            print("  ", k, "recorded {} -> {} of {}".format(*by[k]))
    for d in diffs:
        print("  diff", d)
    if a.out:
        Path(a.out).write_text(
            json.dumps(
                {
                    "recorded": base,
                    "variant": hv,
                    "runs": [
                        dict(id=r["id"], seed=r["seed"], world=r["world"], workload=r["workload"], ours=o)
                        for r, o in zip(recs, ours)
                    ],
                }
            )
        )


if __name__ == "__main__":
    main()
