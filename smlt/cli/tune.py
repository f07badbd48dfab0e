"""`smlt tune STUDY [--local]`: a hyper-parameter study (docs/studies.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_command(sub: Any) -> None:
    c = sub.add_parser("tune", help="run a hyper-parameter study (with --local: on this machine)")
    c.add_argument("study", help="study file (JSON): a job, a search space, trials, budget, deadline")
    c.add_argument("--local", action="store_true", help="on the local engine (no AWS account)")
    c.add_argument("--stack", default="Smlt", help="without --local: the deployed stack (default: Smlt)")
    c.add_argument("--out", default="out", help="folder for the best model, best.json and study.json")
    c.add_argument("--quiet", action="store_true", help="no per-trial lines")
    c.add_argument(
        "--faults",
        help='with --local: inject faults into every trial, as `smlt run --local --faults` (e.g. "fail=0.2,seed=1")',
    )
    c.set_defaults(fn=tune)


def tune(args: argparse.Namespace) -> int:
    from smlt import api

    api.tune(Path(args.study), local=args.local, out=Path(args.out), stack=args.stack, faults=args.faults)
    return 0
