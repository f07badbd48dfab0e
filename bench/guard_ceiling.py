"""The price of smlt's budget guard on a recorded planner benchmark: the guarded oracle, added.

`bench/planner_bench.py` records, per run, the oracle (the best fixed plan with hindsight) and the
oracle under smlt's budget guard (`oracle_guarded`: each plan stops before a round whose worst case
does not fit in the money left, as smlt's planner does). This tool (re)computes `oracle_guarded`
for a record without re-running the rest (~3 min for ten seeds on 2 cores): for records made before
it existed, or to see what another worst case (`TimingModel.forecast`'s `cost_ub`, edited in a
worktree) would leave possible for any planner, before building a planner for it.

    .venv/bin/python bench/guard_ceiling.py --base F.json [--jobs 2] [--tries 24] [--out G.json]
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

from smlt.runtime.prices import Prices  # noqa: E402
from smlt.sim.world import World  # noqa: E402

SCENARIO_KEYS = ("workload", "deadline", "budget", "objective", "kind", "id")


def run_case(case: tuple[dict[str, Any], int]) -> dict[str, Any] | None:
    rec, tries = case
    s = {k: rec[k] for k in SCENARIO_KEYS}
    w = pb.workload_of(s["workload"])
    world = World.draw(rec["seed"], rec["world"], w.family)
    return pb.guarded_oracle(pb.job_for(s, w), w, Prices(), rec["seed"], world, rec["oracle"], s, tries)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--base", required=True, help="a recorded planner_bench.py result")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--tries", type=int, default=pb.GUARDED_TRIES, help="fixed plans the guarded oracle may try")
    ap.add_argument("--out", help="write the record with oracle_guarded filled in here")
    a = ap.parse_args(argv)
    base = json.loads(Path(a.base).read_text())
    recs = base["scenarios"]
    t0 = time.time()
    with get_context("spawn").Pool(a.jobs) as pool:
        guarded = pool.map(run_case, [(r, a.tries) for r in recs], chunksize=1)
    recs = [dict(r, oracle_guarded=g) for r, g in zip(recs, guarded)]
    s = pb.summarize(recs, time.time() - t0, seeds=base["summary"]["seeds"])
    for world, p in s["details"]["guard_price"].items():
        print(
            f"{world}: the oracle meets {p['oracle_met']} deadlines, the guarded oracle {p['guarded_oracle_met']}; "
            f"smlt meets {p['ours_met_guarded_oracle_not']} that the guarded oracle does not"
        )
    print(
        f"smlt's deadline met where the guarded oracle meets it: calm {s['deadline_met_when_guarded_feasible']}, "
        f"noisy {s['deadline_met_when_guarded_feasible_noisy']} (where the oracle meets it: "
        f"{s['deadline_met_when_feasible']}, {s['deadline_met_when_feasible_noisy']}); wall {time.time() - t0:.0f} s"
    )
    if a.out:
        Path(a.out).write_text(json.dumps(dict(base, summary=s, scenarios=recs), indent=1))


if __name__ == "__main__":
    main()
