"""The `smlt` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from smlt.errors import SmltError


def _cmd_run(args) -> int:
    if not args.local:
        print("error: `smlt run` needs --local (use `smlt start` for a deployed stack)", file=sys.stderr)
        return 2
    from smlt.runner import run_local

    return run_local(
        Path(args.job) if args.job else None,
        Path(args.out),
        faults=args.faults,
        watch=Path(args.watch) if args.watch else None,
        quiet=args.quiet,
    )


def _cmd_prepare(args) -> int:
    from smlt.data.prepare import prepare_dataset

    m = prepare_dataset(
        args.source,
        args.out,
        shards=args.shards,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        label=args.label,
        task=args.task,
        name=args.name,
    )
    print(
        f"prepared {m.name}: {m.train.rows} train rows in {len(m.train.shards)} shards, "
        f"{m.validation.rows} validation rows, {m.features} features, {m.outputs} "
        f"{'classes' if m.task == 'classification' else 'outputs'} -> {args.out}"
    )
    return 0


def _cmd_start(args) -> int:
    from smlt.cloud import Stack, start

    start(Path(args.job), Stack.lookup(args.stack))
    return 0


def _cmd_status(args) -> int:
    from smlt.cloud import Stack, status

    return status(args.run, Stack.lookup(args.stack))


def _cmd_fetch(args) -> int:
    from smlt.cloud import Stack, fetch

    return fetch(args.run, Stack.lookup(args.stack), Path(args.out or f"out/{args.run}"))


def _cmd_resume(args) -> int:
    if args.local:
        from smlt.runner import resume_local

        return resume_local(args.run, Path(args.out), faults=args.faults, quiet=args.quiet)
    from smlt.cloud import Stack, resume

    resume(args.run, Stack.lookup(args.stack))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="smlt", description="Serverless, adaptive ML training on AWS Lambda.")
    sub = p.add_subparsers(dest="cmd", required=True)

    run = sub.add_parser("run", help="run a training job (with --local: on this machine, no AWS account)")
    run.add_argument("job", nargs="?", help="job file (JSON); optional with --watch")
    run.add_argument("--local", action="store_true", help="run the synthesized state machine on the local engine")
    run.add_argument(
        "--out", default="out", help="folder for model.safetensors, metrics.json, report.png, history.json"
    )
    run.add_argument("--faults", help='inject faults into worker invocations, e.g. "fail=0.2,duplicate=0.05"')
    run.add_argument("--watch", help="folder to watch: a manifest landing under incoming/ starts a retraining run")
    run.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    run.set_defaults(fn=_cmd_run)

    for name, fn, helptext in (
        ("start", _cmd_start, "start a run on the deployed stack from a job file"),
        ("status", _cmd_status, "progress of a run on the deployed stack"),
        ("fetch", _cmd_fetch, "download a finished run's model, metrics, report and history"),
    ):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("job" if name == "start" else "run")
        c.add_argument("--stack", default="Smlt", help="CloudFormation stack name (default: Smlt)")
        if name == "fetch":
            c.add_argument("--out", help="folder (default: out/RUN)")
        c.set_defaults(fn=fn)

    res = sub.add_parser("resume", help="continue a run from its last complete round")
    res.add_argument("run")
    res.add_argument("--local", action="store_true", help="resume a local run from OUT/.state")
    res.add_argument("--out", default="out", help="with --local: the run's output folder")
    res.add_argument("--stack", default="Smlt")
    res.add_argument("--faults")
    res.add_argument("--quiet", action="store_true")
    res.set_defaults(fn=_cmd_resume)

    data = sub.add_parser("data", help="dataset tools").add_subparsers(dest="data_cmd", required=True)
    prep = data.add_parser("prepare", help="shard a CSV, NPZ, sklearn:NAME or synthetic:... dataset")
    prep.add_argument("source")
    prep.add_argument("--out", required=True, help="local folder or s3://bucket/prefix/")
    prep.add_argument("--shards", type=int, default=16)
    prep.add_argument("--validation-fraction", type=float, default=0.2)
    prep.add_argument("--seed", type=int, default=0)
    prep.add_argument("--label", help="CSV label column (default: the last)")
    prep.add_argument("--task", choices=["classification", "regression"])
    prep.add_argument("--name")
    prep.set_defaults(fn=_cmd_prepare)

    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except SmltError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
