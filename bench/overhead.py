"""Orchestration overhead per round of the local engine, with compute so small it is noise: the
real stack (CDK synth of infra/app.py, moto's interpreter, the planner, 8 train_step invocations
through the Distributed Map, the aggregator) running examples/bench-overhead.json (logistic
regression, batch 1, one local step, a 400-row dataset).

`smlt_overhead_ms_per_round()` returns the `overhead` part of bench/results/local.json.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.jobs import Split, example_job, prepare
from bench.long_run import MemorySampler

JOB_FILE = "bench-overhead.json"
SPLIT = Split(shards=8, validation_fraction=0.1)
# The states a round's breakdown names, and the handlers' function names in the invocation trace.
HANDLERS = {"planner": "Planner", "train": "TrainStep", "aggregate": "Aggregate"}

Spans = dict[str, list[tuple[float, float]]]
SAMPLE_S = 0.25  # CPU sampling interval (a round here ~0.25 s; positions between samples are interpolated)


def smlt_overhead_ms_per_round(rounds: int | None = None) -> dict[str, Any]:
    """The overhead job (`rounds` overrides its max_rounds) on a fresh local engine.

    ms_per_round = median wall time of a round (Plan entered to the next Plan entered, from the
    execution history), rounds 2.. (rounds 0-1 pay the handler processes' cold imports). The
    breakdown (medians per round) splits it into the states' wall times and, with the engine's
    invocation trace, into time in the handlers (their AWS calls apart) and the rest (seam,
    queueing for the pool's processes, interpreter transitions).
    """
    from smlt.datasets import stage_dataset
    from smlt.runner import execute, start_engine
    from smlt.runtime.errors import RunFailed

    job = example_job(JOB_FILE)
    if rounds is not None:
        job["training"]["max_rounds"] = rounds
    rounds = int(job["training"]["max_rounds"])
    folder = prepare("overhead", job["dataset"]["uri"], SPLIT)
    t0 = time.time()
    engine, names, _ = start_engine(None)
    startup_s = time.time() - t0
    try:
        job["dataset"] = {"uri": stage_dataset(str(folder), names.data_bucket, client=engine.client("s3"))}
        out = Path(tempfile.mkdtemp(prefix="smlt-overhead-"))
        engine.start_trace()
        t1 = time.time()
        with MemorySampler(interval=SAMPLE_S) as sampler:
            try:
                execute(engine, names, "overhead", job, out)
                rc = 0
            except RunFailed:
                rc = 1
        wall = time.time() - t1
        trace = engine.stop_trace()
        pool_size = engine.pool.size
    finally:
        engine.stop()
    if rc != 0:
        return {"skipped": True, "note": f"overhead run failed ({rc})"}
    spans = _state_spans(json.loads((out / "history.json").read_text()))
    rows = _round_rows(spans, trace, pool_size)
    if not rows:
        return {"skipped": True, "note": "too few rounds in the history"}
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    half = len(rows) // 2
    return {
        "ms_per_round": med["round_ms"],
        "breakdown_median": med,
        "rounds_measured": len(rows),
        "workers": job["workers"]["initial"],
        "pool_processes": pool_size,
        "engine_startup_s": startup_s,
        "wall_s": wall,
        "round_ms": [r["round_ms"] for r in rows],
        "first_half_median_ms": statistics.median(r["round_ms"] for r in rows[:half]) if half else None,
        "second_half_median_ms": statistics.median(r["round_ms"] for r in rows[half:]),
        "job": job,
        "load_average": os.getloadavg(),
        "cpu_ms_per_round": _cpu_per_round([a for a, _ in spans.get("Plan", [])], sampler.samples, 2, rounds - 2),
    }


def _state_spans(history: list[dict[str, Any]]) -> Spans:
    """{state name: [(entered, exited) timestamps]} from an execution history."""

    def ts(e: dict[str, Any]) -> float:
        return datetime.fromisoformat(str(e["timestamp"])).timestamp()

    spans: Spans = {}
    entered: dict[str, float] = {}
    for e in history:
        d = e.get("stateEnteredEventDetails") or e.get("stateExitedEventDetails")
        if not d:
            continue
        if e["type"].endswith("Entered"):
            entered[d["name"]] = ts(e)
        elif d["name"] in entered:
            spans.setdefault(d["name"], []).append((entered.pop(d["name"]), ts(e)))
    return spans


def _round_rows(spans: Spans, trace: list[dict[str, Any]], pool_size: int) -> list[dict[str, float]]:
    """One breakdown per round from round 2 on (a round: Plan entered to the next Plan entered)."""
    plans = [a for a, _ in spans.get("Plan", [])]
    return [_round_row(plans[r], plans[r + 1], spans, trace, pool_size) for r in range(2, len(plans) - 1)]


def _round_row(a: float, b: float, spans: Spans, trace: list[dict[str, Any]], pool_size: int) -> dict[str, float]:
    def inside(name: str) -> float:
        return sum(y - x for x, y in spans.get(name, []) if a <= x < b)

    row = {
        "round_ms": (b - a) * 1e3,
        "plan_ms": inside("Plan") * 1e3,
        "map_ms": inside("Train") * 1e3,
        "aggregate_ms": inside("Aggregate") * 1e3,
    }
    row["choice_and_transitions_ms"] = row["round_ms"] - row["plan_ms"] - row["map_ms"] - row["aggregate_ms"]
    calls = [c for c in trace if a <= c["start"] < b]
    for k, tag in HANDLERS.items():
        cs = [c for c in calls if tag in c["function"]]
        row[f"{k}_invocations"] = len(cs)
        row[f"{k}_handler_ms"] = sum(c["handler_s"] or 0 for c in cs) * 1e3
        row[f"{k}_aws_calls"] = sum(n for c in cs for n, _ in c["api"].values())
        row[f"{k}_aws_ms"] = sum(s for c in cs for _, s in c["api"].values()) * 1e3
        row[f"{k}_seam_ms"] = sum(c["seam_s"] - (c["handler_s"] or 0) - c["queued_s"] for c in cs) * 1e3
    # the Map's wall time against its workers' handler time spread over the pool's processes
    row["map_minus_workers_per_process_ms"] = row["map_ms"] - row["train_handler_ms"] / pool_size
    return row


def _cpu_per_round(
    plans: list[float], samples: list[tuple[float, float, float, float, float]], first: int, last: int
) -> dict[str, float] | None:
    """CPU ms per round between round `first`'s and round `last`'s Plan (the steady state): the
    engine process (moto server, interpreter, follower) and the handler processes apart. From
    bench/long_run.py's sampler (time, RSS, RSS, CPU s of this process, CPU s of its descendants)
    and the execution history: the run is not probed from inside, only watched."""
    if len(plans) <= last or last <= first:
        return None
    inside = [s for s in samples if plans[first] <= s[0] <= plans[last]]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    rounds = _round_at(plans, b[0]) - _round_at(plans, a[0])
    if rounds <= 0:
        return None
    return {
        "engine_process": (b[3] - a[3]) * 1e3 / rounds,
        "handler_processes": (b[4] - a[4]) * 1e3 / rounds,
        "rounds": round(rounds, 2),
    }


def _round_at(plans: list[float], t: float) -> float:
    """Rounds elapsed at time t, counting round r from its Plan entered (linear within a round)."""
    i = bisect.bisect_right(plans, t) - 1
    if i + 1 >= len(plans):
        return float(i)
    return i + (t - plans[i]) / (plans[i + 1] - plans[i])
