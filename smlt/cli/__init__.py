"""The `smlt` command line: argument parsing, the lines users see, exit codes.

The library reports progress through :mod:`smlt.runtime.progress`'s loggers and fails with the named
errors of :mod:`smlt.runtime.errors`; this package prints the first (:mod:`smlt.cli.console`) and turns
the second into messages and exit codes (:func:`main`). One module per command group:
:mod:`.local` (run / resume --local, --watch), :mod:`.cloud` (start, status, fetch, resume on a
deployed stack), :mod:`.data` (data prepare), :mod:`.models` (a retraining pipeline's versions),
:mod:`.verify` (verify: a run's reconciliation), :mod:`.model` (predict, export, model: a run's model),
:mod:`.quote` (quote: a job's forecast before any spend); :mod:`.model` also has track (a run to MLflow).
"""

from __future__ import annotations

import argparse
import sys

from smlt.extras import MissingExtra
from smlt.local.errors import MotoVersionError
from smlt.local.limits import LimitError
from smlt.local.resolve import UnresolvableError
from smlt.local.synth import SynthError
from smlt.runtime.errors import (
    AwsNotConfigured,
    RunFailed,
    RunNotFinished,
    RunNotFound,
    SmltError,
    StackNotFound,
    StudyFailed,
    after_failure,
)
from smlt.tracking import TrackingFailed

from . import cloud, dashboard, data, doctor, local, model, models, quote, tune, verify
from .cloud import resume_command
from .console import console, reader_gone, stdout_closed


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="smlt", description="Serverless, adaptive ML training on AWS Lambda.")
    sub = p.add_subparsers(dest="cmd", required=True)
    local.add_run(sub)
    local.add_console(sub)
    cloud.add_commands(sub)
    res = sub.add_parser("resume", help="continue a run from its last complete round")
    res.add_argument("run")
    res.add_argument("--local", action="store_true", help="resume a local run from OUT/.state")
    res.add_argument("--out", default="out", help="with --local: the run's output folder")
    res.add_argument("--stack", default="Smlt")
    res.add_argument("--faults")
    res.add_argument("--quiet", action="store_true")
    res.set_defaults(fn=lambda args: local.resume(args) if args.local else cloud.resume(args))
    data.add_commands(sub)
    models.add_commands(sub)
    verify.add_command(sub)
    tune.add_command(sub)
    dashboard.add_command(sub)
    model.add_commands(sub)
    doctor.add_command(sub)
    quote.add_command(sub)
    return p


# The command could not do its work (exit 1); any other named error is the user's input (exit 2).
_COULD_NOT = (StackNotFound, RunNotFinished, RunNotFound, AwsNotConfigured, StudyFailed, TrackingFailed, MissingExtra)
# The local engine's own errors: it could not start or run the synthesized stack (exit 1), but
# LimitError, a Step Functions quota applied to the user's input (exit 2).
_ENGINE = (MotoVersionError, SynthError, UnresolvableError)


def _failed(e: Exception, args: argparse.Namespace | None = None) -> int:
    """The message and exit code of a named error."""
    if isinstance(e, RunFailed):
        print(f"run {e.run_id} {e.status}: {e.error}", file=sys.stderr)
        print(f"  cause: {e.cause}", file=sys.stderr)
        told = after_failure(e.error, str(e.cause), resume_command(e.run_id, args))
        if told is not None:
            print(f"  {told}", file=sys.stderr)
        return 1
    if isinstance(e, _COULD_NOT):
        print(f"error: {e}", file=sys.stderr)
        return 1
    if isinstance(e, _ENGINE):
        print(f"error: the local engine: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"error: {type(e).__name__}: {e}", file=sys.stderr)  # the user's input is wrong
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with console(quiet=getattr(args, "quiet", False)):
            code = int(args.fn(args))
            sys.stdout.flush()  # a closed pipe's error here (caught below), not in Python's flush at exit
            return code
    except (SmltError, LimitError, *_ENGINE) as e:
        return _failed(e, args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not stdout_closed():  # another pipe's: not the reader's doing
            raise
        reader_gone(sys.stdout)  # `smlt ... | head`: the reader has what it wanted (smlt.cli.console)
        return 0
    except Exception as e:
        from smlt.aws_errors import cli_message

        told = cli_message(e)
        if told is None:
            raise
        print(f"error: {told}", file=sys.stderr)
        return 1
