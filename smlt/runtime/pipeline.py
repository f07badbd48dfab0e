"""Retraining pipelines: feature generations, the champion/challenger gate, versions, rollback.

A pipeline is a folder `incoming/<pipeline>/` of the data bucket (its `job.json`, its
`features.json`, one folder per data version) and `pipelines/<pipeline>/` of the artifacts bucket
(keys: smlt.runtime.keys):

- Features: the first version prepared fixes the pipeline's FeatureSpec (generation 1); every
  later version is prepared with it, so the champion's model fits the next version's data and the
  next run warm-starts from it. `--new-features` starts generation N+1: its first run starts cold.
- The gate: a run of a version warm-starts from the champion, so its round 0 scores the champion
  on the new version's validation rows; the run's final model (the challenger) is promoted only if
  it is not worse than that by more than the job's `promotion_margin` on the job's target metric.
  Else the version is kept, rejected, with both metrics and the reason; so is a version whose
  validation rows cannot tell the two apart (fewer than MIN_GATE_ROWS, or a classification's rows
  missing some of the pipeline's classes). A generation's first version has no champion to compare
  with, and is promoted unless its validation rows are such: then it is rejected too (a first
  version of 12 rows is no better measured than a later one), and unless the champion is of an
  older generation the team went back to (a rollback, a promotion by hand) after one of this
  generation's versions was champion. On imbalanced classes the
  target metric to gate on is `val_balanced_accuracy` (the mean of the classes' recalls): a
  challenger that stops predicting a rare class can gain accuracy and is still rejected.
- A version whose prepared rows are those of another version the gate decided on, under the same
  job (the same export uploaded again under a new name), is refused before its run, naming it.
- Every version has a record (versions/<version>.json); every change of champion an append-only
  entry (promotions/), which `rollback` replays.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from smlt.runtime import keys
from smlt.runtime.data.manifest import SMALL_VALIDATION_ROWS, FeatureSpec, Manifest, feature_spec, parse_manifest
from smlt.runtime.errors import InvalidDataset, InvalidJob, SmltError
from smlt.runtime.evaluation import LOWER_IS_BETTER, class_warning
from smlt.runtime.store import NotFound, S3Store

# A triggered run waits this long (seconds) for every shard its manifest names (`aws s3 sync`
# uploads manifest.json before the shards), polling every UPLOAD_POLL_S.
UPLOAD_WAIT_S = float(os.environ.get("SMLT_UPLOAD_WAIT_S", "120"))
UPLOAD_POLL_S = 2.0


class Records(Protocol):
    """What reading a pipeline's records needs of the artifacts bucket: an S3Store, or a saved copy
    of the bucket (the local console's state folder, smlt.inference)."""

    def get(self, key: str) -> bytes: ...

    def list(self, prefix: str) -> list[str]: ...


class IncompleteUpload(InvalidDataset):
    """A version's manifest names a shard that did not arrive within UPLOAD_WAIT_S."""


class NoSuchVersion(SmltError):
    """`smlt models promote/rollback` named a version (or pipeline) that has no record."""


class Champion(BaseModel):
    """pipelines/<p>/latest.json: the model the pipeline serves."""

    run_id: str
    model: str  # s3:// URI of the final model
    version: str | None = None
    features: str | None = None  # FeatureSpec.digest() of the data it was trained on
    generation: int | None = None
    by: str = "gate"
    at: float = 0.0


class VersionRecord(BaseModel):
    """pipelines/<p>/versions/<version>.json."""

    pipeline: str
    version: str
    data: str  # s3:// folder of the prepared version
    run_id: str
    # replaced: the version was uploaded again before this run ended (a record under replaced/ only):
    # the run is not gated, its results (model, metric, cost) filled in when it ends
    status: Literal["training", "promoted", "rejected", "replaced"] = "training"
    start: str = ""  # warm (from which champion) or cold, and why
    features: str
    generation: int
    data_sha256: str | None = None  # its rows as prepared (data_digest): the same rows again are refused
    champion_run: str | None = None  # the champion the run warm-started from (scored in its round 0)
    champion_version: str | None = None
    metric: str | None = None
    challenger_value: float | None = None
    champion_value: float | None = None
    margin: float = 0.0
    reason: str = ""
    cost_usd: float | None = None
    model: str | None = None
    model_sha256: str | None = None
    promoted: bool = False
    by: str | None = None
    created_at: float = 0.0
    decided_at: float | None = None
    notify_error: str | None = None  # why the decision's notification was not sent (smlt.runtime.notify)
    notified_at: float | None = None  # when the decision was published to the team's topic (once)


# --- preparing a version (client and cloud share it) ------------------------------------------


VERSION_NAME_CHARS = 40


def version_name(folders: list[str]) -> str:
    """A data version's name from its folder(s) under incoming/<pipeline>/ (S3-key and run-id
    safe): the folder itself when it is made of letters, digits, `-` and `_` (nested folders
    joined by `-`: 2026/11 is 2026-11), within VERSION_NAME_CHARS; else those characters (others
    as `-`) and 8 hex digits of the folder's name, so two folders never share a version's record
    (`v 2` is v-2-<8 hex>, never the folder `v-2`; `été` and `ete` stay two versions)."""
    joined = "-".join(folders)
    if re.fullmatch(r"[A-Za-z0-9_-]+", joined) and len(joined) <= VERSION_NAME_CHARS:
        return joined
    digest = hashlib.sha1(joined.encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '-', joined)[: VERSION_NAME_CHARS - 9]}-{digest}"


