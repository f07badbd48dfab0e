"""The quote's calibration in the planner benchmark (bench/planner_bench.py): for each run of smlt's
planner, what `smlt quote` would have said before any spend, and whether the run's outcome fell
inside the quoted p10-p90 ranges (issue #35: "the p10-p90 range covers the simulated outcome in
>= 80 % of runs").

The quote is `smlt.runtime.planner.quote.first_forecast`, the function `smlt quote` calls, on the
job and the pre-round-0 history the first plan reads (`smlt.sim.run.history_of`): never the
simulated world. It is computed beside the run, read-only: nothing here reaches a decision.
"""

from __future__ import annotations

from typing import Any

from smlt.runtime.job import Job
from smlt.runtime.planner.config import PlannerConfig, using
from smlt.runtime.planner.quote import first_forecast
from smlt.runtime.prices import Prices
from smlt.sim.run import history_of
from smlt.sim.workloads import Workload


def _r(x: float) -> float | None:
    """JSON-safe: an infinite end of a range is None ("never")."""
    return None if x == float("inf") else round(float(x), 6)


def quote_record(job: Job, w: Workload, tiers: list[int], prices: Prices, give_flops: bool) -> dict[str, Any]:
    """What `smlt quote` says of `job` before round 0, from what the first plan sees."""
    f = first_forecast(job, history_of(w, give_flops, job.model), tiers, prices, "x86_64")
    d, o = f.decision, f.outlook
    return {
        "feasible": not d.infeasible,
        "plan": None if d.action != "train" else {"n": d.workers, "m": d.memory_mb, "k": d.local_steps},
        "seconds": None if o is None else [_r(x) for x in o.seconds],
        "cost_usd": None if o is None else [_r(x) for x in o.cost_usd],
        "rounds": None if o is None else [_r(x) for x in o.rounds],
        "p_never": round(f.p_never, 4),
        "earliest_deadline_s": f.earliest_deadline_s,
        "min_budget_usd": f.min_budget_usd,
    }


def _inside(x: float, rng: list[float | None] | None) -> bool:
    if rng is None:
        return False
    lo, _, hi = rng
    return lo is not None and lo <= x and (hi is None or x <= hi)


def _frac(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def coverage(records: list[dict[str, Any]], who: str = "ours") -> dict[str, Any]:
    """Per world: over the runs of `who` that reached the target and were quoted a range, the
    fraction whose time (cost) to the target lies inside the quoted p10-p90 range, how many fell
    below and above it; and the quote's feasibility against the oracle's (a run is feasible when
    the oracle, the best fixed plan with hindsight, found a plan meeting both limits)."""
    out: dict[str, Any] = {}
    for world in sorted({r["world"] for r in records}):
        rs = [r for r in records if r["world"] == world and r.get("quote")]
        hit = [r for r in rs if r[who]["reached"] and r["quote"]["seconds"]]
        rec: dict[str, Any] = {"runs": len(rs), "reached_and_quoted": len(hit)}
        for key, field in (("time", "elapsed_s"), ("cost", "cost_usd")):
            rng = "seconds" if key == "time" else "cost_usd"
            inside = sum(1 for r in hit if _inside(r[who][field], r["quote"][rng]))
            below = sum(1 for r in hit if r[who][field] < r["quote"][rng][0])
            rec[f"quote_{key}_coverage"] = _frac(inside, len(hit))
            rec[f"quote_{key}_below_p10"] = below
            rec[f"quote_{key}_above_p90"] = len(hit) - inside - below
        rec["quote_infeasible_oracle_feasible"] = sum(1 for r in rs if not r["quote"]["feasible"] and r["oracle"])
        rec["quote_feasible_oracle_infeasible"] = sum(1 for r in rs if r["quote"]["feasible"] and not r["oracle"])
        out[world] = rec
    return out


def quote_row(cov: dict[str, Any]) -> str:
    """The benchmark README's table row of `coverage`."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f} %"

    worlds = "; ".join(
        f"{w} {pct(c['quote_time_coverage'])} / {pct(c['quote_cost_coverage'])} of {c['reached_and_quoted']}"
        for w, c in cov.items()
    )
    wrong = "; ".join(
        f"{w}: {c['quote_infeasible_oracle_feasible']} refused the oracle meets, "
        f"{c['quote_feasible_oracle_infeasible']} admitted it does not"
        for w, c in cov.items()
    )
    return (
        "| `smlt quote`'s p10-p90 covers the time / cost to the target (runs that reach it) | >= 80 % | "
        f"{worlds or '-'} ({wrong or '-'}) |"
    )


def main(argv: list[str] | None = None) -> None:
    """Re-quote the runs of a planner benchmark results file with the current quote and print the
    coverage: the runs do not depend on the quote (it is read-only), so a change to
    smlt/runtime/planner/quote.py is measured without running them again."""
    import argparse
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import planner_bench as pb

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument(
        "results", type=Path, help="a planner_bench.py results file (--out F, or bench/results/planner.json)"
    )
    ap.add_argument("--write", type=Path, help="also write the re-quoted results here")
    args = ap.parse_args(argv)
    data = json.loads(args.results.read_text())
    variant = PlannerConfig.model_validate(data["config"]) if data.get("config") else None  # --config runs
    cache: dict[int, dict[str, Any]] = {}
    with using(variant):
        for r in data["scenarios"]:
            if r["id"] not in cache:
                w = pb.workload_of(r["workload"])
                cache[r["id"]] = quote_record(pb.job_for(r, w), w, pb.TIERS, Prices(), pb.GIVE_FLOPS)
            r["quote"] = cache[r["id"]]
    cov = coverage(data["scenarios"])
    print(json.dumps(cov, indent=1))
    if args.write:
        data["summary"]["quote_calibration"] = cov
        args.write.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
