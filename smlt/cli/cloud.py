"""`smlt start`, `status`, `fetch`, `stop`, `resume`: against a deployed stack."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    for name, fn, helptext in (
        ("start", start, "start a run on the deployed stack from a job file"),
        ("status", status, "progress of a run on the deployed stack"),
        ("fetch", fetch, "download a finished run's model, metrics, report and history"),
    ):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("job" if name == "start" else "run")
        c.add_argument("--stack", default="Smlt", help="CloudFormation stack name (default: Smlt)")
        if name == "fetch":
            c.add_argument("--out", help="folder (default: out/RUN)")
        if name == "start":
            add_code_flag(c)
        c.set_defaults(fn=fn)
    stop_cmd = sub.add_parser("stop", help="stop a run cleanly: its next plan stops it and finalizes the best model")
    stop_cmd.add_argument("run")
    stop_cmd.add_argument("--reason", default="from the command line", help="why (kept in final/metrics.json)")
    stop_cmd.add_argument("--stack", default="Smlt", help="CloudFormation stack name (default: Smlt)")
    stop_cmd.set_defaults(fn=stop)


def add_code_flag(cmd: Any) -> None:
    cmd.add_argument(
        "--code",
        type=Path,
        metavar="DIR",
        help="your Python package (or a folder of packages): shipped with the job for its model.name and "
        "code.transform (see docs/deploy.md)",
    )


def start(args: argparse.Namespace) -> int:
    from smlt import cloud as remote
    from smlt.precheck import check_job_file

    # the model built here once before anything is uploaded (an s3:// dataset read with your credentials)
    check_job_file(Path(args.job), code=args.code, s3=True)
    remote.start(Path(args.job), args.stack, code=args.code)  # the job is checked before the stack is looked up
    return 0


def status(args: argparse.Namespace) -> int:
    from smlt import cloud as remote

    remote.status(args.run, remote.Stack.lookup(args.stack), resume_command=resume_command(args.run, args))
    return 0


def fetch(args: argparse.Namespace) -> int:
    from smlt import cloud as remote
    from smlt.paths import out_folder

    out_folder(Path(args.out or f"out/{args.run}"))
    remote.fetch(args.run, remote.Stack.lookup(args.stack), Path(args.out or f"out/{args.run}"))
    return 0


def stop(args: argparse.Namespace) -> int:
    from smlt import cloud as remote
    from smlt.dashboard.data import request_stop
    from smlt.runtime.progress import notice
    from smlt.runtime.records import RunTable

    item = request_stop(RunTable(remote.Stack.lookup(args.stack).table, args.run), args.reason)
    notice.info(f"stop requested for run {args.run} by {item.by}: {item.reason} (the next plan stops it)")
    return 0


def resume(args: argparse.Namespace) -> int:
    from smlt import cloud as remote

    remote.resume(args.run, remote.Stack.lookup(args.stack))
    return 0


def resume_command(run_id: str, args: argparse.Namespace | None) -> str:
    """The exact command that continues a run, as the user started it: locally with the same
    --out (smlt.runner.resume_command), else on its stack."""
    if args is not None and getattr(args, "local", False):
        from smlt.runner import resume_command as local

        return local(run_id, Path(getattr(args, "out", None) or "out"))
    stack = getattr(args, "stack", "Smlt") if args is not None else "Smlt"
    return f"smlt resume {run_id}" + (f" --stack {shlex.quote(stack)}" if stack and stack != "Smlt" else "")
