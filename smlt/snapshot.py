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


def save_snapshot(engine, names, run_id: str, state_dir: Path) -> None:
    table = RunTable(names.table, run_id, client=engine.client("dynamodb"))
    items = table.query("")
    meta = next((i for i in items if i["sk"] == keys.META), None)
    if meta is None:
        return
    sealed = {i["sk"].split("#")[1] for i in items if i["sk"].startswith("ROUND#")}
    for bucket, prefix in ((names.artifacts_bucket, keys.run_prefix(run_id)), _dataset_location(meta)):
        store = S3Store(bucket, client=engine.client("s3"))
        folder = state_dir / "s3" / bucket
        for key in store.list(prefix):
            # Updates of aggregated rounds are never read again: skip them.
            parts = key.split("/")
            if "updates" in parts and parts[parts.index("rounds") + 1] in sealed:
                continue
            # A sync round's gradient exchange is transient (workers delete it step by step) and
            # never needed to resume.
            if "sync" in parts and "rounds" in parts:
                continue
            # Objects under a run are written once (keys are per round), so copy only new ones.
            path = folder / key
            if not path.exists():
                try:
                    data = store.get(key)
                except NotFound:  # deleted since the listing: nothing to keep
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_bytes(data)
                tmp.replace(path)
    tmp = state_dir / "items.json.tmp"
    tmp.write_text(json.dumps(items, default=str))
    tmp.replace(state_dir / "items.json")  # atomic: a crash mid-write keeps the previous snapshot


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
