"""A raw upload of one table in many files (`part-00000.csv` ... ; smlt.runtime.steps.upload_parts)
prepared by the Prepare function's parts ops, one Distributed Map child per part and one step
after each Map (infra/stacks/workflow.py; docs/architecture.md, "Prepare"):

- PrepareData (`start_parts`) writes what every step reads to the scratch prefix
  `<dataset folder>/_parts/` (the job's source options and the pipeline's features) and answers
  the parts, the Maps' items;
- PartStats (`part_stats`, a child) fits its part (pass 1), writes `fit-<part>.json`; MergeStats
  (`merge_stats`) checks the parts' headers, merges, fixes the transforms (`fit.json`) and keeps
  what they tell the user (`notes.json`: NA markers, date columns, row numbers, label leaks);
- PartMoments (`part_moments`) encodes its part: the standardisation's moments and the imputed
  medians' second pass (`moments-<part>.json`); MergeMoments settles them (`settled.json`);
- PartShards (`part_shards`) writes its part's shards into the dataset folder (named by the part,
  shuffled within; `shards-<part>.json`): its share of the table's train shards (`spool.SHARDS`,
  what an upload of one file gets from `prepare_dataset`; smlt.runtime.data.parts), from its
  rows and the whole table's in `settled.json`, so the table has the shards one file would;
  FinishParts writes the manifest last (and for the pipeline's first version its features),
  deletes the scratch and answers as PrepareData does (with those `notes`).

A child's named error is caught inside the child (the Map never fails for it) and raised again,
by its name and message, by the step after the Map: the execution ends with the same error
(`InvalidDataset`, naming the part's object and line) as a single-function preparation would, told
to the team's topic first as the version's refusal (`handle`; smlt.runtime.notify)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from smlt.runtime import clients, keys
from smlt.runtime.data import fit_state
from smlt.runtime.data.manifest import FeatureSpec
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.parts import PartRows, merge_fits, merge_moments, part_manifest, settle
from smlt.runtime.data.prepare import TableTransforms, fit_part, part_moments, part_shards
from smlt.runtime.data.spool import SHARDS
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.notify import Refusal, refusal_told
from smlt.runtime.pipeline import read_features, version_of, write_features
from smlt.runtime.progress import collected_notices
from smlt.runtime.steps.events import (
    DataPrepared,
    MergeEvent,
    PartItem,
    PartMomentsEvent,
    PartShardsEvent,
    PartStatsEvent,
    StatsMerged,
)
from smlt.runtime.steps.prepare_limits import MAX_NOTES
from smlt.runtime.steps.upload_parts import TableParts, check_headers
from smlt.runtime.store import NotFound, S3Store
from smlt.runtime.trigger import Upload

SCRATCH = "_parts"
NOTES = "notes.json"
FIRST_NOTES = "notes-00000.json"  # what the first part's pass 1 told
TOLD = "told.json"  # the version's refusal is told (by the step after a Map that raised it)


def _scratch(folder: str, name: str) -> str:
    return f"{folder}/{SCRATCH}/{name}"


def start_parts(upload: Upload, parts: TableParts, options: SourceOptions, spec_uri: str, where: str) -> DataPrepared:
    """What every parts step reads, written once; the answer that starts the Maps."""

    features = read_features(spec_uri)
    setup: dict[str, Any] = {"options": options.model_dump(mode="json"), "spec_uri": spec_uri, "where": where}
    setup["features"] = features.model_dump(mode="json") if features is not None else None
    folder = upload.dataset_folder
    S3Store(upload.bucket).put(_scratch(folder, "job.json"), json.dumps(setup).encode())
    return DataPrepared(
        action="parts",
        run_id=upload.run_id,
        dataset=upload.dataset_uri,
        reason=f"{where} holds {len(parts.names)} parts of one table: prepared part by part",
        parts=[PartItem(part=i, key=f"{upload.folder}/{name}") for i, name in enumerate(parts.names)],
        bucket=upload.bucket,
        folder=folder,
        text=[],
    )


class _Setup:
    def __init__(self, store: S3Store, folder: str):
        raw = json.loads(store.get(_scratch(folder, "job.json")))
        self.options = SourceOptions.model_validate(raw["options"])
        self.features = FeatureSpec.model_validate(raw["features"]) if raw["features"] is not None else None
        self.spec_uri: str = raw["spec_uri"]
        self.where: str = raw["where"]


def _local(bucket: str, key: str, tmp: str) -> tuple[str, str]:
    """The part downloaded into `tmp` (its own name kept: its suffix says its format); (local path, s3 URI)."""
    path = Path(tmp) / key.rsplit("/", 1)[-1]
    clients.client("s3").download_file(bucket, key, str(path))
    return str(path), f"s3://{bucket}/{key}"


def _named(
    store: S3Store,
    event: PartStatsEvent | PartMomentsEvent | PartShardsEvent,
    error: InvalidDataset,
    local: str,
    uri: str,
) -> InvalidDataset:
    """The error naming the uploaded object instead of the function's copy of it, stored for the
    step after the Map (`raise_failed`): the Map's results keep only each failed part's error
    name, so that a thousand failed parts stay within the state's 256 KiB."""
    named = type(error)(str(error).replace(local, uri))
    blob = json.dumps({"error": type(error).__name__, "message": str(named)}).encode()
    store.put(_scratch(event.folder, f"error-{event.part:05d}.json"), blob)
    return named


