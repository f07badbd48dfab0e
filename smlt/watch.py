"""`smlt run --local --watch DIR`: every new DIR/incoming/<pipeline>/<version>/manifest.json (a
version `smlt data prepare` wrote) or .../_SUCCESS (the marker of raw data beside it, which the
stack prepares) is uploaded with its folder to the local engine's data bucket and fires the
stack's own trigger rule (:mod:`smlt.local.eventbridge`); each execution it starts is followed
like a run and its outputs are fetched into OUT/<run id>. Progress goes to
:mod:`smlt.runtime.progress`'s loggers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from smlt.local.eventbridge import UploadTrigger, upload_version
from smlt.outputs import fetch_outputs
from smlt.runner import Follower, StackNames
from smlt.runtime import keys
from smlt.runtime.evaluation import class_warning, summary_text
from smlt.runtime.progress import notice
from smlt.runtime.store import S3Store
from smlt.runtime.study.cause import execution_cause


def _follow_triggered(engine: Any, names: StackNames, arn: str, out: Path) -> None:
    desc = engine.wait(arn, interval=0.25)
    output = json.loads(desc.get("output") or "{}")
    plan, prepared = output.get("plan", {}), output.get("prepared", {})
    if prepared.get("action") == "duplicate":  # a raw upload's event delivered twice
        notice.info(f"  {prepared['reason']}")
        return
    run_id = plan.get("run_id")
    if desc["status"] != "SUCCEEDED" or not run_id:
        notice.info(f"  {desc['status']}: {execution_cause(desc.get('error'), desc.get('cause'))}")
        return
    if plan.get("action") == "duplicate":
        notice.info(f"  {plan['reason']}")
        return
    if prepared:
        notice.info(f"  {prepared['reason']}")
        for note in prepared.get("notes", []):
            notice.info(f"  {note}")
    follower = Follower(engine, names, run_id, out / run_id / ".state")
    follower.poll()
    if output.get("chain"):  # a long run continues in chained executions
        follower.follow(output["chain"]["execution_arn"])
    m = fetch_outputs(
        S3Store(names.artifacts_bucket, client=engine.client("s3")), run_id, out / run_id, engine.history(arn)
    )
    target = (m["job"].get("training") or {}).get("target_metric")
    notice.info(
        f"  run {run_id}: {summary_text(m['final'], target)}, warm start "
        f"{m['job'].get('warm_start') or 'none'} -> {out / run_id}"
    )
    card = out / run_id / "model.json"
    warning = class_warning(m["final"], json.loads(card.read_text()).get("classes") if card.exists() else None)
    if warning:  # an accuracy that hides a missed class, as `smlt run` ends with it
        notice.warning(f"  warning: {warning}")
    gate = _verdict(S3Store(names.artifacts_bucket, client=engine.client("s3")), m["job"], run_id)
    if gate:
        notice.info(f"  {gate}")


def _verdict(artifacts: S3Store, job: dict[str, Any], run_id: str) -> str | None:
    """The pipeline's gate on the run: `version v2 promoted: val_accuracy ...` (smlt.runtime.pipeline)."""
    from smlt.runtime import keys
    from smlt.runtime.pipeline import VersionRecord, version_of
    from smlt.runtime.store import NotFound

    where = version_of(job.get("dataset", {}).get("uri", ""))
    if where is None:
        return None
    try:
        r = VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key(*where)))
    except NotFound:
        return None
    if r.run_id != run_id:
        return None
    return f"pipeline {r.pipeline} version {r.version} {r.status} ({r.start}): {r.reason}"


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:  # removed since the listing
        return -1


# A version's folder is uploaded once its files have stayed the same (names, sizes, modification
# times) for this long after its marker appeared: a marker written while the data file is still
# being copied in (a `cp` of a large CSV, an export still writing) would otherwise upload the part
# written so far, and train on it or fail on its cut last line.
SETTLE_S = 2.0


Files = tuple[tuple[str, int, int], ...]


def _files(folder: Path) -> Files:
    """The folder's files as (name, size, modification time), to tell whether it still changes."""
    found = []
    for f in sorted(folder.rglob("*")):
        try:
            st = f.stat()
        except OSError:  # removed since the listing
            continue
        if f.is_file():
            found.append((f.relative_to(folder).as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(found)


def watch_folder(
    engine: Any,
    names: StackNames,
    root: Path,
    out: Path,
    once: bool = False,
    interval: float = 1.0,
    settle: float | None = None,
) -> list[str]:
    """Watch ROOT/incoming/<pipeline>/<version>/manifest.json and .../_SUCCESS on a started engine;
    each new one, or one written again (its modification time changed: a version's data fixed and
    its marker uploaded again), starts a retraining run through the stack's rule. Runs until
    interrupted (or, with once, until a pass finds nothing new); returns the execution ARNs it started.

    A new marker's folder is uploaded once its files have not changed for `settle` seconds
    (SETTLE_S): a data file still being written when its marker appears is uploaded whole."""
    seen: dict[Path, int] = {}  # each marker's modification time when it was uploaded
    pending: dict[Path, tuple[float, Files]] = {}  # each new marker: since when its folder's files are as they are
    told: set[Path] = set()  # markers whose folder was said to be still changing
    settle = SETTLE_S if settle is None else settle
    started: list[str] = []
    trigger = UploadTrigger(engine, names.data_bucket)
    trigger.prime()
    notice.info(
        f"watching {root}/incoming/<pipeline>/<version>/{keys.MANIFEST} and {keys.SUCCESS_MARKER} (Ctrl-C to stop)"
    )
    try:
        while True:
            found = [p for name in (keys.MANIFEST, keys.SUCCESS_MARKER) for p in root.glob(f"incoming/*/*/{name}")]
            fresh = sorted(p for p in found if seen.get(p) != _mtime(p))
            for upload in fresh:
                files, now = _files(upload.parent), time.monotonic()
                since, before = pending.get(upload, (now, None))
                if files != before:  # new, or its folder changed since the last pass: wait for it to settle
                    if before is not None and upload not in told:
                        told.add(upload)
                        notice.info(
                            f"  {upload.parent}: still changing, its upload waits until it has not for {settle:g} s"
                        )
                    pending[upload] = (now, files)
                    continue
                if now - since < settle:
                    continue
                del pending[upload]
                told.discard(upload)
                seen[upload] = _mtime(upload)
                for arn in upload_version(trigger, upload.parent, root, last=upload.name):
                    started.append(arn)
                    _follow_triggered(engine, names, arn, out)
            if once and not fresh:
                return started
            time.sleep(interval)
    except KeyboardInterrupt:
        return started