def version_of(dataset_uri: str) -> tuple[str, str] | None:
    """(pipeline, version) of a prepared version's folder: s3://DATA/incoming/<pipeline>/<version>/
    (prepared by `smlt data prepare`) or s3://DATA/prepared/<pipeline>/<version>/<tag>/ (a raw
    upload prepared in the cloud, smlt.runtime.steps.prepare)."""
    parts = dataset_uri.removeprefix("s3://").strip("/").split("/")[1:]
    if len(parts) >= 3 and f"{parts[0]}/" == keys.INCOMING:
        return parts[1], version_name(parts[2:])
    if len(parts) == 4 and f"{parts[0]}/" == keys.PREPARED:
        return parts[1], parts[2]
    return None


def pipeline_folder(dest: str) -> tuple[str, str, str] | None:
    """(the pipeline's folder, pipeline, version) when `dest` is `.../incoming/<pipeline>/<version>/`."""
    parts = dest.rstrip("/").split("/")
    if len(parts) >= 3 and parts[-3] == "incoming" and parts[-2] and parts[-1]:
        return "/".join(parts[:-1]), parts[-2], parts[-1]
    return None


def _read(uri: str) -> bytes | None:
    if uri.startswith("s3://"):
        bucket, key = keys.parse_s3_uri(uri)
        try:
            return S3Store(bucket).get(key)
        except NotFound:
            return None
    path = Path(uri)
    return path.read_bytes() if path.exists() else None


def _write(uri: str, blob: bytes) -> None:
    if uri.startswith("s3://"):
        bucket, key = keys.parse_s3_uri(uri)
        S3Store(bucket).put(key, blob)
    else:
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        Path(uri).write_bytes(blob)


def write_features(uri: str, manifest: Manifest, generation: int) -> None:
    """The pipeline's feature spec, fixed by `manifest`'s version (its first, or a new generation)."""
    _write(uri, feature_spec(manifest, generation).model_dump_json(indent=1).encode())


def read_features(uri: str) -> FeatureSpec | None:
    blob = _read(uri)
    if blob is None:
        return None
    try:
        return FeatureSpec.model_validate_json(blob)
    except ValueError as e:
        raise InvalidDataset(f"{uri} is not a pipeline feature spec ({e}); delete it to start over") from None


def prepare_version(source: str, dest: str, *, new_features: bool = False, **kwargs: Any) -> tuple[Manifest, str]:
    """`smlt data prepare SOURCE --out .../incoming/<pipeline>/<version>/`: the version prepared
    with the pipeline's features (its features.json), or, for its first version or with
    new_features, fitting new ones that become the pipeline's next generation. Returns (the
    manifest, what was done with the features, for the user)."""
    from smlt.runtime.data.prepare import prepare_dataset

    where = pipeline_folder(dest)
    if where is None:
        if new_features:
            raise InvalidDataset(
                f"--new-features: {dest} is not a pipeline version folder (.../incoming/<pipeline>/<version>/)"
            )
        return prepare_dataset(source, dest, **kwargs), ""
    folder, pipeline, _ = where
    return prepare_with_features(source, dest, f"{folder}/features.json", pipeline, new_features=new_features, **kwargs)


