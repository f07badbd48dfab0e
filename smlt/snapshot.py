"""Local runs survive their process: after every round the run's S3 objects and DynamoDB items
are copied to a folder, OUT/.state/runs/<run id>/, and `smlt resume` loads them into a fresh
engine. Each run has its own folder, so several runs share one --out; a live run holds an OS lock
on its folder (`run_lock`), so a second live run with the same id is refused and a crash frees it.

(On AWS the buckets and the table are the checkpoint; this is the local engine's equivalent.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from smlt.folderlock import folder_lock
from smlt.runtime import keys, ledger
from smlt.runtime.data.manifest import parse_manifest
from smlt.runtime.errors import DamagedState, RunInProgress, RunNotFound, SmltError
from smlt.runtime.items import PlanItem, RoundItem
from smlt.runtime.model_store import model_sha256
from smlt.runtime.records import RunTable, to_item
from smlt.runtime.store import NotFound, S3Store
from smlt.runtime.validation import describe


class Snapshot:
    """The run's state in `state_dir`, brought up to date by `save()` after every round.

    A snapshot holds what a resumed run needs to plan round r+1 afresh, r being the newest
    aggregated round, and what its bill and its reconciliation (`smlt verify --local`) need of
    rounds 0..r: the META item; of each round its PLAN, ROUND, SEAL, WORKER, ERROR and ATTEMPT
    items; the run's objects (updates included) but the sync mode's gradient exchange; and
    model r+1. The round in progress is left out, so a resume never meets half a round, but for
    its ATTEMPT items, saved as each invocation ends (`save_in_flight`): AWS bills them whether
    or not the round is ever aggregated, so a resume bills them with the round it runs again.
    A straggler's item, written rounds after its round was saved with the aggregator's estimate
    of it, is saved as it lands too (`save_in_flight` reads the rounds whose estimate stands). A
    finished run's last save adds every ATTEMPT item not saved yet (Finalize's, a stop plan's,
    a duplicated delivery's).
    Every save reads only what is new: the new rounds' items, and the keys after round r (S3
    lists in key order; objects are written once under per-round keys); the dataset's keys
    once. A save that finds no new round writes nothing. Thread-safe: the engine's hook and the
    follower's poll both save."""

    def __init__(self, engine, names, run_id: str, state_dir: Path):
        self.engine, self.names, self.run_id, self.state_dir = engine, names, run_id, state_dir
        self.saved: set[str] = set()  # the sort keys in items.json (the items themselves are on disk only)
        self._file = _ItemsFile(state_dir / "items.json")
        self.newest = -1  # the newest aggregated round in the snapshot
        self.after: str | None = None  # artifacts keys up to here are copied
        self.dataset_copied = False
        self._lock = threading.Lock()
        self._unreported: list[tuple[RoundItem, PlanItem | None]] = []
        self._meta: dict[str, Any] | None = None  # META as saved last (an in-flight save keeps it)
        # (round, worker) of each saved estimated ATTEMPT item its worker's own item has not replaced
        # yet (a straggler still running): `save_in_flight` reads those rounds too, so the item the
        # straggler writes when it ends is saved even if the run crashes before its last save.
        self._standing: set[tuple[int, int]] = set()

    def save(self, final: bool = False, rounds_only: bool = False) -> None:
        """Add the ROUND items aggregated since the last save and their plans; copy the new
        objects. `final`: also META's last state and the objects a finished run wrote outside
        the round prefixes (final/), read in full. `rounds_only`: nothing before the first
        round is aggregated (a run refused at its first plan leaves no state).

        Items are kept as stored (META and PLAN as read, ROUND as its model stores it): a
        snapshot is a copy of the partition, read back by `restore_snapshot`."""
        with self._lock:
            self._save(final, rounds_only)

    def save_in_flight(self) -> None:
        """Add the ATTEMPT items of the round in progress that are not saved yet (each
        invocation's, as it ends), once a round is saved: a crash then loses from the bill only
        the invocations running at that moment. Before the first round nothing is saved (a run
        refused at its first plan leaves no state; one that crashed there starts again). META
        stays as saved last: the round in progress may have changed it."""
        with self._lock:
            if self.newest < 0 or self._meta is None:
                return
            table = RunTable(self.names.table, self.run_id, client=self.engine.client("dynamodb"))
            rounds = sorted({self.newest + 1, *(r for r, _ in self._standing)})
            found = [i for r in rounds for i in table.query(ledger.round_prefix(r))]
            new = [i for i in found if i["sk"] not in self.saved]
            if new:
                self._file.write(self._meta, new)
                self.saved.update(i["sk"] for i in new)
                self._note_attempts(new)

    def _note_attempts(self, items: list[dict[str, Any]]) -> None:
        """Keep `_standing` up to date with saved ATTEMPT items: an estimate adds its worker, the
        worker's own item of that round removes it."""
        for i in items:
            if not str(i.get("sk", "")).startswith(ledger.PREFIX) or i.get("worker") is None or i.get("round") is None:
                continue
            at = (int(i["round"]), int(i["worker"]))
            if i.get("estimated"):
                if not any(
                    int(j.get("round", -1)) == at[0] and j.get("worker") == i.get("worker") and not j.get("estimated")
                    for j in items
                    if str(j.get("sk", "")).startswith(ledger.PREFIX) and j.get("round") is not None
                ):
                    self._standing.add(at)
            else:
                self._standing.discard(at)

    def take_new(self) -> list[tuple[RoundItem, PlanItem | None]]:
        """The rounds saved since the last call, in round order, with their plans (to report)."""
        with self._lock:
            new, self._unreported = self._unreported, []
        return new

    def _save(self, final: bool, rounds_only: bool) -> None:
        table = RunTable(self.names.table, self.run_id, client=self.engine.client("dynamodb"))
        new_rounds = table.rounds(after=self.newest if self.newest >= 0 else None)
        new_rounds = [r for r in new_rounds if keys.round_sk(r.round) not in self.saved]
        if not new_rounds and not final and (rounds_only or keys.META in self.saved):
            return  # nothing aggregated since the last save
        got = table.get_many(keys.META, *(keys.plan_sk(r.round) for r in new_rounds))
        meta = got[keys.META]
        if meta is None:
            return
        added: list[dict[str, Any]] = []
        for r in new_rounds:
            sk = keys.round_sk(r.round)
            added.append({"pk": table.pk, "sk": sk, **r.attrs()})
            plan = got[keys.plan_sk(r.round)]
            if plan is not None:
                added.append(plan)
            self._unreported.append((r, PlanItem.model_validate(plan) if plan is not None else None))
            added.extend(i for i in _round_records(table, r.round) if i["sk"] not in self.saved)
        if final:  # attempts of no aggregated round, and any that landed after their round's save
            new = {i["sk"] for i in added}
            added.extend(i for i in table.query(ledger.PREFIX) if i["sk"] not in self.saved and i["sk"] not in new)
        self.newest = max([self.newest, *(r.round for r in new_rounds)])
        artifacts = S3Store(self.names.artifacts_bucket, client=self.engine.client("s3"))
        objects = _listed(artifacts, keys.run_prefix(self.run_id), start_after=None if final else self.after)
        self._copy(artifacts, [k for k in objects if _kept(k, self.newest)], objects)
        # Round newest+1's prefix gains its updates after model newest+1: list it again next time.
        self.after = keys.round_prefix(self.run_id, self.newest + 1)
        if not self.dataset_copied:
            bucket, prefix = _dataset_location(meta)
            data = S3Store(bucket, client=self.engine.client("s3"))
            self._copy(data, data.list(prefix))
            self.dataset_copied = True
        self._file.write(meta, added)
        self._meta = meta
        self.saved.update([keys.META, *(i["sk"] for i in added)])
        self._note_attempts(added)

    def _copy(self, store: S3Store, listed: list[str], modified: dict[str, float] | None = None) -> None:
        """Copy new objects; each file's mtime is its object's LastModified where listed (what
        the reconciliation reads to tell an update uploaded after its round's seal)."""
        folder = self.state_dir / "s3" / store.bucket
        for key in listed:
            # Objects under a run are written once (keys are per round), so copy only new ones.
            path = folder / key
            if path.exists():
                continue
            try:
                data = store.get(key)
            except NotFound:  # deleted since the listing: nothing to keep
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            if modified and key in modified:
                os.utime(tmp, (modified[key], modified[key]))
            tmp.replace(path)