def _stored(value: Any, local: str, uri: str) -> bytes:
    """Statistics stored with the object's name where they say the local copy's (messages)."""
    return fit_state.dumps(value).replace(local.encode(), uri.encode())


def part_stats(event: PartStatsEvent) -> dict[str, Any]:
    store = S3Store(event.bucket)
    setup = _Setup(store, event.folder)
    with tempfile.TemporaryDirectory(prefix="smlt-part-") as tmp:
        local, uri = _local(event.bucket, event.key, tmp)
        try:
            with collected_notices() as notes:
                fit = fit_part(local, event.part, options=setup.options, features=setup.features, text=set(event.text))
        except InvalidDataset as e:
            raise _named(store, event, e, local, uri) from None
        header = [fit.labels.name, *(c.name for c in fit.columns)]
        store.put(_scratch(event.folder, f"fit-{event.part:05d}.json"), _stored((fit, header), local, uri))
        if event.part == 0:  # the parts share a header: the first's notices (a new column ignored) are the table's
            store.put(_scratch(event.folder, FIRST_NOTES), json.dumps([n.replace(local, uri) for n in notes]).encode())
    return {"part": event.part, "rows": fit.rows}


class PartFailed(InvalidDataset):
    """A part's child failed for good with an error it did not store (its process died, it timed
    out, its requests stayed throttled through its own retries): raised by the step after the Map
    under this name, which none of that step's retriers takes. Raised by its own name
    (`Runtime.ExitError`, `Throttled`, ...), the step's retriers ran it 3 more times (and up to
    10 for `Lambda.TooManyRequestsException`), each reading the same final failure again."""


def raise_failed(event: MergeEvent) -> None:
    """The first failed child's error (in the parts' order), raised again by its name and message
    (a named dataset error stays one); an error the child did not store (a timeout, a process
    that died, a throttle) as `PartFailed`, naming the part's object and the error: it is final
    (the child's retries are over), so the step after the Map must not be retried for it."""
    failed = [r for r in event.results if "error" in r]
    if not failed:
        return
    first = min(failed, key=lambda r: int(r.get("part", 0)))
    name, part = str(first["error"]), int(first.get("part", 0))
    try:
        stored = json.loads(S3Store(event.bucket).get(_scratch(event.folder, f"error-{part:05d}.json")))
        name, message = stored["error"], stored["message"]
    except NotFound:
        message = (
            f"s3://{event.bucket}/{first.get('key', '')}: its preparation failed with {name} (after the part's own "
            "retries): upload the version's _SUCCESS again to prepare it once more"
        )
        name = PartFailed.__name__
    n = len(failed) - 1
    more = f" ({n} more part{'s' * (n > 1)} failed too)" if n else ""
    cls = PartFailed if name == PartFailed.__name__ else type(name, (InvalidDataset,), {})
    raise cls(message + more)


