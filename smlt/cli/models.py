"""`smlt models list|promote|rollback PIPELINE`: a retraining pipeline's versions and its champion
(smlt.runtime.pipeline), on a deployed stack or the local console (the stack's artifacts bucket)."""

from __future__ import annotations

import argparse
import getpass
from typing import Any


def add_commands(sub: Any) -> None:
    models = sub.add_parser("models", help="a retraining pipeline's versions, promotion and rollback")
    cmds = models.add_subparsers(dest="models_cmd", required=True)
    for name, fn, helptext in (
        (
            "list",
            list_versions,
            "every version: its run, metrics, cost, whether the gate promoted it, and its run's class warning",
        ),
        ("promote", promote, "make VERSION's model the champion (the model served and warm-started from)"),
        ("rollback", rollback, "make the champion before the current one the champion again"),
    ):
        c = cmds.add_parser(name, help=helptext)
        c.add_argument("pipeline")
        if name == "promote":
            c.add_argument("version")
        c.add_argument("--stack", default="Smlt", help="CloudFormation stack name (default: Smlt)")
        c.set_defaults(fn=fn)


def _stack(args: argparse.Namespace) -> Any:
    from smlt import cloud as remote

    return remote.Stack.lookup(args.stack)


def _artifacts(args: argparse.Namespace) -> Any:
    from smlt.runtime.store import S3Store

    return S3Store(_stack(args).artifacts_bucket)


def _run_status(stack: Any, run_id: str) -> str:
    """A version still "training" as its run is now: starting, running, or how the execution
    that created it ended (failed, timed_out, aborted)."""
    from smlt.runtime import clients
    from smlt.runtime.records import RunTable

    meta = RunTable(stack.table, run_id).meta()
    if meta is None:
        return "starting"
    arn = stack.state_machine_arn.replace(":stateMachine:", ":execution:") + ":" + meta.execution
    try:
        status = clients.make("stepfunctions").describe_execution(executionArn=arn)["status"]
    except Exception:  # noqa: BLE001 - an execution AWS no longer keeps (90 days): the run's own word
        return "running"
    return status.lower() if status in ("FAILED", "TIMED_OUT", "ABORTED") else "running"


# Failed executions looked at for uploads that never became a version (newest first).
FAILED_LOOKED_AT = 200


def _failed_uploads(stack: Any, pipeline: str, recorded: dict[str, float]) -> list[tuple[str, Any, str]]:
    """The pipeline's uploads whose execution failed before a version was recorded (prepare refused
    the data, the job was bad) and that no later upload of the same version replaced (`recorded`:
    version -> when its record was made): (version, when, `Error: message`), oldest first. Such an
    upload changes nothing of the pipeline, so only its execution tells; Step Functions keeps them
    90 days."""
    from botocore.exceptions import ClientError

    from smlt.runtime import clients

    sfn = clients.make("stepfunctions")
    pages = sfn.get_paginator("list_executions").paginate(
        stateMachineArn=stack.state_machine_arn,
        statusFilter="FAILED",
        PaginationConfig={"MaxItems": FAILED_LOOKED_AT},
    )
    found: list[tuple[str, Any, str]] = []
    try:
        for page in pages:
            found += _refused(sfn, page["executions"], pipeline, recorded)
    except ClientError as e:  # e.g. no states:ListExecutions for these credentials: the versions still show
        from smlt.runtime.progress import notice

        notice.info(f"uploads refused before training are not shown: listing the stack's executions failed ({e})")
    return sorted(found, key=lambda f: f[1])


