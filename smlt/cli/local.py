"""`smlt run --local` (and `--watch`), `smlt resume --local`: on the local engine."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from smlt.paths import out_folder
from smlt.runtime.errors import InvalidJob

from .cloud import add_code_flag


def add_run(sub: Any) -> None:
    run = sub.add_parser("run", help="run a training job (with --local: on this machine, no AWS account)")
    run.add_argument("job", nargs="?", help="job file (JSON); optional with --watch")
    run.add_argument("--local", action="store_true", help="run the synthesized state machine on the local engine")
    run.add_argument(
        "--out",
        type=Path,
        help="folder for model.safetensors, metrics.json, report.png, history.json and the run's saved state "
        "(default: out/, or out/RUN_ID/ when out/ holds another run's outputs)",
    )
    run.add_argument(
        "--replace",
        action="store_true",
        help="discard a saved state of the same run id in --out and start over (without it such a run is refused)",
    )
    run.add_argument(
        "--faults",
        help='inject faults, e.g. "fail=0.2,duplicate=0.05,s3_conflict=0.1,ddb_conflict=0.1,seed=1" '
        "(also throttle, timeout; s3_slowdown, ddb_throttle: S3's 503 SlowDown and DynamoDB's throttling per request; kill and crash: a control step's process dies after its work or after one "
        "of its writes; store_outage=SECONDS; seed: by default derived from the job's seed)",
    )
    run.add_argument(
        "--watch",
        help="folder to watch: a manifest, or the _SUCCESS marker of raw data, landing under incoming/<pipeline>/<version>/ "
        "starts a retraining run",
    )
    run.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    add_concurrency_flag(run)
    add_code_flag(run)
    run.set_defaults(fn=run_command)


def add_concurrency_flag(cmd: Any) -> None:
    cmd.add_argument(
        "--concurrency",
        type=int,
        help="the local account's Lambda concurrency limit (a new AWS account: 10); invocations beyond it "
        "are throttled as Lambda throttles them (default 1000)",
    )


def set_concurrency(args: argparse.Namespace) -> None:
    """--concurrency N: the engine's handlers (and its GetAccountSettings) hold to N (smlt.local.throttle)."""
    if getattr(args, "concurrency", None) is None:
        return
    from smlt.local import throttle

    if args.concurrency < 1:
        raise InvalidJob(f"--concurrency: at least 1, got {args.concurrency}")
    os.environ[throttle.ENV] = str(args.concurrency)


def run_command(args: argparse.Namespace) -> int:
    if not args.local:
        print("error: `smlt run` needs --local (use `smlt start` for a deployed stack)", file=sys.stderr)
        return 2
    set_concurrency(args)
    if args.watch:
        if args.out is not None:
            out_folder(Path(args.out))
        if args.code:
            raise InvalidJob("--code: not with --watch (runs started by uploads carry no code)")
        from smlt.runner import start_engine
        from smlt.watch import watch_folder

        engine, names, _ = start_engine(args.faults)
        try:
            watch_folder(engine, names, Path(args.watch), args.out or Path("out"))
        finally:
            engine.stop()
        return 0
    if not args.job:
        raise InvalidJob("job: give a job file (or --watch DIR)")
    from smlt import api

    api.train(Path(args.job), local=True, out=args.out, code=args.code, faults=args.faults, replace=args.replace)
    return 0


def resume(args: argparse.Namespace) -> int:
    from smlt.runner import resume_local

    if args.out is not None:
        out_folder(Path(args.out))
    resume_local(args.run, Path(args.out), faults=args.faults)
    return 0


def add_console(sub: Any) -> None:
    """`smlt local up` / `smlt local down`: a local engine kept running (smlt/console.py)."""
    from smlt.console import DEFAULT_PORT, DEFAULT_STACK

    loc = sub.add_parser("local", help="a local console: the stack on this machine, kept running")
    cmds = loc.add_subparsers(dest="local_cmd", required=True)
    up = cmds.add_parser("up", help="start the local console and print its endpoint and the stack's outputs")
    down = cmds.add_parser("down", help="stop the local console (its state is saved for the next `up`)")
    for c in (up, down):
        c.add_argument("--state", type=Path, help="the console's state folder (default: ~/.cache/smlt/console)")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the endpoint's port (default {DEFAULT_PORT})")
    up.add_argument(
        "--stack", default=DEFAULT_STACK, help=f"the stack name its outputs go by (default {DEFAULT_STACK})"
    )
    up.add_argument("--foreground", action="store_true", help="serve in this process until Ctrl-C")
    add_concurrency_flag(up)
    up.set_defaults(fn=console_up)
    down.set_defaults(fn=console_down)


def console_up(args: argparse.Namespace) -> int:
    from smlt import console
    from smlt.runtime.progress import notice

    state = args.state or console.default_state_dir()
    set_concurrency(args)  # the console's process inherits it
    if args.foreground:
        console.serve(state, args.port, args.stack)
        return 0
    for line in console.up(state, args.port, args.stack).lines():
        notice.info(line)
    return 0


def console_down(args: argparse.Namespace) -> int:
    from smlt import console
    from smlt.runtime.progress import notice

    state = args.state or console.default_state_dir()
    info = console.down(state)
    notice.info(f"smlt local console stopped (pid {info.pid}); state kept in {state}")
    return 0