def merge_stats(event: MergeEvent) -> StatsMerged:
    raise_failed(event)
    store = S3Store(event.bucket)
    setup = _Setup(store, event.folder)
    n = len(event.results)
    stored = [fit_state.loads(store.get(_scratch(event.folder, f"fit-{i:05d}.json"))) for i in range(n)]
    check_headers({_name(f.path): header for f, header in stored}, setup.where)
    fits = [f for f, _ in stored]
    rows = [PartRows(f.train_rows, f.rows - f.train_rows) for f in fits]
    paths = [f.path for f in fits]
    whole = merge_fits(fits, setup.where)  # the whole table's notices name the upload, not its first part
    if whole.flipped:
        return StatsMerged(again=True, text=sorted(whole.flipped | _text(whole)))
    settle(whole, setup.where)
    with collected_notices() as notes:  # the NA markers, date columns, row numbers, leaks: the whole table's
        t = TableTransforms.of(whole)
    try:
        notes = json.loads(store.get(_scratch(event.folder, FIRST_NOTES))) + notes
    except NotFound:
        pass
    told = [n.replace(f"{paths[0]}:", f"{setup.where}:", 1) for n in notes[:MAX_NOTES]]
    store.put(_scratch(event.folder, NOTES), json.dumps(told).encode())  # FinishParts answers them
    store.put(_scratch(event.folder, "fit.json"), fit_state.dumps((whole, t, [(r.train, r.validation) for r in rows])))
    return StatsMerged(again=False)


def _name(uri: str) -> str:
    return uri.rsplit("/", 1)[-1]


def _text(fit: Any) -> set[str]:
    return {c.name for c in fit.columns if not c.numeric}


def part_moments_step(event: PartMomentsEvent) -> dict[str, Any]:
    store = S3Store(event.bucket)
    setup = _Setup(store, event.folder)
    fit, t, _ = fit_state.loads(store.get(_scratch(event.folder, "fit.json")))
    with tempfile.TemporaryDirectory(prefix="smlt-part-") as tmp:
        local, uri = _local(event.bucket, event.key, tmp)
        try:
            moments = part_moments(local, event.part, fit, t, options=setup.options, features=setup.features)
        except InvalidDataset as e:
            raise _named(store, event, e, local, uri) from None
    medians = [c.median for c in t.medians]
    store.put(_scratch(event.folder, f"moments-{event.part:05d}.json"), fit_state.dumps((moments, medians)))
    return {"part": event.part}


def merge_moments_step(event: MergeEvent) -> dict[str, Any]:
    raise_failed(event)
    store = S3Store(event.bucket)
    setup = _Setup(store, event.folder)
    fit, t, rows = fit_state.loads(store.get(_scratch(event.folder, "fit.json")))
    answers = [fit_state.loads(store.get(_scratch(event.folder, f"moments-{i:05d}.json"))) for i in range(len(rows))]
    for _, medians in answers:
        for whole, part in zip(t.medians, medians):
            whole.median.merge_again(part)
    moments = merge_moments([m for m, _ in answers])
    norm, _ = t.settle(moments, (fit.train_rows, fit.rows - fit.train_rows), setup.features)
    store.put(_scratch(event.folder, "settled.json"), fit_state.dumps((fit, t, norm, rows)))
    return {"settled": True}


def part_shards_step(event: PartShardsEvent) -> dict[str, Any]:
    store = S3Store(event.bucket)
    setup = _Setup(store, event.folder)
    fit, t, norm, rows = fit_state.loads(store.get(_scratch(event.folder, "settled.json")))
    dest = f"s3://{event.bucket}/{event.folder}/"
    with tempfile.TemporaryDirectory(prefix="smlt-part-") as tmp:
        local, uri = _local(event.bucket, event.key, tmp)
        try:
            splits = part_shards(
                local,
                event.part,
                fit,
                t,
                norm,
                dest,
                tuple(rows[event.part]),
                shards=SHARDS,  # as a single file's upload (prepare_with_features -> prepare_dataset)
                options=setup.options,
                features=setup.features,
            )
        except InvalidDataset as e:
            raise _named(store, event, e, local, uri) from None
    store.put(_scratch(event.folder, f"shards-{event.part:05d}.json"), fit_state.dumps(splits))
    return {"part": event.part, "rows": splits[0].rows + splits[1].rows}


