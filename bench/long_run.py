"""A long run on the local engine: 400 rounds across chained executions.

    .venv/bin/python bench/long_run.py [--rounds 400] [--per-execution 100]

Records bench/results/long_run.json: rounds completed, executions used, the largest history of
any one execution, wall time and seconds per round.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--per-execution", type=int, default=100)
    args = ap.parse_args()

    from smlt.datasets import stage_dataset
    from smlt.errors import RunFailed
    from smlt.runner import execute, start_engine

    job = {
        "name": "long",
        "dataset": {"uri": "sklearn:digits"},
        "model": {"name": "logreg"},
        "training": {"max_rounds": args.rounds, "local_steps": 1, "batch_size": 16, "learning_rate": 0.01},
        "workers": {"initial": 2, "memory_mb": 1769},
        "rounds_per_execution": args.per_execution,
    }
    engine, names, _ = start_engine(None)
    try:
        job["dataset"]["uri"] = stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))
        out = Path(tempfile.mkdtemp(prefix="smlt-long-"))
        t0 = time.time()
        try:
            execute(engine, names, "long-run", job, out)
            rc = 0
        except RunFailed:
            rc = 1
        wall = time.time() - t0
    finally:
        engine.stop()
    metrics = json.loads((out / "metrics.json").read_text())
    history = json.loads((out / "history.json").read_text())
    per_exec: dict[str, int] = {}
    for e in history:
        per_exec[e["execution"]] = per_exec.get(e["execution"], 0) + 1
    result = {
        "rounds_requested": args.rounds,
        "rounds_per_execution": args.per_execution,
        "exit_code": rc,
        "rounds_trained": metrics["final"]["rounds"],
        "round_records": len(metrics["rounds"]),
        "executions": len(per_exec),
        "max_history_events_per_execution": max(per_exec.values()),
        "history_events_per_round": round(max(per_exec.values()) / args.per_execution, 1),
        "lost_updates": metrics["final"]["lost_updates"],
        "double_counted_updates": metrics["final"]["double_counted_updates"],
        "wall_seconds": round(wall, 1),
        "seconds_per_round": round(wall / max(1, len(metrics["rounds"])), 3),
        "val_accuracy": metrics["final"]["val_accuracy"],
    }
    (ROOT / "bench/results/long_run.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
