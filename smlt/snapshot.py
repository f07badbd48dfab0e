"""Local runs survive their process: after every round the run's S3 objects and DynamoDB items
are copied to a folder, and `smlt resume` loads them into a fresh engine.

(On AWS the buckets and the table are the checkpoint; this is the local engine's equivalent.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smlt import keys
from smlt.records import RunTable, to_item
from smlt.store import NotFound, S3Store


class Snapshot:
    """The run's state in `state_dir`, brought up to date by `save()` after every round.

    A snapshot holds the run up to its newest aggregated round r and model r+1: what a resumed
    run needs to plan round r+1 afresh. The round in progress (its plan, records, updates) is
    left out, so a resume never meets half a round. Objects are written once under per-round
    keys, so each save lists only the keys after the newest round already copied (S3 lists in
    key order) and reads the dataset's keys once; the items are read whole (META changes)."""

    def __init__(self, engine, names, run_id: str, state_dir: Path):
        self.engine, self.names, self.run_id, self.state_dir = engine, names, run_id, state_dir
        self.after: str | None = None  # artifacts keys up to here are copied
        self.dataset_copied = False

    def save(self) -> None:
        table = RunTable(self.names.table, self.run_id, client=self.engine.client("dynamodb"))
        items = table.query("")
        meta = next((i for i in items if i["sk"] == keys.META), None)
        if meta is None:
            return
        newest = max((int(i["sk"].split("#")[1]) for i in items if i["sk"].startswith("ROUND#")), default=-1)
        items = [i for i in items if _round_of_item(i["sk"]) <= newest]
        artifacts = S3Store(self.names.artifacts_bucket, client=self.engine.client("s3"))
        listed = artifacts.list(keys.run_prefix(self.run_id), start_after=self.after)
        self._copy(artifacts, [k for k in listed if _kept(k, newest)])
        # Round newest+1's prefix gains its updates after model newest+1: list it again next time.
        self.after = max(self.after or "", keys.round_prefix(self.run_id, newest + 1))
        if not self.dataset_copied:
            bucket, prefix = _dataset_location(meta)
            data = S3Store(bucket, client=self.engine.client("s3"))
            self._copy(data, data.list(prefix))
            self.dataset_copied = True
        tmp = self.state_dir / "items.json.tmp"
        tmp.write_text(json.dumps(items, default=str))
        tmp.replace(self.state_dir / "items.json")  # atomic: a crash mid-write keeps the previous snapshot

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


def _round_of_item(sk: str) -> int:
    """The round an item belongs to (-1 for the run's own items such as META)."""
    kind, _, rest = sk.partition("#")
    return int(rest.split("#")[0]) if kind in ("PLAN", "WORKER", "SEAL", "ERROR", "ROUND") and rest else -1


def save_snapshot(engine, names, run_id: str, state_dir: Path) -> None:
    """One whole snapshot (`Snapshot.save` from scratch)."""
    Snapshot(engine, names, run_id, state_dir).save()


def _dataset_location(meta: dict[str, Any]) -> tuple[str, str]:
    bucket, prefix = keys.parse_s3_uri(meta["job"]["dataset"]["uri"])
    return bucket, prefix


def restore_snapshot(engine, names, run_id: str, state_dir: Path) -> None:
    items_file = state_dir / "items.json"
    if not items_file.exists():
        raise FileNotFoundError(f"no saved state for run {run_id} in {state_dir}")
    s3 = engine.client("s3")
    root = state_dir / "s3"
    for bucket_dir in root.iterdir():
        store = S3Store(bucket_dir.name, client=s3)
        for path in bucket_dir.rglob("*"):
            if path.is_file():
                store.put(path.relative_to(bucket_dir).as_posix(), path.read_bytes())
    ddb = engine.client("dynamodb")
    for item in json.loads(items_file.read_text()):
        ddb.put_item(TableName=names.table, Item=to_item(item))
