"""`smlt verify RUN`: the independent reconciliation (`smlt.reconcile`) of a run on the deployed
stack, or with --local of a local run from its saved state in --out. Exit 0 when nothing is lost,
counted twice or different from its recomputation, else 1."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from smlt.runtime.progress import notice


def add_command(sub: Any) -> None:
    c = sub.add_parser(
        "verify", help="check a run's stored updates, ledgers and models, independently of the aggregator"
    )
    c.add_argument("run")
    c.add_argument("--stack", default="Smlt", help="CloudFormation stack name (default: Smlt)")
    c.add_argument("--json", action="store_true", help="print the whole result as JSON")
    c.add_argument("--local", action="store_true", help="a local run: read its saved state in --out")
    c.add_argument("--out", type=Path, default=Path("out"), help="with --local: the run's output folder")
    c.set_defaults(fn=verify)


def verify(args: argparse.Namespace) -> int:
    from smlt.reconcile import Reconciliation

    result: Reconciliation
    if args.local:
        from smlt.reconcile import reconcile_saved

        result = reconcile_saved(args.out, args.run)
    else:
        result = _deployed(args)
    if args.json:
        notice.info(result.model_dump_json(indent=2))
    for f in result.findings:
        notice.warning(f"round {f.round}: {f.kind}{'' if f.worker is None else f' (worker {f.worker})'}: {f.detail}")
    excused = sum(len(r.excused) for r in result.rounds)
    if result.pending:  # updates of rounds after the last aggregated one: in flight, or never aggregated
        notice.warning(
            f"run {args.run}: update objects of round(s) {', '.join(map(str, result.pending))} after the last "
            "aggregated round, not reconciled (a round in flight, or one the run never aggregated)"
        )
    # the rounds as `smlt run` counts them: aggregated rounds, and those trained into the final model
    said = result.said
    applied = sum(len(r.applied) for r in result.rounds)  # ledger entries, each checked against its object and record
    if result.ok:
        notice.info(
            f"run {args.run}: {said} reconciled, nothing lost or counted twice "
            f"({applied} updates applied, {excused} excused)"
        )
        return 0
    notice.warning(f"run {args.run}: {len(result.findings)} finding(s) in {said}")
    return 1


def _deployed(args: argparse.Namespace) -> Any:
    from smlt import cloud as remote
    from smlt.reconcile import reconcile
    from smlt.runtime import clients
    from smlt.runtime.errors import RunNotFound
    from smlt.runtime.records import RunTable

    stack = remote.Stack.lookup(args.stack)
    if RunTable(stack.table, args.run).meta() is None:
        raise RunNotFound(f"no run {args.run!r} in table {stack.table}: check the run id (`smlt start` prints it)")
    return reconcile(clients.make("s3"), clients.make("dynamodb"), stack.artifacts_bucket, stack.table, args.run)