def _listed(store: S3Store, prefix: str, start_after: str | None) -> dict[str, float]:
    """{key: LastModified, epoch seconds} under prefix, in key order (after `start_after`)."""
    extra = {"StartAfter": start_after} if start_after else {}
    out: dict[str, float] = {}
    for page in store.client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix, **extra):
        out.update({o["Key"]: o["LastModified"].timestamp() for o in page.get("Contents", [])})
    return out


def _round_records(table: RunTable, rnd: int) -> list[dict[str, Any]]:
    """What the bill and the reconciliation read of an aggregated round besides its ROUND and
    PLAN items: its seal, its workers' records and named errors, and its invocations' ATTEMPTs."""
    seal = table.get_many(keys.seal_sk(rnd))[keys.seal_sk(rnd)]
    found = [seal] if seal is not None else []
    for prefix in (keys.worker_prefix(rnd), keys.error_sk(rnd, 0)[:-5], ledger.round_prefix(rnd)):
        found.extend(table.query(prefix))
    return found


class _ItemsFile:
    """items.json: the JSON list of the saved items, META first (it changes), then the ROUND and
    PLAN items in the order they were saved (never changed once saved). Each write is a new file
    renamed over the old one (atomic: a crash mid-write keeps the previous state); the items saved
    before are copied from the previous file, not kept in memory, so a long run's state costs the
    runner nothing per round."""

    def __init__(self, path: Path):
        self.path = path
        self._meta = 0  # bytes of META's JSON in the file written last
        self._rest = 0  # bytes of the other items after it (each one ", " + its JSON)

    def write(self, meta: dict[str, Any], added: list[dict[str, Any]]) -> None:
        head = ("[" + _encode(meta)).encode()
        tail = "".join(", " + _encode(i) for i in added).encode()
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("wb", buffering=0) as out:  # unbuffered: the copy below writes to its descriptor
            out.write(head)
            if self._rest:
                with self.path.open("rb") as old:
                    _copy_range(old.fileno(), out.fileno(), 1 + self._meta, self._rest)
            out.write(tail + b"]")  # the same bytes as json.dumps of the list, item by item
        tmp.replace(self.path)
        self._meta, self._rest = len(head) - 1, self._rest + len(tail)