def prepare_with_features(
    source: str, dest: str, spec_uri: str, pipeline: str, *, new_features: bool = False, **kwargs: Any
) -> tuple[Manifest, str]:
    """A version of `pipeline` prepared into `dest` with the pipeline's feature spec at `spec_uri`
    (the one rule of `prepare_version`, which the cloud's Prepare step shares): transformed with
    the spec, or, when there is none yet or with new_features, fitting new features that become
    the pipeline's next generation (written to `spec_uri` once the version is prepared)."""
    from smlt.runtime.data.prepare import prepare_dataset

    current = read_features(spec_uri)
    if current is not None and not new_features:
        m = prepare_dataset(source, dest, features=current, **kwargs)
        return m, f"with pipeline {pipeline}'s features (generation {current.generation}, {spec_uri})"
    generation = current.generation + 1 if current is not None else 1
    m = prepare_dataset(source, dest, generation=generation, **kwargs)
    write_features(spec_uri, m, generation)
    why = "a new generation (--new-features)" if current is not None else "its first version"
    return m, f"fixed pipeline {pipeline}'s features, generation {generation} ({why}) -> {spec_uri}"


# --- a triggered run starts --------------------------------------------------------------------


def wait_for_shards(store: S3Store, folder: str, manifest: Manifest, wait_s: float | None = None) -> None:
    """Return once every shard the manifest names is in `folder`; IncompleteUpload naming the
    first missing one after `wait_s` (UPLOAD_WAIT_S)."""
    names = [s.key for s in manifest.train.shards + manifest.validation.shards]
    deadline = time.monotonic() + (UPLOAD_WAIT_S if wait_s is None else wait_s)
    while True:
        present = set(store.list(folder + "/"))
        missing = [n for n in names if f"{folder}/{n}" not in present]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise IncompleteUpload(
                f"s3://{store.bucket}/{folder}/manifest.json names {len(missing)} shard(s) not uploaded, "
                f"the first {missing[0]!r} (waited {UPLOAD_WAIT_S:.0f} s): upload the shards, then manifest.json "
                "again (a new upload of the manifest starts a new run)"
            )
        time.sleep(UPLOAD_POLL_S)


def data_digest(manifest: Manifest) -> str:
    """The identity of a version's rows as prepared: its train and validation shards' sha256s (an
    upload of the same bytes prepares to the same shards with the pipeline's features)."""
    shards = [f"train:{s.sha256}" for s in manifest.train.shards]
    shards += [f"validation:{s.sha256}" for s in manifest.validation.shards]
    return hashlib.sha256("\n".join(shards).encode()).hexdigest()[:16]


# A run's job's fields that differ between two runs of the same training: the data, the run's
# name, and the warm start (each version's champion).
_RUN_FIELDS = ("dataset", "run_id", "warm_start", "name")


def _same_rows(
    artifacts: S3Store,
    pipeline: str,
    version: str,
    features: str,
    rows: str,
    job: dict[str, Any] | None,
    uri: str,
    bucket: str,
) -> None:
    """InvalidDataset when another version of the pipeline, decided by the gate, was trained on
    exactly these rows with the same features and the same job (its training, model, workers):
    an export uploaded again under a new name (or a copy of the wrong file) would warm-start from
    a model trained on them, be compared with it on the same validation rows, and cost a run for
    nothing. The
    same rows under a changed job train (a team retraining with other settings)."""
    for other in versions(artifacts, pipeline):
        if other.version == version or other.data_sha256 != rows or other.features != features:
            continue
        if other.decided_at is None:
            continue  # its run did not end: these rows are not trained on yet
        if job is not None:
            try:
                trained = json.loads(artifacts.get(keys.job_key(other.run_id)))
            except NotFound:
                continue  # its run's job is gone: nothing to tell the two apart by
            if {k: v for k, v in trained.items() if k not in _RUN_FIELDS} != {
                k: v for k, v in job.items() if k not in _RUN_FIELDS
            }:
                continue
        raise InvalidDataset(
            f"{uri} holds the same rows as pipeline {pipeline}'s version {other.version} (run {other.run_id}, "
            f"{other.status}), and its job is unchanged: nothing new to train on, so no run starts. Upload the new "
            f"export under {keys.INCOMING}{pipeline}/{version}/ and its {keys.SUCCESS_MARKER} again; to train on "
            f"these rows again, upload version {other.version}'s {keys.SUCCESS_MARKER} (or {keys.MANIFEST}) again "
            f"(s3://{bucket}/{keys.INCOMING}{pipeline}/{other.version}/), or change the job first"
        )


def champion(artifacts: Records, pipeline: str) -> Champion | None:
    try:
        raw = json.loads(artifacts.get(keys.pipeline_latest_key(pipeline)))
    except NotFound:
        return None
    return Champion.model_validate(raw)


