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
    c.set_defaults(fn=tune)


def tune(args: argparse.Namespace) -> int:
    from smlt import tune as study
    from smlt.paths import out_folder

    out_folder(Path(args.out))
    if args.local:
        study.tune_local(Path(args.study), Path(args.out))
    else:
        study.check_study_file(Path(args.study))  # a bad file needs no AWS access
        study.run(study.deployed_target(args.stack), Path(args.study), Path(args.out))
    return 0