DIGEST = "smlt:digest"  # each saved item's own digest, in the item (one file, one atomic rename)


def _encode(item: dict[str, Any]) -> str:
    """An item's JSON with its digest: sha256 of the item as it reads back, and a short digest
    of each field (nested objects field by field), so an edit is named down to the field."""
    value = json.loads(json.dumps(item, default=str))
    value.pop(DIGEST, None)
    value[DIGEST] = {"sha256": _sha256_of(value), "fields": _field_digests(value)}
    return json.dumps(value)


def _sha256_of(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _field_digests(value: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, dict) and v:
            out.update(_field_digests(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = _sha256_of(v)[:12]
    return out


def _check_digests(items_file: Path, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items without their digests, or DamagedState naming the first item (and its fields)
    that is not what was saved. A state saved before items carried digests has none: unchecked."""
    digests = [i.pop(DIGEST, None) if isinstance(i, dict) else None for i in items]
    if not any(digests):
        return items
    for item, digest in zip(items, digests, strict=True):
        name = f"{item.get('sk')!r} of {item.get('pk')!r}" if isinstance(item, dict) else repr(item)[:60]
        if not isinstance(digest, dict) or not isinstance(item, dict):
            _damaged(items_file, f"item {name} has no digest (it was added after the state was saved)")
        if _sha256_of(item) == digest.get("sha256"):
            continue
        saved = digest.get("fields") or {}
        now = _field_digests(item)
        changed = sorted(f for f in set(saved) | set(now) if saved.get(f) != now.get(f))
        fields = ", ".join(changed) or "its digest"
        _damaged(
            items_file, f"item {name} was changed after it was saved (field {fields} no longer matches its digest)"
        )
    return items


def _copy_range(src: int, out: int, offset: int, length: int) -> None:
    """`length` bytes of file descriptor `src` from `offset` to descriptor `out` (at its position).
    In the kernel where it can (copy_file_range: the file grows ~3 KB a round, and copying it
    through Python every round made a long run's rounds slower by its end); else in small pieces
    (no 1 MB buffer to allocate and free every round)."""
    end = offset + length
    while offset < end:
        try:
            done = os.copy_file_range(src, out, end - offset, offset)
        except (AttributeError, OSError):  # not Linux, or a file system that cannot
            piece = os.pread(src, min(1 << 16, end - offset), offset)
            done = os.write(out, piece) if piece else 0
        if not done:
            raise OSError(f"the saved state's items file was cut short while a save copied it (at byte {offset})")
        offset += done


def _kept(key: str, newest: int) -> bool:
    """Objects a resume or a reconciliation needs: everything of the aggregated rounds but the
    sync mode's gradient exchange (never read again) and, of the round in progress, its model."""
    parts = key.split("/")
    if "rounds" not in parts:
        return True
    rnd = int(parts[parts.index("rounds") + 1])
    if rnd > newest:
        return rnd == newest + 1 and (parts[-1].startswith("model") or "model.slices" in parts)
    return "sync" not in parts


def _dataset_location(meta: dict[str, Any]) -> tuple[str, str]:
    # Read raw: the snapshot copies items verbatim and needs only the dataset's location.
    return keys.parse_s3_uri(meta["job"]["dataset"]["uri"])


def state_dir(out: Path, run_id: str) -> Path:
    """Where run `run_id` of `--out OUT` keeps its saved state."""
    return out / ".state" / "runs" / run_id


def find_state(out: Path, run_id: str) -> Path:
    """The folder holding `run_id`'s saved state: its own, or OUT/.state itself for a state
    saved before each run had its own folder (one run per --out)."""
    own, legacy = state_dir(out, run_id), out / ".state"
    if not (own / "items.json").exists() and (legacy / "items.json").exists():
        return legacy
    return own


def run_lock(out: Path, run_id: str) -> contextlib.AbstractContextManager[Path]:
    """Hold an exclusive OS lock on the run's state folder while the run is live (the folder is
    yielded); RunInProgress when another live process holds it. The lock dies with its process,
    so a crashed run leaves nothing to clean up before its resume."""

    def busy(lock: Path) -> RunInProgress:
        return RunInProgress(
            f"run {run_id!r} is live in {out} already (another process holds {lock}): "
            "wait for it to end, or give this run another run_id or --out"
        )

    return folder_lock(state_dir(out, run_id), busy)


def clear_state(folder: Path) -> None:
    """Forget a saved state (`smlt run --replace`: a fresh run under a run id that has one):
    objects are copied once, so stale ones would otherwise survive into the new run's state."""
    (folder / "items.json").unlink(missing_ok=True)
    shutil.rmtree(folder / "s3", ignore_errors=True)


def _saved_runs(out: Path) -> list[str]:
    runs = out / ".state" / "runs"
    return sorted(p.name for p in runs.iterdir() if (p / "items.json").exists()) if runs.is_dir() else []


def saved_items(run_id: str, out: Path) -> list[dict[str, Any]]:
    """The saved items of ``run_id`` in ``--out out`` (checked: `check_state`), or RunNotFound
    saying what is there instead (read before the engine starts: an unknown run costs nothing)."""
    folder = find_state(out, run_id)
    items_file = folder / "items.json"
    if not items_file.exists():
        held = ", ".join(repr(r) for r in _saved_runs(out))
        if folder.is_dir():  # the run's folder and lock, made when it started: no round was saved
            raise RunNotFound(
                f"run {run_id!r} stopped before its first round was aggregated, so {folder} holds no state "
                f"to resume: start it again (`smlt run --local JOB --out {out}`)"
            )
        raise RunNotFound(
            f"no saved state in {folder}: `smlt run --local JOB --out OUT` saves it in OUT/.state "
            "after every round; pass that run's --out" + (f" (this one holds the runs {held})" if held else "")
        )
    try:
        items = json.loads(items_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise RunNotFound(f"{items_file} is unreadable ({e}); start the run again") from None
    if not isinstance(items, list):
        _damaged(items_file, "it is not a list of items")
    items = _check_digests(items_file, items)
    metas = [i for i in items if isinstance(i, dict) and i.get("sk") == keys.META]
    if not any(i.get("pk") == keys.pk(run_id) for i in metas):
        if any(isinstance(i, dict) and i.get("pk") == keys.pk(run_id) for i in items):
            _damaged(items_file, f"run {run_id!r} has items but no META item")
        held = ", ".join(repr(m.get("run_id")) for m in metas) or "none"
        raise RunNotFound(f"no run {run_id!r} in the saved state in {folder} (it holds: {held})")
    check_state(folder, items, run_id)
    return items


def saved_status(items: list[dict[str, Any]], run_id: str) -> str | None:
    """The run's status in its saved META item (SUCCEEDED once Finalize's save is in)."""
    meta = next((i for i in items if i.get("pk") == keys.pk(run_id) and i.get("sk") == keys.META), None)
    return meta.get("status") if meta else None


class SavedRunExists(SmltError):
    """A new run would replace the saved state of an earlier run with the same id (CLI only)."""


def refuse_to_replace(out: Path, run_id: str, folder: Path) -> None:
    """A fresh run under a run id that has a saved state in --out keeps that state: SavedRunExists
    saying what the state holds and what to do (resume it, another run_id or --out, or --replace)."""
    items_file = folder / "items.json"
    if not items_file.exists():
        return
    try:
        items = json.loads(items_file.read_text())
        status = saved_status([i for i in items if isinstance(i, dict)], run_id)
        rounds = sum(1 for i in items if isinstance(i, dict) and str(i.get("sk", "")).startswith("ROUND#"))
    except (ValueError, UnicodeDecodeError, TypeError, AttributeError):
        status, rounds = "unreadable", 0
    if status == "SUCCEEDED":
        what = f"run {run_id!r} finished already in {out} ({rounds} rounds saved in {folder})"
        todo = "give this run another run_id or --out"
    else:
        what = f"run {run_id!r} has a saved state in {out} ({rounds} rounds, in {folder})"
        todo = f"continue it with `smlt resume {run_id} --local --out {out}`, or give this run another run_id or --out"
    raise SavedRunExists(f"{what}: {todo}, or pass --replace to discard that state and start over")


def _damaged(where: Path, problem: str) -> NoReturn:
    raise DamagedState(
        f"the saved state {where} is damaged: {problem}. It cannot be resumed and nothing was restored "
        "from it: start the run again (`smlt run --local JOB --out OUT`), or resume a copy of the state "
        "that is intact"
    )


class _SavedObjects:
    """A saved state's objects (s3/<bucket>/<key>) read by key, for hashing the saved models."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str) -> bytes:
        path = self.root / key
        if not path.is_file():
            raise NotFound(key)
        return path.read_bytes()


def artifacts_root(folder: Path, run_id: str) -> Path | None:
    """The saved artifacts bucket: the s3/<bucket> folder holding the run's rounds."""
    s3 = folder / "s3"
    found = [b for b in sorted(s3.iterdir()) if (b / keys.run_prefix(run_id)).is_dir()] if s3.is_dir() else []
    return found[0] if found else None


def _saved_rounds(items_file: Path, items: list[dict[str, Any]], run_id: str) -> tuple[str | None, list[RoundItem]]:
    """Model 0's digest (META's, read raw: META is restored as saved) and the ROUND items, which
    must run 0, 1, ... without a gap, each with its PLAN."""
    own = {i.get("sk"): i for i in items if isinstance(i, dict) and i.get("pk") == keys.pk(run_id)}
    model0 = own[keys.META].get("model0_sha256")
    try:
        rounds = sorted(
            (RoundItem.model_validate(i) for sk, i in own.items() if str(sk).startswith("ROUND#")), key=_rnd
        )
    except ValidationError as e:
        _damaged(items_file, f"an item does not validate ({describe(e, 'item', first=True)})")
    numbers = [r.round for r in rounds]
    if numbers != list(range(len(numbers))):
        gap = next(i for i, n in enumerate([*numbers, -1]) if n != i)
        _damaged(items_file, f"ROUND item {keys.round_sk(gap)} is missing (rounds saved: {numbers})")
    for r in rounds:
        if keys.plan_sk(r.round) not in own:
            _damaged(items_file, f"round {r.round} has no PLAN item ({keys.plan_sk(r.round)})")
    return model0, rounds


def _rnd(r: RoundItem) -> int:
    return r.round


def check_state(folder: Path, items: list[dict[str, Any]], run_id: str) -> None:
    """Refuse a damaged saved state (DamagedState naming the file and what is wrong) before anything
    is restored: META present, ROUND items 0..r without a gap, a PLAN per round, each saved model
    (model 0 and every round's model r+1) present with the digest its item recorded, and the saved
    dataset's shards as its manifest lists them. (The items' own digests are checked as they are
    read, in `saved_items`.)"""
    items_file = folder / "items.json"
    model0, rounds = _saved_rounds(items_file, items, run_id)
    root = artifacts_root(folder, run_id)
    if not rounds:
        return
    if root is None:
        _damaged(folder / "s3", f"no saved objects of run {run_id!r}")
    saved = _SavedObjects(root)
    wanted = [(0, model0), *((r.round + 1, r.model_sha256) for r in rounds)]
    for rnd, expected in wanted:
        try:
            digest = model_sha256(saved, run_id, rnd)
        except NotFound:
            _damaged(saved.path(keys.model_key(run_id, rnd)), f"model {rnd} is not saved")
        except (ValueError, KeyError, TypeError) as e:  # a slices manifest that is not one
            _damaged(saved.path(keys.slices_manifest_key(run_id, rnd)), f"model {rnd} is unreadable ({e})")
        if expected is not None and digest != expected:
            path = saved.path(keys.model_key(run_id, rnd))
            where = path if path.is_file() else saved.path(keys.slices_manifest_key(run_id, rnd))
            _damaged(where, f"model {rnd} has sha256 {digest}, but {expected} was recorded when it was written")
    meta = next(i for i in items if i.get("pk") == keys.pk(run_id) and i.get("sk") == keys.META)
    _check_dataset(folder, meta)


def _check_dataset(folder: Path, meta: dict[str, Any]) -> None:
    """The saved copy of the run's dataset: its manifest readable, each shard present with the
    sha256 the manifest lists (a damaged shard is named by its file here, before the engine
    starts, not by a worker rounds into the resume)."""
    try:
        bucket, prefix = _dataset_location(meta)
    except (KeyError, TypeError, ValueError):
        _damaged(folder / "items.json", "META names no dataset (job.dataset.uri)")
    root = folder / "s3" / bucket / prefix.strip("/")
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        _damaged(manifest_path, "the run's dataset manifest is not saved")
    try:
        manifest = parse_manifest(manifest_path.read_bytes(), str(manifest_path))
    except SmltError as e:
        _damaged(manifest_path, f"the dataset manifest is unreadable ({e})")
    for split in (manifest.train, manifest.validation):
        for shard in split.shards:
            path = root / shard.key
            if not path.is_file():
                _damaged(path, f"dataset shard {shard.key} is not saved")
            if _file_sha256(path) != shard.sha256:
                _damaged(path, f"dataset shard {shard.key} does not match the sha256 its manifest lists")


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def restore_snapshot(engine, names, run_id: str, out: Path) -> None:
    """Load a saved state into a fresh engine, after `check_state` (in `saved_items`) found it
    intact: a damaged state is refused before anything is put."""
    items = saved_items(run_id, out)
    s3 = engine.client("s3")
    root = find_state(out, run_id) / "s3"
    for bucket_dir in root.iterdir():
        store = S3Store(bucket_dir.name, client=s3)
        for path in bucket_dir.rglob("*"):
            if path.is_file():
                store.put(path.relative_to(bucket_dir).as_posix(), path.read_bytes())
    ddb = engine.client("dynamodb")
    for i in range(0, len(items), 25):
        batch = [{"PutRequest": {"Item": to_item(item)}} for item in items[i : i + 25]]
        unprocessed: dict[str, Any] = {names.table: batch}
        while unprocessed:
            unprocessed = ddb.batch_write_item(RequestItems=unprocessed).get("UnprocessedItems") or {}
