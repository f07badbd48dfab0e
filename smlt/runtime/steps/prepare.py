"""PrepareData: a raw upload prepared in the cloud, before its run's first Plan.

A team uploads a version's raw data under `incoming/<pipeline>/<version>/` (one CSV, Parquet,
JSON Lines, Excel workbook or NPZ file, an image folder of class subfolders, or a zip/tar of one of those) and then the
completion marker `incoming/<pipeline>/<version>/_SUCCESS` (the Hadoop/Spark convention: written
last, so nothing starts on a partial upload, whatever order `aws s3 sync` takes). The marker's
event starts the execution; this step

1. claims the run for the execution (`PREPARE` item, first writer wins): a duplicated event's
   execution answers "duplicate" and ends without preparing or training;
2. reads the pipeline's job (a bad job fails here, before the data is read) and its source
   options (`dataset.label`, `task`, `missing`, `image_size`, ...);
3. finds the one data source beside the marker (named errors otherwise: `NoDataFile`,
   `MixedUpload`, `UnsupportedFormat`, `AlreadyPrepared`, `TooLargeForLambda`), downloads it to
   /tmp (an archive is extracted there), and
4. prepares it with the pipeline's features (`smlt.runtime.pipeline.prepare_with_features`, the
   rule `smlt data prepare --out .../incoming/<p>/<v>/` follows: the first version fixes them)
   into `prepared/<pipeline>/<version>/<tag>/` of the data bucket (`keys.prepared_prefix`), which
   the trigger rule never matches and which never overwrites the raw upload.

The planner then takes the same trigger to the run's job with `dataset.uri` there
(`smlt.runtime.trigger`). A failure ends the execution with the error's name; nothing of the
pipeline changes (its champion, features and versions), and a new upload of the marker (a new
sequencer, a new run id and prefix) prepares again. A named data error (`InvalidDataset` and its
kinds) is first told to the team's SNS topic when the stack has one (`notify_topic_arn`): the
version's refusal (smlt.runtime.notify), then the same error raised. A process that died is run
again once by the state machine (this step takes over what the attempt did); failed for good,
`prepare_failed` (the PrepareFailed state) tells the topic what PrepareData did not, once.

The step runs in the train_step image (its own command, `lambdas/prepare/handler.py`): that image
has every library `smlt data prepare` reads formats with (pyarrow for Parquet, Pillow for
images, openpyxl for Excel workbooks), which the zip functions' layer has not; see
docs/architecture.md, "Trigger".
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic_settings import BaseSettings

from smlt.runtime import clients, keys
from smlt.runtime.config import ENV
from smlt.runtime.data import archives
from smlt.runtime.data.archives import ARCHIVE_SUFFIXES
from smlt.runtime.data.images import IMAGE_KINDS, IMAGE_SUFFIXES
from smlt.runtime.data.manifest import Manifest
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.sources import TABLE_SUFFIXES
from smlt.runtime.data.table_reader import is_compressed, table_suffix
from smlt.runtime.data.workbook import is_workbook
from smlt.runtime.errors import InvalidDataset, InvalidJob
from smlt.runtime.items import PrepareItem
from smlt.runtime.job import parse_job
from smlt.runtime.notify import Refusal, publish_refusal, refusal_told
from smlt.runtime.pipeline import prepare_with_features
from smlt.runtime.progress import collected_notices
from smlt.runtime.records import RunTable
from smlt.runtime.steps import prepare_parts, upload_parts
from smlt.runtime.steps.events import DataPrepared, PrepareDataEvent, PrepareFailedEvent
from smlt.runtime.steps.prepare_limits import (
    ARCHIVE_LIMIT,
    ARRAY_SUFFIXES,
    ARRAYS_LIMIT,
    COMPRESSED_TABLE_LIMIT,
    FORMATS,
    IMAGES_LIMIT,
    MAX_NOTES,
    PREPARE_EPHEMERAL_MB,
    TABLE_LIMIT,
    TMP_SHARE,
    WORKBOOK_LIMIT,
    AlreadyPrepared,
    Limit,
    MixedUpload,
    NoDataFile,
    TooLargeForLambda,
    UnsupportedFormat,
    _size,
    ignored,
)
from smlt.runtime.store import S3Store
from smlt.runtime.trigger import Upload, pipeline_job, refusal_of, run_job, upload_of

log = logging.getLogger(__name__)


class PrepareSettings(BaseSettings):
    """The Prepare function's environment: `smlt.runtime.config.Settings`' fields read by PREPARE,
    and only those (a deployed function has no cdk.json for the other fields' defaults)."""

    model_config = ENV

    data_bucket: str
    table: str
    # The team's SNS topic: a refused upload is told there (smlt.runtime.notify); "" = none.
    notify_topic_arn: str = ""


# --- which data: a pure decision over the objects beside the marker ----------------------------


@dataclass(frozen=True)
class RawSource:
    """The one data source of an upload: a file, an archive or an image folder (`names`: its
    objects, relative to the version's folder; `root`: the source's path relative to there)."""

    kind: Literal["file", "archive", "images"]
    root: str
    names: tuple[str, ...]
    bytes: int


def _kind(name: str) -> str | None:
    low = name.lower()
    if table_suffix(name) in TABLE_SUFFIXES or low.endswith(ARRAY_SUFFIXES):
        return "file"
    if low.endswith(ARCHIVE_SUFFIXES):
        return "archive"
    return None


def _listed(names: list[str], more: int = 3) -> str:
    return ", ".join(names[:more]) + (f" and {len(names) - more} more" if len(names) > more else "")


def find_source(
    objects: dict[str, int], where: str, *, in_archive: bool = False, options: SourceOptions | None = None
) -> RawSource:
    """The one data source among `objects` (name relative to the version's folder -> bytes), or
    the named error that says what is wrong with the upload. `where` names the folder in messages
    (an archive's, `s3://.../v1/data.zip`, for its members). A source over its kind's limit is
    refused here, by the sizes listed (before the download, or before an archive is extracted)."""
    files = {n: s for n, s in objects.items() if not ignored(n)}
    if keys.MANIFEST in files and not in_archive:
        raise AlreadyPrepared(
            f"{where} holds a prepared dataset ({keys.MANIFEST}), whose own upload starts its run: "
            f"{keys.SUCCESS_MARKER} is the marker of raw data; delete {where}{keys.SUCCESS_MARKER}"
        )
    top = sorted(n for n in files if "/" not in n)
    nested = sorted(n for n in files if "/" in n)
    sources: list[RawSource] = []
    unsupported: list[str] = []
    for name in top:
        kind = _kind(name)
        if kind is None or (in_archive and kind == "archive"):
            unsupported.append(name)
        else:
            sources.append(RawSource(kind, name, (name,), files[name]))  # type: ignore[arg-type]
    if nested:
        images = [n for n in nested if n.lower().endswith(IMAGE_SUFFIXES)]
        folders = sorted({n.split("/", 1)[0] for n in nested})
        # class folders at the top (cat/1.png), or one folder of them (photos/cat/1.png)
        root = folders[0] if len(folders) == 1 and all(n.count("/") >= 2 for n in nested) and not top else ""
        if images:
            sources.append(RawSource("images", root, tuple(nested), sum(files[n] for n in nested)))
        else:
            unsupported.append(f"{folders[0]}/ ({_listed(nested, 2)}: no {IMAGE_KINDS} image)")
    if len(sources) > 1:
        described = [f"{s.root or 'the class folders'}/" if s.kind == "images" else s.root for s in sources]
        raise MixedUpload(
            f"{where} holds {len(sources)} data sources ({_listed(described, 6)}); one version is one "
            f"source ({FORMATS}): upload the others as versions of their own"
        )
    if unsupported:
        raise UnsupportedFormat(
            f"{where}: {_listed(unsupported)} is not a format smlt prepares; upload {FORMATS} "
            "(names starting with _ or . are ignored)"
        )
    if not sources and in_archive:
        raise NoDataFile(
            f"{where} holds no data: an archive holds {FORMATS.removesuffix(' or a .zip/.tar(.gz, .bz2, .xz) of one')}"
        )
    if not sources:
        raise NoDataFile(
            f"{where} has a {keys.SUCCESS_MARKER} marker but no data beside it: upload {FORMATS} into "
            f"{where}, then {keys.SUCCESS_MARKER} again (written last: the marker starts the run)"
        )
    (source,) = sources
    limit = limit_of(source)
    size, said = source.bytes, _size(source.bytes)
    if source.kind == "images" and options is not None and options.image_size:
        # resized on reading: the decoded pixels are known from the listing
        count, side = sum(n.lower().endswith(IMAGE_SUFFIXES) for n in source.names), options.image_size
        size = count * _channels(options) * side**2
        said = _pixels(size, count, _channels(options), side, side)
    # An NPZ or image file's bytes are at most its arrays' or pixels' (they are compressed, or not),
    # so a source over the limit by its files is over it once loaded too.
    if size > limit.bytes:
        raise TooLargeForLambda(too_large(_named_as(source, where, in_archive), said, limit, where))
    return source


def limit_of(source: RawSource) -> Limit:
    """The limit of a source's kind: a table, an NPZ, an image folder or an archive of one."""
    if source.kind == "images":
        return IMAGES_LIMIT
    if source.kind == "archive":
        return ARCHIVE_LIMIT
    if source.root.lower().endswith(ARRAY_SUFFIXES):
        return ARRAYS_LIMIT
    if is_compressed(source.root):
        return COMPRESSED_TABLE_LIMIT
    return WORKBOOK_LIMIT if is_workbook(source.root) else TABLE_LIMIT


def _channels(options: SourceOptions) -> int:
    return 1 if options.channels == 1 else 3  # images are read as RGB unless asked for grayscale


def _named_as(source: RawSource, where: str, in_archive: bool) -> str:
    """The source as a message names it: s3://.../v1/houses.csv, .../v1/photos/, .../v1/data.zip/houses.csv."""
    root = f"{source.root}/" if source.kind == "images" and source.root else source.root
    return f"{where}/{root}" if in_archive else f"{where}{root}"


def _pixels(size: int, count: int, channels: int, height: int, width: int) -> str:
    return f"{_size(size)} of decoded pixels ({count:,} images of {channels}x{height}x{width})"


def too_large(what: str, size: str, limit: Limit, where: str) -> str:
    """TooLargeForLambda's message: the object and its size, the kind's limit and why, what to do.
    `where` is the version's folder, or an archive's (s3://.../v1/data.zip) for its members."""
    folder = where if where.endswith("/") else where.rsplit("/", 1)[0] + "/"
    return (
        f"{what} is {size}, more than one Prepare function takes of {limit.kind}: "
        f"{_size(limit.bytes)}{limit.measure} ({limit.why}): prepare it from a machine, `smlt data prepare SOURCE "
        f"--out {folder}` (its manifest starts the run), and delete {folder}{keys.SUCCESS_MARKER}"
    )


# --- the step ----------------------------------------------------------------------------------


def prepare_upload(settings: PrepareSettings, event: PrepareDataEvent) -> DataPrepared:
    upload = upload_of(event.trigger)
    if not upload.raw:
        raise InvalidJob(f"PrepareData: s3://{upload.bucket}/{upload.key} is not a {keys.SUCCESS_MARKER} marker")
    if upload.bucket != settings.data_bucket:
        raise InvalidJob(
            f"trigger: s3://{upload.bucket}/ is not the stack's data bucket ({settings.data_bucket}): "
            "this function prepares uploads to that bucket only"
        )
    table = RunTable(settings.table, upload.run_id)
    mine = PrepareItem(execution=event.execution, key=upload.key, claimed_at=time.time())
    _, claim = table.put_once(keys.PREPARE, mine)
    if claim.execution != event.execution:
        return DataPrepared(
            action="duplicate",
            run_id=upload.run_id,
            dataset=upload.dataset_uri,
            reason=f"duplicate event: run {upload.run_id} belongs to execution {claim.execution}",
        )
    data = S3Store(upload.bucket)
    if data.exists(f"{upload.dataset_folder}/{keys.MANIFEST}"):  # this execution's earlier attempt prepared it
        return DataPrepared(
            action="plan", run_id=upload.run_id, dataset=upload.dataset_uri, reason="prepared by an earlier attempt"
        )
    # A named data error from here on refuses the version: told to the team's topic, then raised.
    with refusal_told(settings.notify_topic_arn, lambda e: refusal_of(upload, event.execution, e)):
        return _prepare_claimed(upload)


# Errors a PrepareData process that died ends with (the function's own timeout, a signal, out of memory).
RAISE_FAILED = prepare_parts.raise_failed.__name__  # the function raising a part's error again
DIED = frozenset({"Runtime.ExitError", "Lambda.Unknown", "Sandbox.Timedout", "States.Timeout"})


def _told_in_step() -> frozenset[str]:
    """The errors PrepareData tells the topic itself (`refusal_told`): InvalidDataset and its kinds."""
    names, todo = set(), [InvalidDataset]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return frozenset(names)


def _a_parts_error(cause: str) -> bool:
    """A step after a table's parts' Map raised a part's error again (`prepare_parts.raise_failed`,
    a named data error of any name, a part's timeout's too), which it told itself: its cause's
    stack trace (the Lambda runtime's, the local engine's alike) passes through `raise_failed`."""
    try:
        trace = json.loads(cause).get("stackTrace") or []
    except (ValueError, AttributeError):
        return False
    return any(f"in {RAISE_FAILED}" in str(frame) for frame in trace)


def prepare_failed(settings: PrepareSettings, event: PrepareFailedEvent) -> dict[str, Any]:
    """PrepareData, or a step after a table's parts' Map, failed for good (the state machine's Catch,
    after its retries): what it wrote into its own prepared folder deleted (`discard_partial`); its
    refusal told to the topic unless the step told it (a named data error, a part's error raised
    again) or none is told (`InvalidJob`);
    the answer's `cause` is what the execution fails with (the same error's, or for a process
    that died, what happened and what to do)."""
    upload = upload_of(event.trigger)
    error = str(event.error.get("Error") or "States.TaskFailed")
    cause = str(event.error.get("Cause") or "")
    left = discard_partial(settings, upload, event.execution)
    if error in _told_in_step() or error == InvalidJob.__name__ or _a_parts_error(cause):
        return {"cause": _with_left(cause, left)}
    try:
        said = json.loads(cause).get("errorMessage", cause)
    except (ValueError, AttributeError):
        said = cause
    where = f"s3://{upload.bucket}/{upload.folder}/"
    if error in DIED:
        what = "did not finish in the function's time" if "Time" in error else "died (out of memory, or killed)"
        message = (
            f"the Prepare function preparing {where} {what}, on its retry too ({said or error}): prepare it from a "
            f"machine, `smlt data prepare SOURCE --out {where}` (its manifest starts the run), and delete "
            f"{where}{keys.SUCCESS_MARKER}; or upload {where}{keys.SUCCESS_MARKER} again to try once more"
        )
    else:
        message = f"PrepareData failed on {where}: {said or error}"
    if settings.notify_topic_arn:
        publish_refusal(
            settings.notify_topic_arn,
            Refusal(
                pipeline=upload.pipeline,
                version=upload.version,
                error=error,
                message=message,
                upload=f"s3://{upload.bucket}/{upload.key}",
                run_id=upload.run_id,
                execution=event.execution,
            ),
        )
    return {"cause": _with_left(json.dumps({"errorType": error, "errorMessage": message}), left)}


def discard_partial(settings: PrepareSettings, upload: Upload, execution: str) -> str:
    """A preparation failed for good: the objects it wrote into its own prepared folder (this
    upload's `prepared/<pipeline>/<version>/<tag>/`: shards, a table's parts' scratch) deleted, so
    no half-written dataset is left for a listing or a later preparation to see. Only this
    execution's folder (its `PREPARE` claim) and only one without a manifest: a folder with one
    holds a whole dataset, never deleted; every other upload's and version's folder is another
    prefix. "" when done (or nothing to do), else what is left and why (for the cause)."""
    folder = f"{upload.dataset_folder}/"
    try:
        claim = RunTable(settings.table, upload.run_id).get(keys.PREPARE, PrepareItem)
        if claim is None or claim.execution != execution:
            return ""  # the folder is not this execution's (a duplicate event's, or no claim made)
        data = S3Store(upload.bucket)
        if data.exists(f"{folder}{keys.MANIFEST}"):
            return ""
        for key in data.list(folder):
            data.delete(key)
    except Exception as e:  # noqa: BLE001 - the failure is told all the same; what is left is said
        log.warning("the partial preparation under s3://%s/%s was not deleted: %s", upload.bucket, folder, e)
        return (
            f"s3://{upload.bucket}/{folder} holds objects of this failed preparation ({type(e).__name__}): delete them"
        )
    return ""


def _with_left(cause: str, left: str) -> str:
    """The execution's cause, with what a failed preparation left (`discard_partial`) said in its message."""
    if not left:
        return cause
    try:
        doc = json.loads(cause)
        doc["errorMessage"] = f"{doc.get('errorMessage', '')} ({left})"
        return json.dumps(doc)
    except (ValueError, AttributeError, TypeError):
        return f"{cause} ({left})"


def _prepare_claimed(upload: Upload) -> DataPrepared:
    """The claimed upload's data found, checked and prepared (or its parts' Maps started)."""
    job = parse_job(run_job(upload, pipeline_job(upload.bucket, upload.pipeline)))  # a bad job fails first
    where = f"s3://{upload.bucket}/{upload.folder}/"
    options = job.dataset.options()
    listing = _await_data(upload, where)
    spec = f"s3://{upload.bucket}/{keys.pipeline_features_key(upload.pipeline)}"

    parts = upload_parts.table_parts(listing, where)
    if parts is not None:  # one table in many files: the parts' Maps prepare it
        return prepare_parts.start_parts(upload, parts, options, spec, where)
    source = find_source(listing, where, options=options)
    with (
        tempfile.TemporaryDirectory(prefix="smlt-prepare-") as tmp,
        collected_notices() as notes,
        _named(tmp, where, source),
    ):
        path = _fetch(upload, source, Path(tmp), where, options)
        manifest, said = _prepare(path, upload, spec, options)
    return DataPrepared(
        action="plan",
        run_id=upload.run_id,
        dataset=upload.dataset_uri,
        reason=f"prepared {where} {said}",
        rows=manifest.train.rows + manifest.validation.rows,
        notes=[_local_names(n, tmp, where, source) for n in notes[:MAX_NOTES]],
    )


def _prepare(path: Path, upload: Upload, spec: str, options: SourceOptions) -> tuple[Manifest, str]:
    # replace: an attempt of this execution that died may have left shards (never a manifest).
    return prepare_with_features(str(path), upload.dataset_uri, spec, upload.pipeline, options=options, replace=True)


def _listing(upload: Upload) -> dict[str, int]:
    """The objects of the version's folder: name relative to it -> bytes."""
    prefix = upload.folder + "/"
    found: dict[str, int] = {}
    pages = clients.client("s3").get_paginator("list_objects_v2").paginate(Bucket=upload.bucket, Prefix=prefix)
    for page in pages:
        found.update({o["Key"][len(prefix) :]: int(o["Size"]) for o in page.get("Contents", [])})
    return found


# A marker can land while its data's multipart upload is still in progress (`aws s3 sync` gives no
# order, and a multipart object exists only once completed): with no data beside it, PrepareData
# waits up to DATA_WAIT_S for it, polling every DATA_POLL_S. 120 s fits the function's 900 s: the
# largest table prepares in about 430 s after it, with the 60 s reserve kept (prepare_limits).
DATA_WAIT_S = float(os.environ.get("SMLT_DATA_WAIT_S", "120"))
DATA_POLL_S = 2.0


def _in_progress(upload: Upload) -> list[str] | None:
    """The keys under the version's folder whose multipart upload has started and not completed
    (names relative to the folder); None when the bucket's uploads cannot be listed."""
    prefix = upload.folder + "/"
    try:
        pages = (
            clients.client("s3").get_paginator("list_multipart_uploads").paginate(Bucket=upload.bucket, Prefix=prefix)
        )
        return sorted({u["Key"][len(prefix) :] for page in pages for u in page.get("Uploads", [])})
    except Exception as e:  # noqa: BLE001 - unknown: waited for all the same
        log.warning("the multipart uploads under s3://%s/%s were not listed: %s", upload.bucket, prefix, e)
        return None


def _await_data(upload: Upload, where: str, wait_s: float | None = None) -> dict[str, int]:
    """The version's folder's listing once it holds data (a name not ignored): at once when it does,
    or when no upload into it is in progress (find_source then names what is missing); else polled
    until one is there, up to `wait_s` (DATA_WAIT_S); NoDataFile naming what it waited for after."""
    deadline = time.monotonic() + (DATA_WAIT_S if wait_s is None else wait_s)
    while True:
        listing = _listing(upload)
        pending = _in_progress(upload)
        if any(not ignored(n) for n in listing) or pending == []:
            return listing
        if time.monotonic() >= deadline:
            waited = f"PrepareData waited {DATA_WAIT_S if wait_s is None else wait_s:.0f} s"
            if pending:
                raise NoDataFile(
                    f"{where} has a {keys.SUCCESS_MARKER} marker but its data is still being uploaded ({_listed(pending)}: "
                    f"a multipart upload started, not completed) after {waited} for it: upload {where}"
                    f"{keys.SUCCESS_MARKER} again once the upload has finished (the marker is written last: it "
                    "starts the run); an upload abandoned is aborted with `aws s3api abort-multipart-upload`"
                )
            raise NoDataFile(
                f"{where} has a {keys.SUCCESS_MARKER} marker but no data beside it after {waited} for it: upload "
                f"{FORMATS} into {where}, then {keys.SUCCESS_MARKER} again (written last: the marker starts the run)"
            )
        time.sleep(DATA_POLL_S)


def _fetch(upload: Upload, source: RawSource, tmp: Path, where: str, options: SourceOptions) -> Path:
    """The source downloaded into `tmp` (an archive extracted there), checked against its kind's
    limit by what it holds once loaded (an NPZ's arrays, an image folder's pixels); its local path."""
    s3 = clients.client("s3")
    raw = tmp / "raw"
    for name in source.names:
        dest = raw / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(upload.bucket, f"{upload.folder}/{name}", str(dest))
    if source.kind != "archive":
        path = raw / source.root if source.root else raw
        _check_loaded(path, source, where, options, in_archive=False)
        return path
    archive = raw / source.root
    out = tmp / "unpacked"
    unpacked = _extract(archive, out, source, where, options)
    archive.unlink()  # /tmp holds the extraction alone from here
    wrap, names, inside = _unwrapped(unpacked, f"{where}{source.root}")
    inner = find_source(names, inside, in_archive=True, options=options)
    top = out / wrap if wrap else out
    path = top / inner.root if inner.root else top
    _check_loaded(path, inner, inside, options, in_archive=True)
    return path


def _unwrapped(sizes: dict[str, int], inside: str) -> tuple[str, dict[str, int], str]:
    """An archive's files seen from inside the one folder wrapping them all, if there is one
    (`data/houses.csv` is `houses.csv` of `.../data.zip/data`): (that folder or "", the names
    relative to it, the archive's name in messages with it)."""
    wrap = archives.wrapper(sizes)
    if not wrap:
        return "", sizes, inside
    return wrap, {n[len(wrap) + 1 :]: size for n, size in sizes.items()}, f"{inside}/{wrap}"


def _extract(
    archive: Path, out: Path, source: RawSource, where: str, options: SourceOptions | None = None
) -> dict[str, int]:
    """Extract a zip or tar (only regular files, inside `out`; smlt.runtime.data.archives); its
    files' sizes. Its members are checked first, before anything is written: the archive itself
    (readable, no encrypted member, link, name outside it or archive inside it; `__MACOSX/`,
    `.DS_Store`, `Thumbs.db` left out), as a source of their own (`find_source`: one source,
    within its kind's limit), and by their unpacked bytes against the /tmp left beside the
    download (the function's ephemeral storage) and against a zip bomb's ratio."""
    inside = f"{where}{source.root}"
    try:
        listed = archives.members(archive, inside)
        sizes = {m.name: m.size for m in listed}
        find_source(*_unwrapped(sizes, inside)[1:], in_archive=True, options=options)
        _check_tmp(sizes, out, inside, where)
        archives.check_sizes(archive, listed, inside, archives.MAX_UNPACKED_BYTES, "prepare it from a machine")
        archives.extract(archive, out, listed, inside)
    except archives.BadArchive as e:
        raise UnsupportedFormat(str(e)) from None
    return sizes


def _check_tmp(sizes: dict[str, int], out: Path, inside: str, where: str) -> None:
    """An archive whose contents would not fit the function's /tmp beside its download (and the
    rows spooled after them: TMP_SHARE of what is free) is refused before a byte is written."""
    total = sum(sizes.values())
    free = shutil.disk_usage(out.parent).free
    if total > TMP_SHARE * free:
        largest = max(sizes, key=lambda n: sizes[n])
        folder = where if where.endswith("/") else where.rsplit("/", 1)[0] + "/"
        raise TooLargeForLambda(
            f"{inside} unpacks to {_size(total)} (its largest member {largest!r}, {_size(sizes[largest])}), more "
            f"than the Prepare function's /tmp ({PREPARE_EPHEMERAL_MB:,} MB of ephemeral storage) has free beside "
            f"its download ({_size(free)}, a fifth kept for the shards' spool): prepare it from a machine, "
            f"`smlt data prepare {inside.rsplit('/', 1)[-1]} --out {folder}` (its manifest starts the run), and "
            f"delete {folder}{keys.SUCCESS_MARKER}; or upload it unpacked in parts (docs/deploy.md)"
        )


def _check_loaded(path: Path, source: RawSource, where: str, options: SourceOptions, *, in_archive: bool) -> None:
    """After the download, before loading: an NPZ by its arrays' bytes (the zip's members,
    uncompressed), an image folder by its pixels once decoded (its images' count x the first
    readable one's size, which without image_size every readable image has)."""
    kind = limit_of(source)
    if kind is ARRAYS_LIMIT and zipfile.is_zipfile(path):  # not a zip: prepare names the problem
        with zipfile.ZipFile(path) as z:
            size = sum(i.file_size for i in z.infolist())
        if size > kind.bytes:
            said = f"{_size(size)} of arrays"
            raise TooLargeForLambda(too_large(_named_as(source, where, in_archive), said, kind, where))
    if kind is IMAGES_LIMIT and not options.image_size:  # with image_size, known from the listing
        images = sorted(n for n in source.names if n.lower().endswith(IMAGE_SUFFIXES))
        from PIL import Image

        for name in images:  # the first Pillow opens: prepare leaves out (or refuses) the unreadable ones
            try:
                with Image.open(path / name.removeprefix(f"{source.root}/") if source.root else path / name) as img:
                    width, height = img.size
                break
            except Exception:
                continue
        else:
            return  # none opens: prepare refuses the folder, naming them
        size = len(images) * _channels(options) * width * height
        if size > kind.bytes:
            said = _pixels(size, len(images), _channels(options), height, width)
            raise TooLargeForLambda(too_large(_named_as(source, where, in_archive), said, kind, where))


def _local_names(text: str, tmp: str, where: str, source: RawSource) -> str:
    """`text` naming the uploaded objects instead of the function's copies of them in `tmp`
    (a file inside an archive as s3://.../v1/data.zip/houses.csv)."""
    text = text.replace(f"{tmp}/unpacked", f"{where}{source.root}")
    return text.replace(f"{tmp}/raw/", where).replace(f"{tmp}/raw", where.rstrip("/"))


@contextmanager
def _named(tmp: str, where: str, source: RawSource) -> Iterator[None]:
    """A dataset error names the uploaded object, not the function's download of it."""
    try:
        yield
    except InvalidDataset as e:
        message = _local_names(str(e), tmp, where, source)
        if message == str(e):
            raise
        raise type(e)(message) from None