def finish_parts(event: MergeEvent) -> DataPrepared:
    raise_failed(event)
    store = S3Store(event.bucket)
    setup = _Setup(store, event.folder)
    fit, t, norm, rows = fit_state.loads(store.get(_scratch(event.folder, "settled.json")))
    splits = [fit_state.loads(store.get(_scratch(event.folder, f"shards-{i:05d}.json"))) for i in range(len(rows))]
    current = setup.features
    generation = current.generation if current is not None else 1
    manifest = part_manifest(
        fit,
        t,
        norm,
        splits,
        name=setup.where.rstrip("/").rsplit("/", 2)[-2],
        source=setup.where,
        features=current,
        generation=generation,
    )
    store.put(f"{event.folder}/{keys.MANIFEST}", manifest.model_dump_json(indent=1).encode())  # the manifest last
    if current is None:  # the pipeline's first version fixes its features
        write_features(setup.spec_uri, manifest, generation)
        said = f"fixed the pipeline's features, generation 1 -> {setup.spec_uri}"
    else:
        said = f"with the pipeline's features (generation {current.generation}, {setup.spec_uri})"
    notes = json.loads(store.get(_scratch(event.folder, NOTES)))
    for key in store.list(f"{event.folder}/{SCRATCH}/"):
        store.delete(key)
    return DataPrepared(
        action="plan",
        run_id=event.run_id,
        dataset=f"s3://{event.bucket}/{event.folder}/",
        reason=f"prepared {setup.where} ({len(rows)} parts) {said}",
        rows=manifest.train.rows + manifest.validation.rows,
        notes=notes,
    )


def handle(event: Any, notify_topic_arn: str = "") -> dict[str, Any]:
    """A parts op of the Prepare function (its event parsed), answered as JSON. The named error
    a step after a Map raises (a part's, or MergeStats' headers) refuses the version: it is told
    to the team's topic (`notify_topic_arn`, when set) first. A child's is not: the Map catches it."""
    if isinstance(event, PartStatsEvent):
        return part_stats(event)
    if isinstance(event, PartMomentsEvent):
        return part_moments_step(event)
    if isinstance(event, PartShardsEvent):
        return part_shards_step(event)
    assert isinstance(event, MergeEvent)
    with refusal_told(notify_topic_arn, lambda e: _refusal(event, e)):
        if event.op == "merge_stats":
            return merge_stats(event).model_dump(mode="json")
        if event.op == "merge_moments":
            return merge_moments_step(event)
        return finish_parts(event).model_dump(mode="json")


def _refusal(event: MergeEvent, error: InvalidDataset) -> Refusal | None:
    """The refusal of the version whose prepared folder is the event's (prepared/<p>/<v>/<tag>),
    naming its upload's marker (beside the parts); None when a step told it already: a part's
    error raised again by a step the state machine retries (the step's own process died after it
    told it) is told once (`TOLD`, kept in the scratch before it is published)."""
    named = version_of(f"s3://{event.bucket}/{event.folder}/")
    if named is None:
        raise ValueError(f"{event.folder} is not a version's prepared folder")
    store = S3Store(event.bucket)
    told = _scratch(event.folder, TOLD)
    if store.exists(told):
        return None
    where = _Setup(store, event.folder).where
    store.put(told, json.dumps({"error": type(error).__name__, "execution": event.execution}).encode())
    return Refusal(
        pipeline=named[0],
        version=named[1],
        error=type(error).__name__,
        message=str(error),
        upload=f"{where}{keys.SUCCESS_MARKER}",
        run_id=event.run_id,
        execution=event.execution,
    )
