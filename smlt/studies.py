"""`smlt tune STUDY [--local]`: start the study state machine and follow its trials.

Locally the study runs on the local engine (the same synthesized stack: its study machine starts
the training machine's executions); deployed, through boto3 against the stack's
`StudyStateMachineArn` output. Either way the client only starts one execution and reads the
study's items while it runs: the trials are started, watched and stopped by the state machine.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smlt import stack_outputs
from smlt.datasets import checked_dataset_folder, upload_dataset
from smlt.folderlock import write_atomic
from smlt.outputs import fetch_card, retire_previous, writable_folder, writing
from smlt.runtime import clients
from smlt.runtime.errors import InvalidJob, RunFailed, StackNotFound, StudyFailed
from smlt.runtime.progress import progress
from smlt.runtime.store import S3Store
from smlt.runtime.study.items import StudyItem, StudyTable, TrialItem, best_prefix
from smlt.runtime.study.spec import Study, parse_study

STUDY_OUTPUT = stack_outputs.STUDY_STATE_MACHINE


@dataclass
class Target:
    """Where a study runs: the study machine, the table, the buckets, and the clients to reach them."""

    study_machine_arn: str
    table: str
    artifacts_bucket: str
    data_bucket: str
    sfn: Any
    dynamodb: Any
    s3: Any


def read_study_file(path: Path) -> tuple[Study, dict[str, Any]]:
    """A study file as (validated Study, raw dict), or InvalidJob naming the file and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidJob(f"study: cannot read {path} as UTF-8 text: {e}") from None
    return parse_study(text), json.loads(text)


def stage(study: Study, raw: dict[str, Any], path: Path, target: Target) -> dict[str, Any]:
    """The study with its job's local dataset uploaded (an s3:// dataset is left as it is) and its id set."""
    folder = checked_dataset_folder(study.job, base=path.parent)
    raw = json.loads(json.dumps(raw))
    if folder is not None:
        raw["job"]["dataset"]["uri"] = upload_dataset(folder, target.data_bucket, client=target.s3)
    raw.setdefault("study_id", default_study_id(study))
    return raw


def default_study_id(study: Study) -> str:
    """A study's id when its file names none: its name and the start time."""
    return f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}"[:48]


def _line(tr: TrialItem) -> str:
    metric = "n/a" if tr.metric is None else f"{tr.metric:.4f}"
    params = ", ".join(f"{k.rsplit('.', 1)[-1]}={json.dumps(v)}" for k, v in tr.params.items())
    why = f" | {tr.stop_reason}" if tr.stop_reason and tr.status in ("STOPPED", "SKIPPED", "FAILED") else ""
    return f"  trial {tr.trial:3d} {tr.status:9s} {tr.rounds:3d} rounds  metric {metric}  ${tr.cost_usd:.5f}  {params}{why}"


def follow(target: Target, raw: dict[str, Any], interval: float = 1.0) -> tuple[StudyItem, list[TrialItem]]:
    """Start the study execution, report each trial when its status changes, return the study's
    items once the execution ends; RunFailed when it does not succeed."""
    from smlt.cloud import polled, start_execution

    study_id = raw["study_id"]
    arn = start_execution(
        target.sfn,
        f"study {study_id}",
        "smlt tune STUDY",
        stateMachineArn=target.study_machine_arn,
        name=study_id,
        input=json.dumps(raw),
    )
    progress.info(f"started study {study_id}: execution {arn.rsplit(':', 1)[-1]}")
    table = StudyTable(target.table, study_id, client=target.dynamodb)
    seen: dict[int, str] = {}
    while True:
        desc = polled(target.sfn.describe_execution, executionArn=arn)
        for tr in table.trials():
            if seen.get(tr.trial) != tr.status and tr.status != "PENDING":
                seen[tr.trial] = tr.status
                progress.info(_line(tr))
        if desc["status"] != "RUNNING":
            break
        time.sleep(interval)
    if desc["status"] != "SUCCEEDED":
        raise RunFailed(study_id, desc["status"], desc.get("error", ""), desc.get("cause", ""))
    meta = settled(table, looks_recording(target.sfn, arn))
    return meta, table.trials()


LOOK_WAIT_S = 150.0  # the controller's timeout (infra/stacks/study.py CONTROLLER_TIMEOUT, 2 min) and a margin


