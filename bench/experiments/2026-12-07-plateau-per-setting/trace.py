# ruff: noqa: E402, E701, E702, E731
# Scratch tool of bench/experiments/2026-12-07-plateau-per-setting.md; run from the repository root with PYTHONPATH=$PWD.
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.getcwd())
from functools import partial
from pathlib import Path

import bench.planner_bench as pb
from smlt.runtime.config import FunctionSizes
from smlt.runtime.planner import decide
from smlt.runtime.planner.config import PlannerConfig, using
from smlt.runtime.prices import Prices
from smlt.sim.run import simulate
from smlt.sim.world import World

setname, sid, seed, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfgs = [None] + [PlannerConfig.from_file(Path(f)) for f in sys.argv[5:]]
folder = {"tuning": pb.CURVES, "held_out": pb.HELD_OUT}[setname]
pb.use_curves(folder)
s = pb.scenarios()[sid]
w = pb.workload_of(s["workload"])
print(s, "target", w.target)
for c in cfgs:
    with using(c):
        sizes = FunctionSizes()
        r = simulate(
            pb.job_for(s, w),
            w,
            partial(decide, sizes=sizes),
            pb.TIERS,
            Prices(),
            seed=seed,
            world=World.draw(seed, kind, w.family),
            keep_history=True,
            sizes=sizes,
        )
    print(
        "== config",
        None if c is None else c.model_dump(exclude_defaults=True),
        "met",
        r.deadline_met(s["deadline"]),
        "elapsed",
        round(r.elapsed_s, 1),
        "cost",
        round(r.cost_usd, 4),
    )
    for i, d in enumerate(r.decisions):
        acc = r.history.rounds[i].val_accuracy if i < len(r.history.rounds) else None
        print(
            f"  {i:2d} {d['action']:5s} n={d.get('n')} m={d.get('m')} k={d.get('k')} acc={acc} | {d.get('reason', '')[:150]}"
        )
if os.environ.get("FULL"):
    for i in map(int, os.environ["FULL"].split(",")):
        print(i, r.decisions[i].get("reason"))