def start_version(
    data: S3Store,
    artifacts: S3Store,
    pipeline: str,
    version: str,
    folder: str,
    run_id: str,
    *,
    check: Callable[[Manifest], None] | None = None,
    model: dict[str, Any] | None = None,
    job: dict[str, Any] | None = None,
) -> tuple[str | None, VersionRecord]:
    """A version's run starts: wait for its shards, decide warm or cold start from the champion
    (same features: warm; a newer generation: cold, and why; other features: a named error),
    record the version. Returns (the warm start's model URI or None, the record).

    Nothing is recorded for a run that cannot start: `check` (the job against the manifest,
    smlt.runtime.job.check_dataset) raises first, and so does a warm start whose champion was
    trained with another `model` (the job's, as JSON) than the job's, whose weights do not fit it,
    and a version whose rows another version was already trained on and judged with under the same
    `job` (the run's, `_same_rows`)."""
    uri = f"s3://{data.bucket}/{folder}/"
    try:
        manifest = parse_manifest(data.get(f"{folder}/manifest.json"), f"{uri}manifest.json")
    except NotFound:
        raise InvalidDataset(f"no {uri}manifest.json") from None
    wait_for_shards(data, folder, manifest)
    if check is not None:
        check(manifest)
    spec = feature_spec(manifest)
    digest = spec.digest()
    champ = champion(artifacts, pipeline)
    warm: str | None = None
    if champ is None:
        start = "cold: the pipeline's first version"
    elif champ.features == digest:
        warm = champ.model
        start = f"warm: from the champion {champ.version or '?'} (run {champ.run_id}), same features"
    elif champ.features is None or (champ.generation or 1) < spec.generation:
        start = (
            f"cold: feature generation {spec.generation} (new features; the champion {champ.version or '?'} "
            f"has generation {champ.generation or 1}), so the champion's model does not fit"
        )
    else:
        raise InvalidDataset(
            f"{uri} was prepared with features other than pipeline {pipeline}'s (generation "
            f"{champ.generation}): prepare it with `smlt data prepare SOURCE --out {uri}`, which applies "
            f"s3://{data.bucket}/{keys.pipeline_features_key(pipeline)}, or add --new-features to start a new "
            "generation (its run starts cold)"
        )
    key = keys.pipeline_version_key(pipeline, version)
    try:
        known: VersionRecord | None = VersionRecord.model_validate_json(artifacts.get(key))
    except NotFound:
        known = None
    if known is not None and known.run_id == run_id:
        return warm, known  # a later round, or a duplicate event, of a run that exists: nothing to record again
    if warm is not None and champ is not None and model is not None:
        _same_model(artifacts, champ, model, pipeline, version, data.bucket)
    rows = data_digest(manifest)
    _same_rows(artifacts, pipeline, version, digest, rows, job, uri, data.bucket)
    if known is not None:  # the version uploaded again: its earlier upload's record is kept, not overwritten
        if known.decided_at is None:  # its run has not ended: it never will be the version's, nor gated
            known = known.model_copy(
                update={
                    "status": "replaced",
                    "reason": f"the version was uploaded again (run {run_id}) before this run ended: not gated",
                }
            )
        artifacts.put(
            keys.pipeline_replaced_key(pipeline, version, known.run_id), known.model_dump_json(indent=1).encode()
        )
    record = VersionRecord(
        pipeline=pipeline,
        version=version,
        data=uri,
        run_id=run_id,
        start=start,
        features=digest,
        generation=spec.generation,
        data_sha256=rows,
        champion_run=champ.run_id if warm and champ else None,
        champion_version=champ.version if warm and champ else None,
        created_at=time.time(),
    )
    artifacts.put(key, record.model_dump_json(indent=1).encode())
    return warm, record


def _same_model(
    artifacts: S3Store, champ: Champion, model: dict[str, Any], pipeline: str, version: str, bucket: str
) -> None:
    """InvalidJob when the pipeline's job now names another model than the champion's run did (its
    job.json): the champion's weights, which the run starts from, fit their own model only."""
    try:
        trained = json.loads(artifacts.get(keys.job_key(champ.run_id))).get("model")
    except NotFound:
        return  # a champion whose run's job is gone: the warm start's own check tells
    if trained is None or trained == model:
        return
    raise InvalidJob(
        f"model: incoming/{pipeline}/job.json names {_model_said(model)}, but the champion "
        f"{champ.version or '?'} (run {champ.run_id}), which this version's run starts from, is {_model_said(trained)}: "
        f"its weights fit that model only. Put the model back in job.json and upload version {version}'s "
        f"{keys.SUCCESS_MARKER} (or {keys.MANIFEST}) again; or, to change the model, prepare the version as a new "
        f"features generation (its run starts cold): `smlt data prepare SOURCE --out "
        f"s3://{bucket}/{keys.INCOMING}{pipeline}/{version}/ --new-features`"
    )


