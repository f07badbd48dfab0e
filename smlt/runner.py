"""`smlt run --local`: the synthesized state machine on the local engine, with progress lines.

Synthesize the CDK app in-process, start the engine (moto + handler process pool), stage the
dataset in the data bucket, start the execution, report a line per aggregated round (following
chained executions; to :mod:`smlt.runtime.progress`'s loggers), then write model.safetensors,
metrics.json, report.png and history.json. A run that does not succeed raises ``RunFailed``.
The run's S3 objects and DynamoDB items are snapshotted to OUT/.state/runs/<run id>/ when each
round is aggregated, before the next one starts: that is what `smlt resume RUN --local --out OUT`
continues from, losing at most the round in progress. The live run holds that folder's lock, so a
second live run with the same id and --out is refused (RunInProgress).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import smlt.stack_outputs as stack_outputs
from smlt.code_imports import describe, foreign_imports
from smlt.datasets import checked_dataset_folder, upload_dataset
from smlt.extras import require
from smlt.jobfile import read_job_file
from smlt.outputs import fetch_outputs, progress_line, writable_folder
from smlt.runtime import deployed, keys, ledger
from smlt.runtime.errors import InvalidJob, RunFailed, RunNotFound
from smlt.runtime.evaluation import class_warning, summary_text
from smlt.runtime.job import Job
from smlt.runtime.prices import Prices
from smlt.runtime.progress import notice, progress
from smlt.runtime.records import RunTable
from smlt.runtime.store import S3Store
from smlt.runtime.usercode import (
    CodePackage,
    check_importable,
    code_key,
    entry_points,
    package_code,
    stage_code,
    with_code,
)
from smlt.snapshot import (
    Snapshot,
    clear_state,
    find_state,
    refuse_to_replace,
    restore_snapshot,
    run_lock,
    saved_items,
    saved_status,
    state_dir,
)
from smlt.tracking import LiveTracking


class StackNames:
    """Physical names of the stack's buckets and table (its outputs, as a deployed stack's are
    read) and of its training functions (the planner's environment)."""

    def __init__(self, engine: Any) -> None:
        outputs = engine.outputs()
        self.artifacts_bucket = outputs[stack_outputs.ARTIFACTS_BUCKET]
        self.data_bucket = outputs[stack_outputs.DATA_BUCKET]
        self.table = outputs[stack_outputs.TABLE]
        env = next(f.env for f in engine.functions.values() if "SMLT_TRAIN_FUNCTIONS" in f.env)
        self.train_functions = set(json.loads(env["SMLT_TRAIN_FUNCTIONS"]).values())


def _note_queueing(job: Job, engine: Any) -> None:
    """Say so when a round's workers far outnumber the local handler processes (they queue)."""
    slots = engine.pool.size if getattr(engine, "pool", None) else 0
    n = job.workers.initial if job.workers.planner == "fixed" else job.workers.max
    if slots and n > 4 * slots:
        progress.info(
            f"  note: up to {n} workers per round share {slots} local handler processes: each round runs them "
            f"{slots} at a time (lower workers.initial / workers.max for a quicker local run)"
        )


def build_app(**kw: Any) -> Any:
    """``infra.app.build_app``, imported when called: on a synth cache hit the CDK (4-8 s to
    import) is never imported."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")  # before jsii starts
    _quiet_jsii_exit()
    from infra.app import build_app as build

    return build(**kw)


def _quiet_jsii_exit() -> None:
    """A Ctrl-C during a cold synth reaches jsii's node process too (one process group): it dies,
    and jsii's exit hook then writes to its closed pipe, printing a BrokenPipeError traceback
    after our own message. The hook (bound when the kernel starts) skips a process already gone."""
    from jsii._kernel.providers import process

    node = process._NodeProcess
    if getattr(node.stop, "smlt_quiet", False):
        return
    stop = node.stop

    def quiet_stop(self: Any) -> None:
        try:
            stop(self)
        except (BrokenPipeError, ValueError, OSError):  # node died first (SIGINT): nothing to stop
            pass

    quiet_stop.smlt_quiet = True  # type: ignore[attr-defined]
    node.stop = quiet_stop  # type: ignore[method-assign]


def start_engine(faults: str | None, context: dict[str, Any] | None = None) -> tuple[Any, StackNames, Any]:
    """The local engine of the project's app, started (`context`: CDK context over cdk.json's)."""
    require("local", "the local engine")  # before anything imports moto or the CDK
    from smlt.faults import FaultInjector
    from smlt.local import LocalEngine

    t0 = time.perf_counter()
    # Handler processes inherit this environment: keep their INFO logs off the progress lines.
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")  # and their EMF lines (smlt.runtime.metrics)
    # moto's interpreter logs an execution's failure (one the engine stopped, too); the run's own
    # error says it, named, from the execution's history.
    logging.getLogger("moto.stepfunctions.parser").setLevel(logging.CRITICAL)
    try:
        injector = FaultInjector.from_spec(faults) if faults else None
    except ValueError as e:
        raise InvalidJob(str(e)) from None
    progress.info("starting the local engine (the CDK app's synth, moto and the handler processes)")
    engine = LocalEngine(build_app, synth_cache=True, invoke_filter=injector, synth_context=context)
    with _ctrl_c_wins():
        engine.start()
    names = StackNames(engine)
    if injector is not None:
        injector.functions = names.train_functions
    syn = engine.synthesized
    synth = "synth cached" if syn.cached else f"synth {syn.seconds:.1f} s"
    progress.info(f"local engine up in {time.perf_counter() - t0:.1f} s ({synth})")
    return engine, names, injector


class Follower:
    """Reports new rounds and snapshots state while an execution (and its chained ones) runs.

    The snapshot is taken in the engine's `after_invoke` hook: when an aggregation (or any
    other non-worker invocation) returns, before the state machine goes on, so the saved state
    is never behind the newest aggregated round; and after every invocation, the ATTEMPT items
    of the round in progress (`Snapshot.save_in_flight`). It costs a round one DynamoDB query per
    invocation (two per non-worker one), items.json rewritten per invocation that ended, and
    when a round is new, its items, an S3 listing of the round prefixes from round r on, the new
    objects (model r+1)."""

    def __init__(
        self, engine: Any, names: StackNames, run_id: str, state_dir: Path, tracking: LiveTracking | None = None
    ) -> None:
        self.engine, self.names, self.run_id = engine, names, run_id
        self.tracking = tracking  # each reported round to TensorBoard (and MLflow) as it is reported
        self.state_dir = state_dir
        self.snapshot = Snapshot(engine, names, run_id, state_dir)
        self.last_plan: tuple = ()
        self.executions: list[str] = []  # their histories stay in the engine (on disk once finished) until the end
        self.error: BaseException | None = None  # a failed save in the hook, raised by poll
        self._target: str | None = None

    def after_invoke(self, function: str, _payload: bytes, _ok: bool) -> None:
        try:
            if function not in self.names.train_functions:  # a worker's invocation never completes a round
                self.snapshot.save(rounds_only=True)
            self.snapshot.save_in_flight()  # its ATTEMPT item: billed even if the round is never aggregated
        except Exception as e:  # noqa: BLE001 - raised in the main thread by the next poll
            self.error = self.error or e

    def poll(self, *_: Any) -> None:
        if self.error is not None:
            raise self.error
        self.snapshot.save(rounds_only=True)  # the hook saved already; this catches up without one
        self.report()

    def report(self) -> None:
        """A line (and the live curves) for each round saved since the last report. A Ctrl-C
        meanwhile waits for the end of the report: a round taken is a round reported."""
        with _ctrl_c_after():
            self._report()

    def _report(self) -> None:
        # Checkpoint first, then report: a round that was printed is a round that survives a crash.
        for r, plan in self.snapshot.take_new():
            shape = (plan.workers, plan.memory_mb, plan.local_steps) if plan else (None, None, None)
            if plan and plan.reason and shape != self.last_plan:  # say why whenever the plan changes
                progress.info(f"  plan: {plan.reason}")
            self.last_plan = shape
            estimated = self.estimated(r.round)
            progress.info(
                progress_line(r, plan, self.target())
                + (f" | {estimated}" if estimated else "")
                + (f" | {r.reason}" if r.reason else "")
            )
            if self.tracking is not None:
                self.tracking.round(r.model_dump())

    def estimated(self, rnd: int) -> str:
        """The part of round `rnd`'s cost that was estimated when it was priced (a straggler at the
        function's timeout; smlt.runtime.ledger.estimate_note), "" when none (one query)."""
        table = RunTable(self.names.table, self.run_id, client=self.engine.client("dynamodb"))
        return ledger.estimate_note(table.query(ledger.round_prefix(rnd)), Prices(), deployed.value("architecture"))

    def target(self) -> str | None:
        """The run's target metric, from its META item (read once, when the first round is reported)."""
        if self._target is None:
            meta = RunTable(self.names.table, self.run_id, client=self.engine.client("dynamodb")).meta()
            self._target = (meta.job.training.target_metric or "") if meta is not None else ""
        return self._target or None

    def follow(self, arn: str) -> dict[str, Any]:
        self.engine.after_invoke = self.after_invoke
        try:
            while True:
                # Every poll is a request to the one moto server the handlers use too: not too often.
                try:
                    desc = self.engine.wait(arn, poll=self.poll, interval=0.5)
                except KeyboardInterrupt:
                    self.finish_round_in_flight(arn)
                    raise
                self.poll()
                self.executions.append(arn)
                out = json.loads(desc.get("output") or "{}")
                if desc["status"] == "SUCCEEDED" and out.get("chain"):
                    arn = out["chain"]["execution_arn"]
                    progress.info(f"  chained into execution {arn.rsplit(':', 1)[-1]}")
                    continue
                return desc
        finally:
            self.engine.after_invoke = None

    def finish_round_in_flight(self, arn: str) -> None:
        """After a Ctrl-C: let the round in flight be aggregated and saved (what a resume starts
        from), then return so the caller stops the engine; a second Ctrl-C returns at once."""
        before = self.snapshot.newest
        progress.info(
            f"interrupted: finishing round {before + 1} (in flight) and saving it; Ctrl-C again to stop at once"
        )
        sfn = self.engine.client("stepfunctions")
        try:
            while self.snapshot.newest == before and self.error is None:
                if sfn.describe_execution(executionArn=arn)["status"] != "RUNNING":
                    break
                time.sleep(0.25)
            self.snapshot.save(rounds_only=True)
            self.report()
        except KeyboardInterrupt:
            pass

    def history(self) -> list[dict[str, Any]]:
        """Every history event of the run's executions, in order, each with its execution's ARN."""
        return [{"execution": arn, **e} for arn in self.executions for e in self.engine.history(arn)]


