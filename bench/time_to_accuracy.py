"""Time to the target accuracy: `smlt run --local` against plain single-process PyTorch and
PyTorch DDP (gloo, 2 processes), same prepared data, model, optimizer, batch size, target and
evaluation cadence (see bench/baselines.py); start-up reported apart from training time.

`tta(name, ...)` measures one job of `TTA` and returns its part of bench/results/local.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.jobs import CACHE, ROOT, Split, example_job, prepare

# The jobs (examples/ file) and the split the bench prepares their dataset with.
TTA = {
    "digits": ("bench-digits.json", Split(shards=16, validation_fraction=0.2)),
    # 240,000 training rows, 10,000 validation rows (a large validation split would make every
    # evaluation, in all three systems alike, cost more than the training between them).
    "synthetic": ("bench-synthetic.json", Split(shards=32, validation_fraction=0.04)),
}

# The CLI of the environment running the bench (`make bench`: .venv/bin/smlt).
SMLT_CLI = Path(sys.executable).with_name("smlt")


def tta(name: str, with_smlt: bool, max_train_s: float) -> dict[str, Any]:
    """The baselines and smlt on job `name`; `plain` is the faster plain PyTorch run that reached."""
    from bench.baselines import run_baseline

    file, split = TTA[name]
    job = example_job(file)
    source = job["dataset"]["uri"]
    folder = prepare(name, source, split)
    job = {**job, "dataset": {"uri": str(folder)}}
    res: dict[str, Any] = {"dataset": name, "source": source, "job": job}
    print(f"time to accuracy on {name} (target {job['training']['target_value']})", flush=True)
    # plain PyTorch with torch's default threads (2 here) and with 1: on a busy 2-core machine the
    # 2-thread run can be many times slower; the faster of the two is the baseline.
    for key, kind, threads in (("plain_1thread", "plain", 1), ("plain_default", "plain", None), ("ddp", "ddp", None)):
        cap = max_train_s
        one = res.get("plain_1thread", {})
        if key == "plain_default" and one.get("reached"):
            # it only matters if it beats the 1-thread run: stop it once it cannot
            cap = min(max_train_s, 1.1 * one["train_s"] + 1.0)
        try:
            r = run_baseline(kind, folder, job, max_train_s=cap, threads=threads)
        except Exception as e:  # noqa: BLE001 - recorded, the bench goes on
            r = {"skipped": True, "note": f"{type(e).__name__}: {e}"[:800]}
        r["cap_s"] = cap
        res[key] = r
        print(f"  {key:14s} " + _fmt(r), flush=True)
    plains = [r for r in (res["plain_1thread"], res["plain_default"]) if r.get("reached")]
    res["plain"] = min(plains, key=lambda r: r["train_s"]) if plains else res["plain_default"]
    if with_smlt:
        r = run_smlt_local(job, CACHE / "smlt-out" / name)
    else:
        r = {"skipped": True, "note": "skipped (--skip-smlt)"}
    if r.get("samples"):
        r["epochs"] = r["samples"] / json.loads((folder / "manifest.json").read_text())["train"]["rows"]
    res["smlt"] = r
    print(f"  {'smlt':14s} " + _fmt(r), flush=True)
    return res


def run_smlt_local(job: dict[str, Any], out_dir: Path, timeout_s: float = 600.0) -> dict[str, Any]:
    """`smlt run --local JOB --out DIR --quiet`, timed from the outside; reads DIR/metrics.json.

    run_s = metrics.final.wall_seconds (from the run's creation, i.e. the first plan, to the
    final metrics); train_s = run_s minus round 0's excess over a typical round (the handler
    processes' cold start); startup_s = everything else of the command's wall time (synth, engine
    and process-pool start, cold start, writing the outputs).
    """
    if not SMLT_CLI.exists():
        return {"skipped": True, "note": f"{SMLT_CLI} not found (smlt is not installed in this environment)"}
    out_dir.mkdir(parents=True, exist_ok=True)
    job_file = out_dir / "job.json"
    job_file.write_text(json.dumps(job, indent=1))
    t0 = time.time()
    try:
        proc = subprocess.run(
            [str(SMLT_CLI), "run", "--local", str(job_file), "--out", str(out_dir), "--quiet"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return {"skipped": True, "note": f"smlt run --local did not finish within {timeout_s:.0f} s"}
    wall = time.time() - t0
    metrics_file = out_dir / "metrics.json"
    if proc.returncode != 0 or not metrics_file.exists():
        return {
            "skipped": True,
            "note": f"smlt run --local failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-800:]}",
        }
    m = json.loads(metrics_file.read_text())
    final = m.get("final", {})
    run_s = float(final.get("wall_seconds") or wall)
    rounds_s = [float(r["round_s"]) for r in m.get("rounds", []) if r.get("round_s") is not None]
    cold_s = _cold_start_s(rounds_s)
    acc = final.get("val_accuracy")
    return {
        "kind": "smlt",
        "startup_s": max(0.0, wall - run_s) + cold_s,
        "train_s": run_s - cold_s,
        "run_s": run_s,
        "first_round_cold_s": cold_s,
        "wall_s": wall,
        "rounds_s": rounds_s,
        "reached": acc is not None and acc >= job["training"]["target_value"],
        "accuracy": acc,
        "rounds": final.get("rounds"),
        "samples": final.get("samples"),
        "stop_reason": final.get("stop_reason"),
        "estimated_cost_usd": final.get("estimated_cost_usd"),
    }


def _cold_start_s(rounds_s: list[float]) -> float:
    """Round 0's excess over a typical round. Round 0 also pays the handler processes' cold start
    (importing torch, loading shards): the same one-time work the baselines' start-up holds, so it
    counts as start-up; the raw figure stays in `run_s`."""
    if len(rounds_s) < 2:
        return 0.0
    rest = sorted(rounds_s[1:])
    return max(0.0, rounds_s[0] - rest[len(rest) // 2])


def _fmt(r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return f"skipped: {r.get('note', '')[:200]}"
    return (
        f"start-up {r['startup_s']:6.1f} s, training {r['train_s']:7.2f} s, reached={r['reached']} "
        f"accuracy {r.get('accuracy') or 0:.4f}"
    )


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """a's training time over b's, when both ran and reached the target."""
    if not a or not b or a.get("skipped") or b.get("skipped") or not a.get("reached") or not b.get("reached"):
        return None
    return float(a["train_s"]) / float(b["train_s"])