def looks_recording(sfn: Any, arn: str) -> int:
    """How many of the execution's looks (its `watch` invocations) record their cost on META: every
    one scheduled that did not fail or time out. The last trial's end stops the watcher's branch
    without waiting for a look in flight (infra/stacks/study.py): its invocation goes on and adds its
    cost after the execution ended."""
    from smlt.cloud import pages

    events = {e["id"]: e for e in pages(sfn.get_execution_history, "events", executionArn=arn)}
    looks = {i for i, e in events.items() if _op(e) == "watch"}
    for e in events.values():
        if e["type"] in ("LambdaFunctionFailed", "LambdaFunctionTimedOut", "TaskFailed", "TaskTimedOut"):
            at, hops = e.get("previousEventId"), 0
            while at is not None and at not in looks and hops < 3:
                at, hops = events.get(at, {}).get("previousEventId"), hops + 1
            looks.discard(at)
    return len(looks)


def _op(event: dict[str, Any]) -> Any:
    """The controller op a scheduled Lambda invocation runs (its payload's `op`), else None."""
    try:
        if event["type"] == "LambdaFunctionScheduled":  # a Task on the function's ARN
            payload = json.loads(event["lambdaFunctionScheduledEventDetails"]["input"])
        elif event["type"] == "TaskScheduled":  # lambda:invoke
            payload = json.loads(event["taskScheduledEventDetails"]["parameters"]).get("Payload")
            payload = json.loads(payload) if isinstance(payload, str) else payload
        else:
            return None
    except (KeyError, ValueError, AttributeError):
        return None
    return payload.get("op") if isinstance(payload, dict) else None


def settled(table: StudyTable, looks: int, wait_s: float = LOOK_WAIT_S, interval: float = 0.5) -> StudyItem:
    """The study's META once every look that records has added its cost (`watches`), so the bill
    the CLI prints is final; after `wait_s` (a look that died records nothing) as it is then."""
    give_up = time.monotonic() + wait_s
    while True:
        meta = table.study()
        assert meta is not None  # Init wrote it before anything else
        if meta.watches >= looks or time.monotonic() > give_up:
            return meta
        time.sleep(interval)


def _usd(x: float) -> str:
    """Dollars with the digits a small amount needs ($0.00012, not $0.00000)."""
    return f"${x:.2g}" if 0 < x < 0.001 else f"${x:.5f}"


def summary_lines(meta: StudyItem, trials: list[TrialItem]) -> list[str]:
    stopped = sum(t.status == "STOPPED" for t in trials)
    skipped = sum(t.status == "SKIPPED" for t in trials)
    failed = sum(t.status == "FAILED" for t in trials)
    best = f"{meta.best_metric:.4f}" if meta.best_metric is not None else "n/a"
    budget = f" of the study budget {_usd(meta.budget_usd)}" if meta.budget_usd else ""
    return [
        f"done: study {meta.study_id}: {len(trials)} trials, {stopped} stopped early, {skipped} not started"
        + (f", {failed} failed" if failed else "")
        + f"; best trial {meta.best_trial} ({meta.best_run_id}) {meta.metric} {best}",
        f"  spent {_usd(meta.spent_usd)}{budget} on trials; {_usd(meta.total_usd)} with the study's own steps",
        f"  result: {meta.best_model_key}",
    ]


def failure(meta: StudyItem, trials: list[TrialItem]) -> StudyFailed:
    """A study in which no trial produced a model: each trial's cause, and what to change."""
    causes = {t.trial: f"{t.status}: {t.stop_reason or 'no reason recorded'}" for t in trials}
    distinct = sorted(set(causes.values()))
    lines = [f"study {meta.study_id}: no trial produced a model ({len(trials)} trials, spent {_usd(meta.spent_usd)})"]
    if len(distinct) == 1 and len(trials) > 1:
        lines.append(f"  every trial: {distinct[0]}")
    else:
        lines += [f"  trial {n}: {c}" for n, c in sorted(causes.items())]
    return StudyFailed("\n".join(lines), causes)