def _model_said(model: dict[str, Any]) -> str:
    params = model.get("params") or {}
    return f"{model.get('name')!r}" + (f" with params {json.dumps(params, sort_keys=True)}" if params else "")


# --- the gate at Finalize ---------------------------------------------------------------------

# The fewest validation rows the gate compares a challenger with the champion on, unless the job's
# `promotion_min_rows` says another: below it one row moves an accuracy by more than 3 points, more
# than any margin a team sets, so a version this small (a partial export, a test upload) is
# rejected, saying so, and the champion stays. The same line prepare warns at
# (manifest.SMALL_VALIDATION_ROWS): one rule.
MIN_GATE_ROWS = SMALL_VALIDATION_ROWS


@dataclass(frozen=True)
class Validation:
    """The version's validation split as the run measured it (Finalize reads it from META): its
    rows, its rows by class (a bincount: it ends at its last class present) and the pipeline's
    classes, for a classification."""

    rows: int
    class_rows: list[int] | None = None
    classes: list[str] | None = None


# S3 requests `conclude` makes (the run's own bill counts them): GETs of the version record and
# latest.json, PUTs of the record and, when it promotes, of latest.json and a promotion entry.
CONCLUDE_GETS, CONCLUDE_PUTS = 2, 3


def conclude(
    artifacts: S3Store,
    dataset_uri: str,
    run_id: str,
    model_uri: str,
    metric: str,
    margin: float,
    challenger: float | None,
    champion_scored: float | None,
    cost_usd: float,
    model_sha256: str | None,
    validation: Validation | None = None,
    min_rows: int = MIN_GATE_ROWS,
) -> VersionRecord | None:
    """Finalize of a pipeline run: promote its model or keep it rejected (see the module doc).
    `champion_scored` is the run's round 0 metric, the champion on this version's validation rows;
    `validation` those rows, which the gate must be able to compare on (`_not_comparable`: at
    least `min_rows`, the job's `promotion_min_rows`)."""
    where = version_of(dataset_uri)
    if where is None:
        return None  # a run of the pipeline not started by an upload: nothing to gate
    pipeline, version = where
    try:
        record = VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key(pipeline, version)))
    except NotFound:
        return None
    if record.run_id != run_id:  # the version was uploaded again since: its newer run decides
        _replaced_run_ended(artifacts, pipeline, version, run_id, metric, challenger, cost_usd, model_uri, model_sha256)
        return None
    current = champion(artifacts, pipeline)
    if record.decided_at is not None:
        return _decided(artifacts, record, current)
    promote, reason = _verdict(record, current, metric, margin, challenger, champion_scored, validation, min_rows)
    if promote and record.champion_run is None and current is not None:
        older = _older_generation_chosen(artifacts, record, current)
        if older is not None:
            promote, reason = False, older
    now = time.time()
    record = record.model_copy(
        update={
            "status": "promoted" if promote else "rejected",
            "metric": metric,
            "challenger_value": challenger,
            "champion_value": champion_scored if record.champion_run else None,
            "margin": margin,
            "reason": reason,
            "cost_usd": cost_usd,
            "model": model_uri,
            "model_sha256": model_sha256,
            "promoted": promote,
            "by": "gate" if promote else None,
            "decided_at": now,
        }
    )
    artifacts.put(keys.pipeline_version_key(pipeline, record.version), record.model_dump_json(indent=1).encode())
    if promote:
        _make_champion(artifacts, record, "gate", "promote", now)
    return record


def _replaced_run_ended(
    artifacts: S3Store,
    pipeline: str,
    version: str,
    run_id: str,
    metric: str,
    challenger: float | None,
    cost_usd: float,
    model_uri: str,
    model_sha256: str | None,
) -> None:
    """A run whose version was uploaded again while it trained ended: its record under replaced/
    (status `replaced`) gets what it ended with (its model, metric, cost), still not gated; once
    (a Finalize retried finds it filled)."""
    key = keys.pipeline_replaced_key(pipeline, version, run_id)
    try:
        record = VersionRecord.model_validate_json(artifacts.get(key))
    except NotFound:
        return
    if record.status != "replaced" or record.decided_at is not None:
        return
    ended = record.model_copy(
        update={
            "metric": metric,
            "challenger_value": challenger,
            "cost_usd": cost_usd,
            "model": model_uri,
            "model_sha256": model_sha256,
            "decided_at": time.time(),
        }
    )
    artifacts.put(key, ended.model_dump_json(indent=1).encode())