def _refused(
    sfn: Any, executions: list[dict[str, Any]], pipeline: str, recorded: dict[str, float]
) -> list[tuple[str, Any, str]]:
    """The executions of a ListExecutions page that are the pipeline's refused uploads."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    from smlt.runtime.errors import InvalidJob
    from smlt.runtime.study.cause import execution_cause
    from smlt.runtime.trigger import upload_of

    with ThreadPoolExecutor(max_workers=8) as pool:  # one DescribeExecution each, 200 at most
        described = list(pool.map(lambda e: sfn.describe_execution(executionArn=e["executionArn"]), executions))
    found = []
    for e, d in zip(executions, described, strict=True):
        try:
            trigger = json.loads(d.get("input") or "{}").get("trigger")
            up = upload_of(trigger) if isinstance(trigger, dict) else None
        except (ValueError, AttributeError, InvalidJob):
            continue  # a run started by hand, not by an upload
        if up is None or up.pipeline != pipeline:
            continue
        if up.version in recorded and recorded[up.version] >= e["startDate"].timestamp():
            continue  # a later upload of the version prepared and trained
        found.append((up.version, e["startDate"], execution_cause(d.get("error"), d.get("cause"))))
    return found


def _value(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def list_versions(args: argparse.Namespace) -> int:
    from smlt.runtime import keys
    from smlt.runtime.pipeline import NoSuchVersion, champion, replaced, versions
    from smlt.runtime.store import S3Store

    stack = _stack(args)
    store = S3Store(stack.artifacts_bucket)
    found = versions(store, args.pipeline)
    failed = _failed_uploads(stack, args.pipeline, {r.version: r.created_at for r in found})
    if not found and not failed:
        raise NoSuchVersion(f"pipeline {args.pipeline} has no version yet (upload one under incoming/{args.pipeline}/)")
    champ = champion(store, args.pipeline)
    if found:
        _print_versions(stack, found, champ, _warnings(store, found), replaced(store, args.pipeline))
    if failed:
        print(f"uploads refused before training (fix them and upload the version's {keys.SUCCESS_MARKER} again):")
        for version, when, cause in failed:
            print(f"  {version:<14}{when:%Y-%m-%d %H:%M}  {cause.splitlines()[0]}")
    return 0


def _warnings(store: Any, found: list[Any]) -> dict[str, str]:
    """Each decided version's class warning (its run's, smlt.runtime.pipeline.run_class_warning),
    by version: two small reads per decided version, in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    from smlt.runtime.pipeline import run_class_warning

    decided = [r for r in found if r.status != "training"]
    with ThreadPoolExecutor(max_workers=8) as pool:
        said = list(pool.map(lambda r: run_class_warning(store, r.run_id), decided))
    return {r.version: w for r, w in zip(decided, said, strict=True) if w}


def _print_versions(
    stack: Any,
    found: list[Any],
    champ: Any,
    warnings: dict[str, str] | None = None,
    earlier: dict[str, list[Any]] | None = None,
) -> None:
    """The versions' table; `warnings`: a version's run's class warning, on a line of its own;
    `earlier`: a version's earlier uploads (replaced by its latest), a line each."""
    warnings, earlier = warnings or {}, earlier or {}
    m = max([14] + [len(r.metric or "-") + 1 for r in found])  # val_balanced_accuracy is 21 long
    print(f"{'':2}{'version':<14}{'status':<10}{'metric':<{m}}{'new':>8}{'champion':>10}{'cost $':>10}  run / reason")
    for r in found:
        mark = "*" if champ and champ.run_id == r.run_id else ""
        cost = "-" if r.cost_usd is None else f"{r.cost_usd:.5f}"
        status = r.status if r.status != "training" else _run_status(stack, r.run_id)
        print(
            f"{mark:<2}{r.version:<14}{status:<10}{r.metric or '-':<{m}}{_value(r.challenger_value):>8}"
            f"{_value(r.champion_value):>10}{cost:>10}  {r.run_id}"
        )
        print(f"{'':26}gen {r.generation}, {r.start}" + (f"; {r.reason}" if r.reason else ""))
        if r.by and r.promoted:
            print(f"{'':26}promoted by {r.by}, model sha256 {(r.model_sha256 or '?')[:12]}")
        if r.version in warnings:
            print(f"{'':26}warning: {warnings[r.version]}")
        for e in earlier.get(r.version, []):
            was = "champion (*), " if champ and champ.run_id == e.run_id else ""
            # a record kept while its run trained (before records were marked so) is replaced too
            status = "replaced" if e.status == "training" else e.status
            print(
                f"{'':26}uploaded again since: the earlier upload's run {e.run_id} ({was}{status}, "
                f"{e.metric or '-'} {_value(e.challenger_value)})"
            )
    if champ is not None:
        print(f"champion (*): {champ.version} (run {champ.run_id}, by {champ.by}) {champ.model}")
    elif found:
        name = found[0].pipeline
        print(
            f"no champion yet ({name}@latest names none): `smlt models promote {name} VERSION` serves a version's model"
        )


def promote(args: argparse.Namespace) -> int:
    from smlt.runtime.pipeline import promote as make_champion

    champ = make_champion(_artifacts(args), args.pipeline, args.version, f"{getpass.getuser()} (smlt models promote)")
    print(f"pipeline {args.pipeline}: champion is {champ.version} (run {champ.run_id}) {champ.model}")
    return 0


def rollback(args: argparse.Namespace) -> int:
    from smlt.runtime.pipeline import rollback as roll_back

    champ = roll_back(_artifacts(args), args.pipeline, f"{getpass.getuser()} (smlt models rollback)")
    print(f"pipeline {args.pipeline}: rolled back, champion is {champ.version} (run {champ.run_id}) {champ.model}")
    return 0
