"""Local runs survive their process: after every round the run's S3 objects and DynamoDB items
are copied to a folder, OUT/.state/runs/<run id>/, and `smlt resume` loads them into a fresh
engine. Each run has its own folder, so several runs share one --out; a live run holds an OS lock
on its folder (`run_lock`), so a second live run with the same id is refused and a crash frees it.

(On AWS the buckets and the table are the checkpoint; this is the local engine's equivalent.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from smlt.runtime import keys
from smlt.runtime.aggregate.model_store import model_sha256
from smlt.runtime.errors import DamagedState, RunInProgress, RunNotFound
from smlt.runtime.items import PlanItem, RoundItem
from smlt.runtime.records import RunTable, to_item
from smlt.runtime.store import NotFound, S3Store


class Snapshot:
    """The run's state in `state_dir`, brought up to date by `save()` after every round.

    A snapshot holds what a resumed run needs to plan round r+1 afresh, r being the newest
    aggregated round: the META item, the PLAN and ROUND items of rounds 0..r, the run's objects
    but the updates (never read again once a round is aggregated), and model r+1. The round in
    progress is left out, so a resume never meets half a round. Every save reads only what is
    new: the new rounds' items, and the keys after round r (S3 lists in key order; objects are
    written once under per-round keys); the dataset's keys once. A save that finds no new round
    writes nothing. Thread-safe: the engine's hook and the follower's poll both save."""

    def __init__(self, engine, names, run_id: str, state_dir: Path):
        self.engine, self.names, self.run_id, self.state_dir = engine, names, run_id, state_dir
        self.saved: set[str] = set()  # the sort keys in items.json (the items themselves are on disk only)
        self._file = _ItemsFile(state_dir / "items.json")
        self.newest = -1  # the newest aggregated round in the snapshot
        self.after: str | None = None  # artifacts keys up to here are copied
        self.dataset_copied = False
        self._lock = threading.Lock()
        self._unreported: list[tuple[RoundItem, PlanItem | None]] = []

    def save(self, final: bool = False, rounds_only: bool = False) -> None:
        """Add the ROUND items aggregated since the last save and their plans; copy the new
        objects. `final`: also META's last state and the objects a finished run wrote outside
        the round prefixes (final/), read in full. `rounds_only`: nothing before the first
        round is aggregated (a run refused at its first plan leaves no state).

        Items are kept as stored (META and PLAN as read, ROUND as its model stores it): a
        snapshot is a copy of the partition, read back by `restore_snapshot`."""
        with self._lock:
            self._save(final, rounds_only)

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
        self.newest = max([self.newest, *(r.round for r in new_rounds)])
        artifacts = S3Store(self.names.artifacts_bucket, client=self.engine.client("s3"))
        listed = artifacts.list(keys.run_prefix(self.run_id), start_after=None if final else self.after)
        self._copy(artifacts, [k for k in listed if _kept(k, self.newest)])
        # Round newest+1's prefix gains its updates after model newest+1: list it again next time.
        self.after = keys.round_prefix(self.run_id, self.newest + 1)
        if not self.dataset_copied:
            bucket, prefix = _dataset_location(meta)
            data = S3Store(bucket, client=self.engine.client("s3"))
            self._copy(data, data.list(prefix))
            self.dataset_copied = True
        self._file.write(meta, added)
        self.saved.update([keys.META, *(i["sk"] for i in added)])

    def _copy(self, store: S3Store, listed: list[str]) -> None:
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
            tmp.replace(path)


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


def _encode(item: dict[str, Any]) -> str:
    return json.dumps(item, default=str)


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
    """Objects a resume needs: everything of the run but the updates and gradient exchange (never
    read again once a round is aggregated) and, of the round in progress, all but its model."""
    parts = key.split("/")
    if "rounds" not in parts:
        return True
    rnd = int(parts[parts.index("rounds") + 1])
    if rnd > newest:
        return rnd == newest + 1 and (parts[-1].startswith("model") or "model.slices" in parts)
    return "updates" not in parts and "sync" not in parts


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


@contextlib.contextmanager
def run_lock(out: Path, run_id: str) -> Iterator[Path]:
    """Hold an exclusive OS lock on the run's state folder while the run is live (the folder is
    yielded); RunInProgress when another live process holds it. The lock dies with its process,
    so a crashed run leaves nothing to clean up before its resume."""
    folder = state_dir(out, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)  # never deleted: one inode to lock
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunInProgress(
                f"run {run_id!r} is live in {out} already (another process holds {folder / 'lock'}): "
                "wait for it to end, or give this run another run_id or --out"
            ) from None
        yield folder
    finally:
        os.close(fd)  # releases the lock


def clear_state(folder: Path) -> None:
    """Forget a saved state (a fresh run under a run id that has one): objects are copied once,
    so stale ones would otherwise survive into the new run's state."""
    (folder / "items.json").unlink(missing_ok=True)
    shutil.rmtree(folder / "s3", ignore_errors=True)


def _saved_runs(out: Path) -> list[str]:
    runs = out / ".state" / "runs"
    return sorted(p.name for p in runs.iterdir() if (p / "items.json").exists()) if runs.is_dir() else []


def saved_items(run_id: str, out: Path) -> list[dict[str, Any]]:
    """The saved items of ``run_id`` in ``--out out``, or RunNotFound saying what is there instead
    (read before the engine starts: an unknown run costs nothing)."""
    folder = find_state(out, run_id)
    items_file = folder / "items.json"
    if not items_file.exists():
        held = ", ".join(repr(r) for r in _saved_runs(out))
        raise RunNotFound(
            f"no saved state in {folder}: `smlt run --local JOB --out OUT` saves it in OUT/.state "
            "after every round; pass that run's --out" + (f" (this one holds the runs {held})" if held else "")
        )
    try:
        items = json.loads(items_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise RunNotFound(f"{items_file} is unreadable ({e}); start the run again") from None
    metas = [i for i in items if isinstance(i, dict) and i.get("sk") == keys.META]
    if not any(i.get("pk") == keys.pk(run_id) for i in metas):
        if any(isinstance(i, dict) and i.get("pk") == keys.pk(run_id) for i in items):
            _damaged(items_file, f"run {run_id!r} has items but no META item")
        held = ", ".join(repr(m.get("run_id")) for m in metas) or "none"
        raise RunNotFound(f"no run {run_id!r} in the saved state in {folder} (it holds: {held})")
    check_state(folder, items, run_id)
    return items


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


def _artifacts_root(folder: Path, run_id: str) -> Path | None:
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
        _damaged(items_file, f"an item does not validate ({e.errors()[0]['loc']}: {e.errors()[0]['msg']})")
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
    is restored: META present, ROUND items 0..r without a gap, a PLAN per round, and each saved model
    (model 0 and every round's model r+1) present with the digest its item recorded."""
    items_file = folder / "items.json"
    model0, rounds = _saved_rounds(items_file, items, run_id)
    root = _artifacts_root(folder, run_id)
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
    for item in items:
        ddb.put_item(TableName=names.table, Item=to_item(item))