def _decided(artifacts: S3Store, record: VersionRecord, current: Champion | None) -> VersionRecord:
    """The gate decided this version already: Finalize runs again (its first attempt died after
    the gate, before it answered). The decision stands; it is not taken again against a champion
    that is now this version itself ("the champion changed during the run" turned a promoted
    version's record into a rejected one while latest.json named it). A promotion the first
    attempt recorded but did not finish (it died before latest.json) is finished, unless the
    champion has moved on from the one the gate compared with, or a change of champion came after
    the decision (an entry under promotions/ keyed later than the decision's own: a rollback to
    exactly the champion the gate compared with, a promotion by hand): a retry never undoes a
    later human decision."""
    if not (record.promoted and record.by == "gate") or (current.run_id if current else None) != record.champion_run:
        return record
    decided_at = record.decided_at or time.time()
    own = keys.pipeline_promotion_key(record.pipeline, int(decided_at * 1_000_000_000))
    if artifacts.list(keys.pipeline_promotions_prefix(record.pipeline), start_after=own):
        return record  # decided on since: that decision stands
    _make_champion(artifacts, record, "gate", "promote", decided_at)
    return record


def _older_generation_chosen(artifacts: S3Store, record: VersionRecord, current: Champion) -> str | None:
    """Why a cold-started version is not promoted over a champion of an older features generation
    that the team chose over this generation (rolled back to it, or promoted it by hand, after a
    version of this generation had been champion), else None. A generation's first version replaces
    the older generation's champion without comparison, the two models reading different features;
    once the team has gone back from that generation, a later version of it would undo their
    choice unseen."""
    if (current.generation or 1) >= record.generation:
        return None
    earlier = [
        r.version
        for r in versions(artifacts, record.pipeline)
        if r.generation == record.generation and r.promoted and r.run_id != record.run_id
    ]
    if not earlier:
        return None
    return (
        f"no champion of feature generation {record.generation} to compare with: the champion {current.version} "
        f"(generation {current.generation or 1}) was chosen over generation {record.generation}'s "
        f"{', '.join(earlier)} (rolled back to, or promoted by hand), and a model of other features cannot be "
        f"compared with it: the champion {current.version} stays (`smlt models promote {record.pipeline} "
        f"{record.version}` to serve this version)"
    )


def _verdict(
    record: VersionRecord,
    current: Champion | None,
    metric: str,
    margin: float,
    challenger: float | None,
    scored: float | None,
    validation: Validation | None = None,
    min_rows: int = MIN_GATE_ROWS,
) -> tuple[bool, str]:
    if challenger is None:
        return False, f"the challenger has no {metric}" + _unmeasured(metric)
    if record.champion_run is None:
        problem = _not_comparable(validation, min_rows) if validation is not None else None
        if problem is None:
            return True, f"no champion to compare with ({record.start})"
        # nothing to compare, but a version a later one would be rejected for is no champion either
        stays = f"the champion {current.version} stays" if current is not None else "the pipeline has no champion yet"
        return False, (
            f"no champion to compare with, but {problem}: {stays} (upload the version again with more rows, or "
            f"`smlt models promote {record.pipeline} {record.version}` to serve it anyway)"
        )
    if current is None or current.run_id != record.champion_run:
        now = current.version if current else "none"
        return False, (
            f"the champion changed during the run (from {record.champion_version} to {now}): "
            f"compare by hand and `smlt models promote {record.pipeline} {record.version}`"
        )
    if scored is None:
        return False, (
            f"the champion could not be re-scored on this version's validation rows (round 0's {metric})"
            + _unmeasured(metric)
        )
    lower = metric in LOWER_IS_BETTER
    worse_by = challenger - scored if lower else scored - challenger
    verdict = f"{metric} {challenger:.4g} vs the champion {record.champion_version}'s {scored:.4g} on the same rows"
    problem = _not_comparable(validation, min_rows) if validation is not None else None
    if problem is not None:
        return False, (
            f"{verdict}, but {problem}: the champion {record.champion_version} stays (upload the version again with "
            f"more rows, or `smlt models promote {record.pipeline} {record.version}` to serve it anyway)"
        )
    if worse_by > margin:
        return False, f"{verdict}: worse by {worse_by:.4g}, more than the margin {margin:g}"
    return True, f"{verdict}: not worse by more than the margin {margin:g}"


