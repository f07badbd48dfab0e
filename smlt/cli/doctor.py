"""`smlt doctor`: the account's Lambda limits against what the stack would run, before a run.

Reads the account's Lambda concurrency (GetAccountSettings) and, when the stack is deployed, its
planner's settings (the deployed tiers and `max_concurrency`), and says what a run can use and
what to raise. Exit 0: nothing blocks a run; 1: something will (a limit below what a run needs).
A read the user's credentials may not make (AccessDenied) is not a blocker: the report says what
it could not check, which IAM action on which resource that took, and goes on with the rest.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from smlt.aws_errors import aws_not_configured, denied_message
from smlt.runtime import account, clients, deployed
from smlt.runtime.errors import AwsNotConfigured
from smlt.runtime.progress import notice

STANDARD_LIMIT = 1000
LARGE_TIER_MB = 3008  # the memory quota of a reduced account: larger tiers fail the deploy


def add_command(sub: Any) -> None:
    doc = sub.add_parser("doctor", help="check the account's Lambda limits against what runs need")
    doc.add_argument("--stack", default="Smlt", help="the deployed stack to check (default Smlt)")
    doc.set_defaults(fn=doctor)


class NotChecked(Exception):
    """A read the credentials may not make: what it would have checked and AWS's refusal."""


def _denied(e: ClientError, what: str, resource: str) -> NotChecked | None:
    said = denied_message(e, resource)
    return NotChecked(f"not checked: {what}: {said}") if said is not None else None


def _planner_env(stack: str, cfn: Any, lam: Any) -> dict[str, str] | None:
    """The deployed planner's environment (its tiers, max_concurrency), or None without the stack."""
    try:
        res = cfn.describe_stack_resources(StackName=stack)["StackResources"]
    except ClientError as e:
        raise _denied(e, f"stack {stack!r}'s deployed tiers and max_concurrency", f"stack {stack}") or e from None
    fn = next(
        (
            r["PhysicalResourceId"]
            for r in res
            if r["ResourceType"] == "AWS::Lambda::Function" and r["LogicalResourceId"].startswith("FunctionsPlanner")
        ),
        None,
    )
    if fn is None:
        return None
    try:
        return lam.get_function_configuration(FunctionName=fn).get("Environment", {}).get("Variables", {})
    except ClientError as e:
        raise _denied(e, f"stack {stack!r}'s deployed tiers and max_concurrency", f"function {fn}") or e from None


def check(stack: str, lam: Any = None, cfn: Any = None) -> tuple[list[str], bool]:
    """(report lines, ok)."""
    unchecked: list[str] = []
    limits: account.AccountLimits | None = None
    env: dict[str, str] | None = None
    stack_read = False
    try:
        lam = lam or clients.make("lambda")
        cfn = cfn or clients.make("cloudformation")
        try:
            limits = account.read_limits(lam)
        except ClientError as e:
            denied = _denied(e, "the account's Lambda concurrency", "*")
            if denied is None:
                raise
            unchecked.append(str(denied))
        try:
            env = _planner_env(stack, cfn, lam)
            stack_read = True
        except NotChecked as e:
            unchecked.append(str(e))
        except ClientError:
            env = None  # no such stack: what cdk.json would deploy
            stack_read = True
    except (ClientError, BotoCoreError) as e:
        raise aws_not_configured(e) or AwsNotConfigured(f"cannot read the account's Lambda settings: {e}") from None
    if limits is None:
        lines = [*unchecked]
        if stack_read:
            lines.append(_stack_line(stack, env)[0])
        lines.append(
            "the account's limits are not known: nothing above says whether a run fits (run `smlt doctor` with "
            "credentials that may lambda:GetAccountSettings)"
        )
        return lines, True
    return _report(stack, limits, env, unchecked, stack_read)


def _stack_line(stack: str, env: dict[str, str] | None) -> tuple[str, list[int], int]:
    if env is None:
        tiers = list(deployed.value("memory_tiers"))
        max_conc = int(deployed.value("max_concurrency"))
        return (
            f"stack {stack!r}: no planner function found (not deployed?); cdk.json deploys tiers {tiers}, "
            f"max_concurrency {max_conc}",
            tiers,
            max_conc,
        )
    tiers = sorted(int(mb) for mb in json.loads(env.get("SMLT_TRAIN_FUNCTIONS", "{}")))
    max_conc = int(env.get("SMLT_MAX_CONCURRENCY", deployed.value("max_concurrency")))
    return f"stack {stack!r}: tiers {tiers} MB, max_concurrency {max_conc}", tiers, max_conc


def _report(
    stack: str, limits: account.AccountLimits, env: dict[str, str] | None, unchecked: list[str], stack_read: bool
) -> tuple[list[str], bool]:
    ok = True
    lines = [
        f"Lambda concurrency: {limits.concurrent} per account in this region, "
        f"{limits.unreserved} unreserved (what smlt's functions share)"
    ]
    stack_line, tiers, max_conc = _stack_line(stack, env)
    if stack_read:
        lines.append(stack_line)
    else:  # checked below against what cdk.json deploys
        lines += [*unchecked, f"  checking against what cdk.json deploys: tiers {tiers}, max_concurrency {max_conc}"]
    slots = account.worker_slots(max_conc, limits.unreserved)
    lines.append(f"a round runs at most {slots} workers at once (the planner plans within it)")
    if limits.unreserved < max_conc:
        lines.append(
            f"  the account, not max_concurrency, is the limit: a job pinning more than {slots} workers "
            f"is refused (ConcurrencyLimit); to run more, {account.raise_hint(max_conc + 2)}"
        )
    if limits.concurrent < STANDARD_LIMIT:
        big = [mb for mb in tiers if mb > LARGE_TIER_MB]
        lines.append(
            f"  a reduced account (below the standard {STANDARD_LIMIT}): its function memory quota is likely "
            f"{LARGE_TIER_MB} MB"
        )
        if big:
            ok = False
            lines.append(
                f"  tiers {big} exceed it: the deploy fails; deploy with -c memory_tiers='[1769,3008]' or ask "
                "AWS Support for a memory quota of 10,240 MB (docs/deploy.md)"
            )
    if limits.unreserved < 2:
        ok = False
        lines.append("  fewer than 2 unreserved executions: a round's planner and worker cannot both run")
    return lines, ok


def doctor(args: argparse.Namespace) -> int:
    lines, ok = check(args.stack)
    for line in lines:
        notice.info(line)
    return 0 if ok else 1
