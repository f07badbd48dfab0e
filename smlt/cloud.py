"""Commands against a deployed stack: start, status, fetch, resume (the CLI's `smlt start` ...).

The stack's outputs (CloudFormation) name the state machine, buckets and table, so a user only
gives the stack name (default "Smlt"). AWS credentials and region come from the usual places.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from smlt import stack_outputs
from smlt.aws_errors import aws_not_configured, denied_message
from smlt.code_imports import describe, foreign_imports
from smlt.datasets import checked_dataset_folder, upload_dataset
from smlt.jobfile import read_job_file
from smlt.outputs import fetch_outputs, progress_line
from smlt.runtime import clients, retry
from smlt.runtime.errors import (
    AccessDenied,
    AlreadyFinished,
    InvalidCode,
    InvalidJob,
    RunInProgress,
    RunNotFinished,
    RunNotFound,
    StackNotFound,
    Throttled,
    after_failure,
)
from smlt.runtime.evaluation import class_warning, summary_text
from smlt.runtime.items import ErrorItem, MetaItem
from smlt.runtime.progress import notice
from smlt.runtime.records import RunTable
from smlt.runtime.store import S3Store
from smlt.runtime.usercode import check_shipped, entry_points, package_code, stage_code, with_code

OUTPUTS = stack_outputs.REQUIRED
T = TypeVar("T")

# Step Functions serves each API action from a token bucket per account and Region, shared with
# every other caller (docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html, "Quotas
# related to API action throttling"); past it, HTTP 400 ThrottlingException. botocore's standard
# mode retries a request 5 times within seconds (smlt.runtime.clients); a read still throttled
# then is asked again after a longer, jittered pause (2 s doubling, up to 30 s, 5 times): a poll
# waits for the bucket rather than failing the command.
POLL_ATTEMPTS, POLL_BASE_S, POLL_CAP_S = 5, 2.0, 30.0


def sfn_throttled(e: BaseException) -> bool:
    """Whether `e` is Step Functions' answer to a request beyond its API action's bucket."""
    return isinstance(e, ClientError) and e.response.get("Error", {}).get("Code") in retry.SFN_THROTTLES


def polled(call: Callable[..., T], /, **kw: Any) -> T:
    """`call(**kw)`, a Step Functions read, asked again after a pause while it stays throttled
    (POLL_ATTEMPTS in all); the last throttle propagates."""
    for attempt in range(1, POLL_ATTEMPTS + 1):
        try:
            return call(**kw)
        except ClientError as e:
            if not sfn_throttled(e) or attempt == POLL_ATTEMPTS:
                raise
        time.sleep(retry.backoff_s(attempt, POLL_BASE_S, POLL_CAP_S))
    raise AssertionError("unreachable")  # the loop returns or raises


def _start_throttled(e: ClientError, what: str, again: str) -> Throttled:
    retries = int(e.response.get("ResponseMetadata", {}).get("RetryAttempts", 0))
    return Throttled(
        f"Step Functions StartExecution of {what} stayed throttled (ThrottlingException) after botocore's "
        f"{retries} {'retry' if retries == 1 else 'retries'}: the account's StartExecution bucket (per Region, "
        "shared with every run, study and console in the account) is empty, and this request started nothing. "
        f"Run `{again}` again in a minute, or ask for a higher Step Functions quota through Service Quotas"
    )


def start_execution(sfn: Any, what: str, again: str, **kw: Any) -> str:
    """StartExecution, named `Throttled` when it stays throttled (not polled again: a start is the
    user's to repeat, and botocore's retries already spent seconds)."""
    try:
        return str(sfn.start_execution(**kw)["executionArn"])
    except ClientError as e:
        if sfn_throttled(e):
            raise _start_throttled(e, what, again) from None
        raise


@dataclass
class Stack:
    state_machine_arn: str
    artifacts_bucket: str
    data_bucket: str
    table: str

    @classmethod
    def lookup(cls, name: str, cfn=None) -> Stack:
        """The stack's outputs: every command's first AWS call, so it also names a missing region
        or missing credentials (AwsNotConfigured)."""
        try:
            cfn = cfn or clients.make("cloudformation")
            outputs = cfn.describe_stacks(StackName=name)["Stacks"][0].get("Outputs", [])
        except (NoRegionError, NoCredentialsError, PartialCredentialsError, EndpointConnectionError) as e:
            raise aws_not_configured(e) or e from None
        except ClientError as e:
            denied = denied_message(e, f"stack {name}")
            if denied is not None:  # the stack may well be there: these credentials may not see it
                raise AccessDenied(denied) from None
            raise StackNotFound(
                f"stack {name!r} not found in {cfn.meta.region_name} ({e.response['Error']['Message']}); "
                "deploy it with `npx cdk deploy`, pass --stack, or set AWS_REGION to the region it is deployed in"
            ) from None
        found = {OUTPUTS[o["OutputKey"]]: o["OutputValue"] for o in outputs if o["OutputKey"] in OUTPUTS}
        missing = sorted(set(OUTPUTS.values()) - set(found))
        if missing:
            raise StackNotFound(f"stack {name!r} lacks outputs {missing}; is it an smlt stack?")
        return cls(**found)


def start(job_path: Path, stack: Stack | str, sfn=None, code: Path | None = None) -> str:
    """Start a run from a job file (with the user's code from `code`, a folder); `stack` is looked
    up by name after the job, its local dataset and the code are checked (a bad job needs no AWS access)."""
    job, raw = read_job_file(job_path)
    folder = checked_dataset_folder(job, base=job_path.parent)
    package = package_code(code) if code is not None else None
    if package is None:
        check_shipped(job)  # the image holds no user code: say so now, not from every worker
    elif foreign := foreign_imports(package.data, [n for _, n in entry_points(job)]):
        raise InvalidCode(f"code: {describe(foreign)}")
    stack = Stack.lookup(stack) if isinstance(stack, str) else stack
    if folder is not None:
        raw["dataset"]["uri"] = upload_dataset(folder, stack.data_bucket)
    if package is not None:
        raw = with_code(raw, stage_code(package, stack.artifacts_bucket))
    run_id = job.run_id or f"{re.sub(r'[^A-Za-z0-9-]', '-', job.name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    sfn = sfn or clients.make("stepfunctions")
    if job.run_id:
        meta = RunTable(stack.table, run_id).meta()
        if meta is not None and meta.status == "SUCCEEDED":
            raise AlreadyFinished(f"run_id: run {run_id!r} has finished; choose another run_id to train again")
        if meta is not None:
            refuse_live(run_id, meta, stack, sfn)
    name = run_id if not job.run_id else f"{run_id[:68]}-{int(time.time())}"
    arn = start_execution(
        sfn,
        f"run {run_id}",
        f"smlt start {job_path}",
        stateMachineArn=stack.state_machine_arn,
        name=name,
        input=json.dumps(raw),
    )
    region = arn.split(":")[3]
    notice.info(
        f"started run {run_id}\n  execution: {arn}\n  console:   "
        f"https://{region}.console.aws.amazon.com/states/home?region={region}#/v2/executions/details/{arn}"
    )
    return run_id


def _execution_end(stack: Stack, meta: MetaItem, sfn=None) -> tuple[str, str, str] | None:
    """(status, error, cause) of the execution that drives the run when it ended without success
    (the error a worker, the planner or the aggregator raised); None while it runs."""
    sfn = sfn or clients.make("stepfunctions")
    arn = stack.state_machine_arn.replace(":stateMachine:", ":execution:") + ":" + meta.execution
    try:
        desc = polled(sfn.describe_execution, executionArn=arn)
    except sfn.exceptions.ExecutionDoesNotExist:
        return None
    if desc["status"] in ("RUNNING", "PENDING_REDRIVE", "SUCCEEDED"):
        return None
    cause = desc.get("cause", "")
    try:
        cause = json.loads(cause).get("errorMessage", cause)
    except (ValueError, AttributeError):
        pass
    return desc["status"], desc.get("error", ""), cause


def status(run_id: str, stack: Stack, sfn=None, resume_command: str = "") -> MetaItem:
    """Reports every round of the run and its status; returns the run's META item. A run whose
    execution failed is told to be started again when a resume would meet the same error (the
    CLI's own list, `errors.START_AGAIN`), else the command that resumes it (`resume_command`,
    by default `smlt resume RUN`)."""
    table = RunTable(stack.table, run_id)
    meta = table.meta()
    if meta is None:
        raise RunNotFound(f"no run {run_id!r} in table {stack.table}: check the run id (`smlt start` prints it)")
    reasons = {p.round: p.reason for p in table.plans()}
    for r in table.rounds():
        notice.info(progress_line(r, target=meta.job.training.target_metric) + f" | {reasons.get(r.round, '')}")
    for item in table.query("ERROR#"):  # every worker error recorded (type, message, worker, shard, round)
        e = ErrorItem.model_validate(item)
        where = f" on {e.shard.split} shard {e.shard.key or e.shard.index}" if e.shard else ""
        first = e.message.splitlines()[0] if e.message else ""
        notice.info(f"  round {e.round} worker {e.worker}: {e.error}{where}: {first}")
    try:
        ended = _execution_end(stack, meta, sfn) if meta.status != "SUCCEEDED" else None
    except ClientError as e:
        if not sfn_throttled(e):
            raise
        ended = None  # the run's own items tell its status; only the execution's error is unread
        notice.warning(
            f"  Step Functions throttled DescribeExecution of {meta.execution} through {POLL_ATTEMPTS} tries "
            "(the account's bucket is shared): the status below is the run's own; run `smlt status` again for "
            "the execution's error, if it failed"
        )
    if ended is not None:
        state, error, cause = ended
        notice.info(f"run {run_id}: {state}: {error}\n  cause: {cause}")
        told = after_failure(error, str(cause), resume_command or f"smlt resume {run_id}")
        if told is not None:
            notice.info(f"  {told}")
        return meta
    notice.info(f"run {run_id}: {meta.status}")
    if meta.final:
        f = meta.final
        notice.info(f"  final: {summary_text(f.model_dump())}, {f.rounds} rounds, ${f.estimated_cost_usd:.5f}")
        warning = class_warning(f.model_dump())
        if warning:
            notice.warning(f"  {warning}")
    return meta


def succeeded(run_id: str, stack: Stack) -> MetaItem:
    """The run's META when it succeeded, else RunNotFound or RunNotFinished: a run whose Finalize
    failed (PartialData: metrics.json and final/model.safetensors written, then the run refused)
    has a final model in the bucket that is not the run's result."""
    meta = RunTable(stack.table, run_id).meta()
    if meta is None:
        raise RunNotFound(f"no run {run_id!r} in table {stack.table}: check the run id (`smlt start` prints it)")
    if meta.status != "SUCCEEDED":
        raise RunNotFinished(
            f"run {run_id} did not succeed (it is {meta.status}: still running, or it failed; a model it "
            f"stored is not its result): see `smlt status {run_id}`"
        )
    return meta


def fetch(run_id: str, stack: Stack, out: Path, sfn=None) -> dict:
    """Download a finished run's outputs into ``out``; returns its final metrics."""
    succeeded(run_id, stack)
    sfn = sfn or clients.make("stepfunctions")
    history = []
    try:
        for ex in pages(sfn.list_executions, "executions", stateMachineArn=stack.state_machine_arn):
            if ex["name"] == run_id or ex["name"].startswith(run_id[:66] + "-"):
                history += [
                    {"execution": ex["executionArn"], **e}
                    for e in pages(sfn.get_execution_history, "events", executionArn=ex["executionArn"])
                ]
    except ClientError as e:
        if not sfn_throttled(e):
            raise
        raise Throttled(
            f"run {run_id}: Step Functions throttled {e.operation_name} through {POLL_ATTEMPTS} tries (the account's "
            f"bucket is shared); nothing was written to {out}: run `smlt fetch {run_id}` again in a minute"
        ) from None
    metrics = fetch_outputs(S3Store(stack.artifacts_bucket), run_id, out, history)
    notice.info(f"fetched run {run_id} ({metrics['final']['rounds']} rounds) into {out}/")
    return metrics


def pages(call: Callable[..., dict], key: str, **kw: Any) -> list[dict]:
    """Every item under `key` of a paged Step Functions read, each page `polled` (a throttled page
    is asked again, not the whole listing)."""
    items: list[dict] = []
    token: str | None = None
    while True:
        page = polled(call, **kw, **({"nextToken": token} if token else {}))
        items += page[key]
        token = page.get("nextToken")
        if not token:
            return items


def refuse_live(run_id: str, meta: MetaItem, stack: Stack, sfn) -> None:
    """RunInProgress when the execution that drives the run (META's) is still running: a second
    execution would end at its first Plan anyway (one driver per run), so none is started."""
    arn = stack.state_machine_arn.replace(":stateMachine:", ":execution:") + ":" + meta.execution
    try:
        status = polled(sfn.describe_execution, executionArn=arn)["status"]
    except sfn.exceptions.ExecutionDoesNotExist:
        return
    except ClientError as e:
        if not sfn_throttled(e):
            raise
        raise Throttled(
            f"run {run_id}: Step Functions throttled DescribeExecution of {meta.execution} through {POLL_ATTEMPTS} "
            "tries (the account's bucket is shared), so whether it still runs is unknown and nothing was started; "
            "run the same command again in a minute"
        ) from None
    if status in ("RUNNING", "PENDING_REDRIVE"):
        raise RunInProgress(
            f"run {run_id} is still running (execution {meta.execution}): follow it with `smlt status {run_id}`, "
            "or stop that execution before resuming"
        )


def resume(run_id: str, stack: Stack, sfn=None) -> str:
    meta = RunTable(stack.table, run_id).meta()
    if meta is None:
        raise RunNotFound(f"no run {run_id!r} in table {stack.table}: check the run id (`smlt start` prints it)")
    if meta.status == "SUCCEEDED":
        raise InvalidJob(f"run_id: run {run_id!r} already finished")
    sfn = sfn or clients.make("stepfunctions")
    refuse_live(run_id, meta, stack, sfn)
    name = f"{run_id[:60]}-resume-{int(time.time())}"
    arn = start_execution(
        sfn,
        f"the resume of run {run_id}",
        f"smlt resume {run_id}",
        stateMachineArn=stack.state_machine_arn,
        name=name,
        input=json.dumps({**meta.job.model_dump(mode="json"), "run_id": run_id}),
    )
    done = len(RunTable(stack.table, run_id).rounds())
    notice.info(f"resuming run {run_id} after {done} complete rounds: {arn}")
    return arn