def _not_comparable(validation: Validation, min_rows: int = MIN_GATE_ROWS) -> str | None:
    """Why the version's validation rows cannot tell a challenger from the champion, else None:
    fewer than `min_rows` (the job's `promotion_min_rows`, MIN_GATE_ROWS unless it says), or a classification's rows missing some of the pipeline's
    classes (a filtered export: a model that predicts the classes present everywhere scores best
    on them, however it does on the others)."""
    said = []
    if 0 < validation.rows < min_rows:  # 0: a run made before META counted them
        said.append(
            f"the version's validation split has {validation.rows} row{'s' * (validation.rows != 1)}, fewer than "
            f"the {min_rows} the gate compares on (the job's promotion_min_rows)"
        )
    counts, classes = validation.class_rows, validation.classes
    if counts is not None and classes:
        absent = [c for i, c in enumerate(classes) if i >= len(counts) or counts[i] == 0]
        if absent:
            shown = ", ".join(repr(c) for c in absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5 else "")
            said.append(
                f"its validation rows hold {len(classes) - len(absent)} of the pipeline's {len(classes)} classes "
                f"(none of {shown}: a filtered export?), so a model that no longer predicts "
                f"{'it' if len(absent) == 1 else 'them'} is not seen"
            )
    return "; ".join(said) or None


def _unmeasured(metric: str) -> str:
    if metric == "val_balanced_accuracy":
        return " (balanced accuracy needs every worker's per-class sums of the whole validation split)"
    return ""


def _make_champion(artifacts: S3Store, record: VersionRecord, by: str, action: str, now: float) -> Champion:
    assert record.model is not None
    champ = Champion(
        run_id=record.run_id,
        model=record.model,
        version=record.version,
        features=record.features,
        generation=record.generation,
        by=by,
        at=now,
    )
    entry = {"action": action, "version": record.version, "run_id": record.run_id, "by": by, "at": now}
    # keyed by the change's own time: a retried Finalize finishing its gate's promotion (`now` is
    # the decision's time) writes the same entry again, not a second one
    at_ns = int(now * 1_000_000_000)
    artifacts.put(keys.pipeline_promotion_key(record.pipeline, at_ns), json.dumps(entry).encode())
    artifacts.put(keys.pipeline_latest_key(record.pipeline), champ.model_dump_json(indent=1).encode())
    return champ


# --- smlt models ------------------------------------------------------------------------------


def versions(artifacts: Records, pipeline: str) -> list[VersionRecord]:
    """Every version of the pipeline, oldest first."""
    found = [
        VersionRecord.model_validate_json(artifacts.get(k))
        for k in artifacts.list(keys.pipeline_versions_prefix(pipeline))
    ]
    return sorted(found, key=lambda r: r.created_at)


def replaced(artifacts: Records, pipeline: str) -> dict[str, list[VersionRecord]]:
    """The records of versions uploaded again since, by version, oldest first."""
    found: dict[str, list[VersionRecord]] = {}
    for key in artifacts.list(keys.pipeline_replaced_prefix(pipeline)):
        record = VersionRecord.model_validate_json(artifacts.get(key))
        found.setdefault(record.version, []).append(record)
    return {v: sorted(rs, key=lambda r: r.created_at) for v, rs in found.items()}


def run_class_warning(artifacts: Records, run_id: str) -> str | None:
    """A version's run's class warning (smlt.runtime.evaluation.class_warning: a class its final
    model never predicts, or a balanced accuracy well below its accuracy), from its metrics.json's
    final metrics and its model card's class names, as the run ended with it; None without one (or
    before the run has its metrics)."""
    from smlt.runtime.modelcard import card_key

    try:
        final = json.loads(artifacts.get(keys.final_metrics_key(run_id))).get("final") or {}
    except NotFound:
        return None
    try:
        classes = json.loads(artifacts.get(card_key(run_id))).get("classes")
    except NotFound:
        classes = None
    return class_warning(final, classes)