def fetch_best(target: Target, meta: StudyItem, trials: list[TrialItem], out: Path) -> None:
    """The study's result into OUT: the best trial's model as a run's folder holds it
    (model.safetensors, model.json: the trial run's card, code.zip for a `--code` model), so
    `smlt predict/export/model OUT` use it; best.json (the trial, its run id, params and metric)
    and study.json (every trial). Another run's or study's outputs there move aside first
    (smlt.outputs.retire_previous)."""
    out.mkdir(parents=True, exist_ok=True)
    store = S3Store(target.artifacts_bucket, client=target.s3)
    blob = store.get(meta.best_model_key) if meta.best_model_key and meta.best_run_id else None
    sha = hashlib.sha256(blob).hexdigest() if blob else None
    with writing(out):
        retire_previous(out, meta.best_run_id or meta.study_id, sha, f"study {meta.study_id}")
        if blob is not None and meta.best_run_id:
            write_atomic(out / "model.safetensors", blob)
            fetch_card(store, meta.best_run_id, out)
            write_atomic(out / "best.json", store.get(best_prefix(meta.study_id) + "metrics.json"))
        doc = {"study": meta.model_dump(mode="json"), "trials": [t.model_dump(mode="json") for t in trials]}
        write_atomic(out / "study.json", json.dumps(doc, indent=2))


def check_study_file(path: Path) -> tuple[Study, dict[str, Any]]:
    """The study file, and every value of its space, its budget and its deadline, checked before
    any engine, stack or trial (smlt.precheck.check_study)."""
    from smlt.precheck import check_study

    study, raw = read_study_file(path)
    check_study(study, path.parent)
    return study, raw


def run(target: Target, path: Path, out: Path, study_id: str | None = None) -> tuple[StudyItem, list[TrialItem]]:
    study, raw = read_study_file(path)
    writable_folder(out)  # before any trial is started
    if study_id:
        raw["study_id"] = study_id
    raw = stage(study, raw, path, target)
    meta, trials = follow(target, raw)
    fetch_best(target, meta, trials, out)
    if meta.best_model_key is None:
        progress.info(f"  study.json (every trial and its cause) in {out}/")
        raise failure(meta, trials)
    for line in summary_lines(meta, trials):
        progress.info(line)
    wrote = [
        n for n in ("model.safetensors", "model.json", "code.zip", "best.json", "study.json") if (out / n).exists()
    ]
    progress.info(f"  outputs in {out}/: {' '.join(wrote)}")
    if meta.best_run_id and (out / "model.safetensors").exists():
        progress.info(f"  the best trial's model (run {meta.best_run_id}): smlt predict {out} DATA --out FILE")
    return meta, trials


def local_target(engine: Any) -> Target:
    """The local engine's stack as a study target."""
    from smlt.runner import StackNames

    names = StackNames(engine)
    (arn,) = engine.state_machine_arns.values()
    return Target(
        arn,
        names.table,
        names.artifacts_bucket,
        names.data_bucket,
        engine.client("stepfunctions"),
        engine.client("dynamodb"),
        engine.client("s3"),
    )


def deployed_target(stack_name: str, cfn: Any = None) -> Target:
    """A deployed stack (its outputs name the study machine, table and buckets), through boto3."""
    from smlt.cloud import Stack

    cfn = cfn or clients.make("cloudformation")
    stack = Stack.lookup(stack_name, cfn=cfn)
    outputs = cfn.describe_stacks(StackName=stack_name)["Stacks"][0].get("Outputs", [])
    arn = next((o["OutputValue"] for o in outputs if o["OutputKey"] == STUDY_OUTPUT), None)
    if arn is None:
        raise StackNotFound(f"stack {stack_name!r} lacks output {STUDY_OUTPUT}: deploy this version of the stack")
    return Target(
        arn,
        stack.table,
        stack.artifacts_bucket,
        stack.data_bucket,
        clients.make("stepfunctions"),
        clients.make("dynamodb"),
        clients.make("s3"),
    )


def tune_local(path: Path, out: Path, faults: str | None = None) -> tuple[StudyItem, list[TrialItem]]:
    """`smlt tune STUDY --local [--faults SPEC]`: the study on the local engine (checked before it
    starts); what its functions print goes to OUT/logs/<study id>.log, as a run's does."""
    study, raw = check_study_file(path)
    writable_folder(out)  # before the engine starts
    from smlt.runner import functions_log, start_engine

    study_id = raw.get("study_id") or default_study_id(study)
    engine, _, injector = start_engine(faults)
    try:
        with functions_log(engine, out / "logs" / f"{study_id}.log"):
            result = run(local_target(engine), path, out, study_id=study_id)
        if injector is not None:
            progress.info(f"  faults injected {injector.counts}")
        return result
    finally:
        engine.stop()
