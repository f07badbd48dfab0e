"""`make bench`: everything measured in one run on this machine, written to bench/results/local.json
and rendered (bench/local_report.py) into the `## Local engine and aggregation` section of bench/README.md.

1. time to the target accuracy on digits and on a synthetic set of 250,000 samples
   (bench/time_to_accuracy.py): `smlt run --local` against plain single-process PyTorch and
   PyTorch DDP (gloo, 2 processes), same prepared data, model, optimizer, batch size, target and
   evaluation cadence (bench/baselines.py); start-up reported apart from training time. The jobs
   are examples/bench-digits.json and examples/bench-synthetic.json.
2. orchestration overhead per round of the local engine (no-op compute, 8 workers,
   examples/bench-overhead.json; bench/overhead.py): the real stack with a tiny logistic
   regression, broken down by state and by the handlers' AWS calls (`--overhead-unpatched` adds
   the same run with smlt/local/speed.py's patches off).
3. aggregation: in-process reduce vs numpy, sharded vs single through Redis and S3 (moto), and
   the accuracy cost of fp16/bf16 updates (bench/aggregation_bench.py).

Ratios are what to read: the machine is shared, so absolute times move with its load; every
ratio compares runs made minutes apart in the same invocation. `summary` holds the headline
ratios; the load average at start and end is recorded.

    python bench/local_bench.py [--skip-smlt] [--skip-tta] [--skip-aggregation]
                                [--overhead-unpatched] [--overhead-only] [--update-overhead] [--smoke]

The seeds: the jobs' own (`seed` 0 in both examples; the synthetic set is generated with seed 0,
its URI says so); the baselines seed their models and data order with the job's seed
(bench/baselines.py).
    python bench/local_report.py      # re-render the README section from the recorded JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import local_report, smoke  # noqa: E402 - needs ROOT on the path when run as a script
from bench.overhead import smlt_overhead_ms_per_round  # noqa: E402
from bench.time_to_accuracy import ratio, tta  # noqa: E402

# --smoke: time to accuracy on digits alone and a short overhead run (its CPU window, rounds 2..6,
# included); the aggregation part is aggregation_bench.py's own smoke run. Nothing written.
SMOKE_OVERHEAD_ROUNDS = 8
SMOKE_MAX_TRAIN_S = 60.0


def main() -> None:
    a = _args()
    if a.overhead_only:
        print(json.dumps(smlt_overhead_ms_per_round(), default=float))
        return
    if a.smoke:
        a.max_train_s = min(a.max_train_s, SMOKE_MAX_TRAIN_S)
        a.skip_aggregation = True  # aggregation_bench.py --smoke runs it (the test runs both)
        smoke.report(measure(a))
        return
    out = Path(a.out or local_report.RESULTS)
    if a.readme_only:
        local_report.update_readme(json.loads(out.read_text()))
        return
    if a.update_overhead:
        _update_overhead(out)
        return
    results = measure(a)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=float))
    if not a.no_readme:
        local_report.update_readme(results)
    print(json.dumps(results["summary"], indent=1))
    print(f"bench finished in {results['elapsed_s']:.0f} s; results in {out}")


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    smoke.add_flag(ap)
    ap.add_argument("--skip-smlt", action="store_true")
    ap.add_argument("--skip-tta", action="store_true")
    ap.add_argument("--skip-aggregation", action="store_true")
    ap.add_argument("--max-train-s", type=float, default=240.0, help="cap on one baseline's training time")
    ap.add_argument("--out", help=f"results JSON (default: {local_report.RESULTS.relative_to(ROOT)})")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument(
        "--readme-only",
        action="store_true",
        help="rewrite the README section from --out's JSON (the same as bench/local_report.py)",
    )
    ap.add_argument(
        "--overhead-unpatched",
        action="store_true",
        help="also measure the overhead with smlt.local.speed's patches off (about 2 min more)",
    )
    ap.add_argument(
        "--update-overhead",
        action="store_true",
        help="measure only the overhead and update it in --out's JSON and the README",
    )
    ap.add_argument(
        "--overhead-only",
        action="store_true",
        help="print smlt_overhead_ms_per_round()'s JSON and exit (SMLT_LOCAL_SPEEDUPS=0: unpatched)",
    )
    return ap.parse_args()


def measure(a: argparse.Namespace) -> dict[str, Any]:
    """Every part the flags ask for, in one results dict (bench/results/local.json's layout)."""
    t0 = time.time()
    results: dict[str, Any] = {
        "started_at": t0,
        "command": " ".join([".venv/bin/python", "bench/local_bench.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "load_average_start": os.getloadavg(), "python": sys.version.split()[0]},
    }
    try:
        import torch

        results["machine"]["torch"] = torch.__version__
    except ImportError:
        pass
    results["tta"] = {}
    if not a.skip_tta:
        for name in ("digits",) if a.smoke else ("digits", "synthetic"):
            results["tta"][name] = tta(name, not a.skip_smlt, a.max_train_s)
    results["overhead"] = smlt_overhead_ms_per_round(SMOKE_OVERHEAD_ROUNDS if a.smoke else None)
    if a.overhead_unpatched:
        results["overhead_unpatched"] = _overhead_unpatched()
    if not a.skip_aggregation:
        from bench import aggregation_bench

        agg = aggregation_bench.run(smoke=a.smoke)
        agg["summary"] = aggregation_bench.summarize(agg)
        results["aggregation"] = agg
    results["summary"] = _summary(results)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["elapsed_s"] = time.time() - t0
    return results


def _overhead_unpatched() -> dict[str, Any]:
    """The same overhead run on an unpatched engine, in a fresh process."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--overhead-only"],
        capture_output=True,
        text=True,
        env={**os.environ, "SMLT_LOCAL_SPEEDUPS": "0"},
        cwd=ROOT,
        timeout=600,
    )
    try:
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"skipped": True, "note": proc.stderr[-800:]}
    return result


def _summary(results: dict[str, Any]) -> dict[str, Any]:
    """The headline ratios (the README's summary table)."""
    big = results["tta"].get("synthetic", {})
    agg = results.get("aggregation", {}).get("summary", {})
    return {
        "tta_vs_pytorch": ratio(big.get("smlt"), big.get("plain")),
        "tta_vs_ddp": ratio(big.get("smlt"), big.get("ddp")),
        "ddp_vs_pytorch": ratio(big.get("ddp"), big.get("plain")),
        "overhead_ms_per_round": results["overhead"].get("ms_per_round"),
        "reduce_vs_reference": agg.get("reduce_vs_reference"),
        "sharded_vs_single": agg.get("sharded_vs_single"),
        "sharded_vs_single_by_backend": agg.get("sharded_vs_single_by_backend"),
        "compression_accuracy_cost": agg.get("compression_accuracy_cost"),
    }


def _update_overhead(out: Path) -> None:
    """Re-measure the overhead alone into an existing results file and the README."""
    results = json.loads(out.read_text())
    results["overhead"] = smlt_overhead_ms_per_round()
    results["summary"]["overhead_ms_per_round"] = results["overhead"].get("ms_per_round")
    results.pop("overhead_unpatched", None)  # measured against the engine as it was then
    out.write_text(json.dumps(results, indent=1, default=float))
    local_report.update_readme(results)
    print(json.dumps(results["overhead"]["breakdown_median"], indent=1, default=float))


if __name__ == "__main__":
    main()
