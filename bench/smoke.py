"""`--smoke`, the one flag every benchmark in bench/ takes: its measuring code end to end on tiny
inputs, in seconds, writing no results (no bench/results/, no README, no calibration or curves).
The numbers it prints mean nothing; they only show that the code still runs.

tests/e2e/test_bench_smoke.py runs every script with it (`make test`, so CI): a change that breaks
a benchmark fails there. The last line a smoke run prints is `MARK` and its results as JSON; the
test reads it and fails on any part that says `"skipped": true`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

FLAG = "--smoke"
HELP = "a smoke run: the measuring code end to end on tiny inputs in seconds; writes no results"
MARK = "smoke results: "


def add_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(FLAG, action="store_true", help=HELP)


def report(results: Any) -> None:
    """Print a smoke run's results as its last line (for the test; never written to a file)."""
    print(MARK + json.dumps(results, default=str), flush=True)


def skipped(results: Any, path: str = "") -> list[str]:
    """Where `results` holds a part marked skipped, with its note."""
    if isinstance(results, dict):
        if results.get("skipped"):
            return [f"{path or '.'}: {results.get('note', '')}"]
        return [p for k, v in results.items() for p in skipped(v, f"{path}.{k}")]
    if isinstance(results, list):
        return [p for i, v in enumerate(results) for p in skipped(v, f"{path}[{i}]")]
    return []