def promote(artifacts: S3Store, pipeline: str, version: str, by: str) -> Champion:
    """Make a version's model the champion by hand (a rejected one too): recorded with `by`."""
    record = _version(artifacts, pipeline, version)
    if record.model is None:
        raise NoSuchVersion(f"pipeline {pipeline}: version {version} has no model yet (its run is {record.status})")
    record = record.model_copy(update={"promoted": True, "status": "promoted", "by": by})
    artifacts.put(keys.pipeline_version_key(pipeline, version), record.model_dump_json(indent=1).encode())
    return _make_champion(artifacts, record, by, "promote", time.time())


def rollback(artifacts: S3Store, pipeline: str, by: str) -> Champion:
    """The champion before the current one is the champion again (promotions replayed: a promotion
    pushes a version, a rollback pops one)."""
    stack = champions_stack(artifacts, pipeline)
    if len(stack) < 2:
        raise NoSuchVersion(
            f"pipeline {pipeline}: nothing to roll back to "
            f"({'no champion yet' if not stack else f'{stack[0][0]} is its only champion so far'})"
        )
    version, run_id = stack[-2]
    record = _version(artifacts, pipeline, version)
    if record.run_id != run_id:  # that version was uploaded again since: its champion is the earlier upload's run
        try:
            record = VersionRecord.model_validate_json(
                artifacts.get(keys.pipeline_replaced_key(pipeline, version, run_id))
            )
        except NotFound:
            raise NoSuchVersion(
                f"pipeline {pipeline}: the champion before the current one is version {version}'s run {run_id}, "
                f"whose record was replaced by a later upload of {version} (run {record.run_id}): "
                f"its model is still s3://.../{keys.final_model_key(run_id)}"
            ) from None
    return _make_champion(artifacts, record, by, "rollback", time.time())


def champions_stack(artifacts: Records, pipeline: str) -> list[tuple[str, str]]:
    """The champions in promotion order, rollbacks popped: (version, run id) each (a version
    uploaded again is another run, and another champion)."""
    stack: list[tuple[str, str]] = []
    for key in artifacts.list(keys.pipeline_promotions_prefix(pipeline)):
        entry = json.loads(artifacts.get(key))
        this = (entry["version"], entry["run_id"])
        if entry["action"] == "rollback":
            if len(stack) > 1 and stack[-2] == this:
                stack.pop()
        elif not stack or stack[-1] != this:
            stack.append(this)
    return stack


def _version(artifacts: Records, pipeline: str, version: str) -> VersionRecord:
    try:
        return VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key(pipeline, version)))
    except NotFound:
        known = [r.version for r in versions(artifacts, pipeline)]
        if not known:
            raise _no_pipeline(artifacts, pipeline) from None
        raise NoSuchVersion(
            f"pipeline {pipeline} has no version {version!r}; its versions: {', '.join(known)}"
        ) from None


def pipeline_names(artifacts: Records) -> list[str]:
    """Every pipeline with a record in the artifacts bucket."""
    return sorted({k[len(keys.PIPELINES) :].split("/", 1)[0] for k in artifacts.list(keys.PIPELINES)} - {""})


def _no_pipeline(artifacts: Records, pipeline: str) -> NoSuchVersion:
    names = pipeline_names(artifacts)
    return NoSuchVersion(
        f"no pipeline {pipeline!r} has a version recorded"
        + (f"; the pipelines: {', '.join(names)}" if names else " (no pipeline has run yet)")
    )


def model_of(artifacts: Records, pipeline: str, version: str) -> tuple[Champion | VersionRecord, str]:
    """What `PIPELINE@latest` (the champion: the model the pipeline serves) or `PIPELINE@VERSION`
    (that data version's model, promoted or not, as `smlt models list` names it) points at: the
    record and its model's s3:// URI; NoSuchVersion listing what exists."""
    if version == "latest":
        champ = champion(artifacts, pipeline)
        if champ is not None:
            return champ, champ.model
        known = versions(artifacts, pipeline)
        if not known:
            raise _no_pipeline(artifacts, pipeline)
        listed = ", ".join(f"{r.version} ({r.status})" for r in known)
        raise NoSuchVersion(
            f"pipeline {pipeline} has no champion yet (its versions: {listed}): name one, {pipeline}@VERSION"
        )
    record = _version(artifacts, pipeline, version)
    if record.model is None:
        with_model = [r.version for r in versions(artifacts, pipeline) if r.model]
        raise NoSuchVersion(
            f"pipeline {pipeline}: version {version} has no model yet (its run {record.run_id} is {record.status})"
            + (f"; versions with a model: {', '.join(with_model)}" if with_model else "")
        )
    return record, record.model