@contextlib.contextmanager
def _signal_handler(signum: int, handler: Callable[[int, Any], None]) -> Iterator[bool]:
    """`handler` answers `signum` while the block runs, the previous one after; outside the main
    thread (no signal handler can be set there) nothing is set and the block is told so (False)."""
    try:
        previous = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        yield False
        return
    try:
        yield True
    finally:
        signal.signal(signum, previous)


@contextlib.contextmanager
def _ctrl_c_wins() -> Iterator[None]:
    """A Ctrl-C that ends the block with another error is a KeyboardInterrupt. During a cold synth
    the SIGINT reaches jsii's node process too (one process group); when node dies before Python
    runs its handler, the synth fails reading node's pipe (a JSONDecodeError) and the interrupt
    would be lost behind that traceback."""
    caught: list[int] = []

    def interrupted(sig: int, _frame: Any) -> None:
        caught.append(sig)
        raise KeyboardInterrupt

    with _signal_handler(signal.SIGINT, interrupted) as handled:
        try:
            yield
        except Exception:
            if not handled:
                raise
            time.sleep(0.05)  # a SIGINT already delivered runs its handler here (raising KeyboardInterrupt)
            if caught:
                raise KeyboardInterrupt from None
            raise


@contextlib.contextmanager
def _ctrl_c_after() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) until the block ends, then raise it; outside the main thread (no
    signal handler can be set there) run the block as it is."""
    caught: list[int] = []
    with _signal_handler(signal.SIGINT, lambda sig, _frame: caught.append(sig)):
        yield
    if caught:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_is_ctrl_c() -> Iterator[None]:
    """While the block runs, a SIGTERM (`kill PID`, a process manager's stop) is a Ctrl-C: it raises
    SIGINT in this process, whose handler of the moment acts on it (KeyboardInterrupt: the round in
    flight finished and saved, the resume command said, the engine's handler processes stopped before
    this one ends; held by `_ctrl_c_after` while the outputs are written). Its default, ending the
    process at once, would leave the handler processes writing to a closed pipe and the run without
    the line saying how to resume it. Outside the main thread (no signal handler can be set there)
    the block runs as it is."""
    with _signal_handler(signal.SIGTERM, lambda _sig, _frame: signal.raise_signal(signal.SIGINT)):
        yield


def handler_log(out: Path, run_id: str) -> Path:
    """Where a local run's functions' prints go (`LocalEngine.handler_output`): on AWS, CloudWatch Logs."""
    return out / "logs" / f"{run_id}.log"


@contextlib.contextmanager
def functions_log(engine: Any, logs: Path) -> Iterator[None]:
    """What the engine's functions print (a forward's prints, their logs) goes to `logs`, not the
    terminal, as on AWS it goes to CloudWatch Logs: one line at the end says where."""
    logs.parent.mkdir(parents=True, exist_ok=True)
    engine.handler_output = logs
    try:
        yield
    finally:
        engine.handler_output = None
        if logs.exists() and logs.stat().st_size:
            with logs.open("rb") as f:  # streamed: a chatty forward's log may be large
                lines = sum(not line.startswith(b"--- ") for line in f)
            progress.info(f"  the functions printed {lines:,} lines (CloudWatch Logs on AWS): {logs}")
        else:
            with contextlib.suppress(OSError):
                logs.parent.rmdir()  # nothing printed: no empty folder left


def execute(engine: Any, names: StackNames, run_id: str, job: dict, out: Path, injector: Any = None) -> dict:
    """Run ``job`` to its end (following chained executions) and write its outputs into ``out``;
    returns the final metrics. Raises :class:`RunFailed` when the execution does not succeed.
    What the functions print goes to `handler_log` (`functions_log`)."""
    with functions_log(engine, handler_log(out, run_id)):
        return _execute(engine, names, run_id, job, out, injector)


def _execute(engine: Any, names: StackNames, run_id: str, job: dict, out: Path, injector: Any = None) -> dict:
    tracking = LiveTracking(run_id, job, out)
    follower = Follower(engine, names, run_id, state_dir(out, run_id), tracking)
    t0 = time.time()
    # A run that already has state (resume) needs a fresh execution name.
    arn = engine.start_execution(job, name=f"{run_id[:68]}-{int(t0)}" if job.get("run_id") else run_id)
    try:
        desc = follower.follow(arn)
    except KeyboardInterrupt:
        saved = follower.snapshot.newest
        where = f"after round {saved}" if saved >= 0 else "before its first round was saved"
        progress.info(f"stopped run {run_id} {where} (saved in {follower.state_dir})")
        if saved >= 0:
            progress.info(f"  continue it with: {resume_command(run_id, out)}")
        raise
    finally:
        tracking.close()  # before the fetch rewrites the folder
    if desc["status"] != "SUCCEEDED":
        cause = desc.get("cause", "")
        try:
            cause = json.loads(cause).get("errorMessage", cause)
        except (ValueError, AttributeError):
            pass
        raise RunFailed(run_id, desc["status"], desc.get("error", ""), cause)
    artifacts = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    with _ctrl_c_after():  # a Ctrl-C now waits: the outputs and the saved state are written whole
        metrics = fetch_outputs(artifacts, run_id, out, follower.history())
        follower.snapshot.save(final=True)  # META SUCCEEDED and the final objects
    for line in done_lines(run_id, metrics["final"], time.time() - t0, out, injector.counts if injector else None):
        progress.info(line)
    return metrics


def resume_command(run_id: str, out: Path) -> str:
    """The command that continues a local run saved under `out` (quoted for a shell)."""
    return f"smlt resume {run_id} --local --out {shlex.quote(str(out))}"


def done_lines(run_id: str, f: dict[str, Any], seconds: float, out: Path, faults: dict | None = None) -> list[str]:
    """The lines that end a run: its result, why it stopped, where its outputs are. A run the
    planner stopped before its first round (budget, deadline) has no metrics, report nor model."""
    loss = "n/a" if f.get("val_loss") is None else f"{f['val_loss']:.4f}"
    files = " ".join(
        n
        for n in ("model.safetensors", "model.json", "code.zip", "metrics.json", "report.png", "history.json")
        if (out / n).exists()
    )
    card = out / "model.json"
    classes = json.loads(card.read_text()).get("classes") if card.exists() else None
    warning = class_warning(f, classes)
    metrics = out / "metrics.json"
    saved = json.loads(metrics.read_text()) if metrics.exists() else {}
    target = saved.get("job", {}).get("training", {}).get("target_metric")
    aggregated = len(saved.get("rounds") or []) or f["rounds"]  # ROUND items (smlt verify counts the same)
    return [
        f"done: run {run_id}: {ledger.rounds_said(aggregated, f['rounds'])}, {summary_text(f, target)}, "
        f"val loss {loss}, "
        f"{seconds:.1f} s, estimated AWS cost ${f['estimated_cost_usd']:.5f}"
        + (f", faults injected {faults}" if faults is not None else ""),
        *([f"  warning: {warning}"] if warning else []),
        f"  stop reason: {f['stop_reason']}" + ("" if f["rounds"] else " (no round was trained)"),
        f"  outputs in {out}/: {files}",
    ]


def default_out(run_id: str, base: Path = Path("out")) -> Path:
    """Where a run started without --out writes: `out/`, or `out/<run id>/` when `out/` holds
    another run's outputs already (a second run never replaces the first's model)."""
    try:
        held = json.loads((base / "metrics.json").read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return base
    return base if held in (None, run_id) else base / run_id


def run_local(
    job_path: Path,
    out: Path | None,
    faults: str | None = None,
    code: Path | None = None,
    replace: bool = False,
) -> dict:
    """`smlt run --local JOB [--code DIR]`: returns the run's final metrics (see :func:`execute`).
    `out` None: :func:`default_out`. A saved state of the same run id in `out` is kept (the run is
    refused, SavedRunExists) unless `replace`."""
    require("local", "the local engine")  # before anything is written
    job, raw = read_job_file(job_path)  # named errors before anything starts
    folder = checked_dataset_folder(job, base=job_path.parent)
    package = package_code(code) if code is not None else None
    if package is None and (job.code is None or job.code.uri is None):
        check_importable(job)  # from PYTHONPATH, as the handler processes will (they inherit it)
    elif package is not None and (foreign := foreign_imports(package.data, [n for _, n in entry_points(job)])):
        # the local handlers share this machine's packages; the deployed image has only its own
        notice.warning(f"code runs here but not on the deployed stack: {describe(foreign)}")
    run_id = (
        raw.get("run_id") or f"{re.sub(r'[^A-Za-z0-9-]', '-', raw.get('name', 'job'))}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    if out is None:
        out = default_out(run_id)
        if out != Path("out"):
            progress.info(f"out/ holds another run's outputs: this run writes to {out}/ (--out DIR to choose)")
    writable_folder(out)  # InvalidJob before the engine starts, not a traceback at its end
    with _sigterm_is_ctrl_c(), run_lock(out, run_id) as saved:  # RunInProgress before the engine starts
        if replace:
            clear_state(saved)  # asked for: this run id's earlier state is replaced
        refuse_to_replace(out, run_id, saved)  # SavedRunExists: an earlier run's state is kept
        engine, names, injector = start_engine(faults)
        _note_queueing(job, engine)
        try:
            if folder is not None:
                raw["dataset"]["uri"] = upload_dataset(folder, names.data_bucket, client=engine.client("s3"))
            if package is not None:
                raw = with_code(raw, stage_code(package, names.artifacts_bucket, client=engine.client("s3")))
                _keep_for_resume(saved, names.artifacts_bucket, package)
            return execute(engine, names, run_id, raw, out, injector)
        finally:
            engine.stop()


def _keep_for_resume(state: Path, bucket: str, package: CodePackage) -> None:
    """The code object outlives the engine in the run's saved state, which `restore_snapshot`
    puts back object by object (its layout: s3/<bucket>/<key>), so `smlt resume` needs no --code."""
    path = state / "s3" / bucket / code_key(package.sha256)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(package.data)


def resume_local(run_id: str, out: Path, faults: str | None = None) -> dict:
    """Continue a local run from its snapshot in OUT/.state/runs/<run id>/ (or, saved before runs
    had their own folder, OUT/.state): the last complete round is kept. A run that is not in OUT
    but in OUT/<run id>/ (a run without --out whose out/ was taken: `default_out`) is found there.
    A finished run is left as it is: its saved final metrics are returned and nothing is written."""
    require("local", "the local engine")
    own = out / run_id
    if not (find_state(out, run_id) / "items.json").exists() and (find_state(own, run_id) / "items.json").exists():
        out = own
    items = saved_items(run_id, out)  # RunNotFound / DamagedState before the engine starts
    if saved_status(items, run_id) == "SUCCEEDED":
        return _finished(run_id, out)
    with _sigterm_is_ctrl_c(), run_lock(out, run_id):  # and RunInProgress
        engine, names, injector = start_engine(faults)
        try:
            restore_snapshot(engine, names, run_id, out)
            meta = RunTable(names.table, run_id, client=engine.client("dynamodb")).meta()
            if meta is None:
                raise RunNotFound(f"no run {run_id!r} in the saved state in {out / '.state'}")
            job = {**meta.job.model_dump(mode="json"), "run_id": run_id}
            done = len(RunTable(names.table, run_id, client=engine.client("dynamodb")).rounds())
            progress.info(f"resuming run {run_id} after {done} complete rounds")
            return execute(engine, names, run_id, job, out, injector)
        finally:
            engine.stop()


def _outputs_of(run_id: str, out: Path) -> Path:
    """Where run `run_id`'s outputs are: `out`, or OUT/<run id>/ when a later run's outputs moved
    them there (smlt.outputs.retire_previous)."""
    from smlt.outputs import folder_run

    if folder_run(out) not in (None, run_id) and folder_run(out / run_id) == run_id:
        return out / run_id
    return out


def _finished(run_id: str, out: Path) -> dict:
    """`smlt resume` of a run that finished: say so, change nothing, return its final metrics."""
    folder = find_state(out, run_id) / "s3"
    saved = [p / keys.final_metrics_key(run_id) for p in sorted(folder.iterdir())] if folder.is_dir() else []
    found = next((p for p in saved if p.is_file()), None)
    metrics = json.loads(found.read_text()) if found else {"final": {}}
    f = metrics.get("final", {})
    cost = f.get("estimated_cost_usd")
    progress.info(
        f"run {run_id} finished already ({f.get('rounds', '?')} rounds"
        + (f", estimated AWS cost ${cost:.5f}" if isinstance(cost, (int, float)) else "")
        + f"): nothing to resume, nothing changed; its outputs are in {_outputs_of(run_id, out)}/"
    )
    return metrics
