"""Orchestration overhead per round of the local engine, with compute so small it is noise: the
real stack (CDK synth of infra/app.py, moto's interpreter, the planner, 8 train_step invocations
through the Distributed Map, the aggregator) running examples/bench-overhead.json (logistic
regression, batch 1, one local step, a 400-row dataset).

`smlt_overhead_ms_per_round()` returns the `overhead` part of bench/results/local.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.jobs import Split, example_job, prepare

JOB_FILE = "bench-overhead.json"
SPLIT = Split(shards=8, validation_fraction=0.1)
# The states a round's breakdown names, and the handlers' function names in the invocation trace.
HANDLERS = {"planner": "Planner", "train": "TrainStep", "aggregate": "Aggregate"}

Spans = dict[str, list[tuple[float, float]]]


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
        with _cpu_marks(first=2, last=rounds - 2) as marks:
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
    rows = _round_rows(_state_spans(json.loads((out / "history.json").read_text())), trace, pool_size)
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
        "cpu_ms_per_round": _cpu_per_round(marks),
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


CpuMarks = dict[int, tuple[int, dict[int, float]]]


@contextlib.contextmanager
def _cpu_marks(first: int, last: int) -> Iterator[CpuMarks]:
    """CPU seconds of this process and of its descendants (the handler processes), read from
    /proc when the run's follower has seen `first` and then `last` rounds: the steady state."""
    from smlt import runner

    marks: CpuMarks = {}
    poll = runner.Follower.poll

    def marking(self: runner.Follower, *args: Any) -> None:
        poll(self, *args)
        for m in (first, last):
            if len(self.seen) >= m and m not in marks:
                marks[m] = (len(self.seen), _cpu_seconds(os.getpid()))

    runner.Follower.poll = marking  # type: ignore[method-assign]  # a probe for this run only, restored below
    try:
        yield marks
    finally:
        runner.Follower.poll = poll  # type: ignore[method-assign]


def _cpu_seconds(root: int) -> dict[int, float]:
    """{pid: user + system CPU seconds} of root and its descendants ({} without /proc)."""
    tick, procs = os.sysconf("SC_CLK_TCK"), {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            procs[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, (parent, _) in procs.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {pid: procs[pid][1] for pid in tree if pid in procs}


def _cpu_per_round(marks: CpuMarks) -> dict[str, float] | None:
    """CPU ms per round between the two marks: the engine process (moto server, interpreter,
    follower) and the handler processes together."""
    if len(marks) < 2:
        return None
    (n0, c0), (n1, c1) = (marks[k] for k in sorted(marks))
    me = os.getpid()

    def per(pids: list[int]) -> float:
        return sum(c1[p] - c0.get(p, 0.0) for p in pids) * 1e3 / max(1, n1 - n0)

    return {"engine_process": per([me]), "handler_processes": per([p for p in c1 if p != me]), "rounds": n1 - n0}
