"""Local runs survive their process: after every round the run's S3 objects and DynamoDB items
are copied to a folder, and `smlt resume` loads them into a fresh engine.

(On AWS the buckets and the table are the checkpoint; this is the local engine's equivalent.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smlt import keys
from smlt.errors import RunNotFound
from smlt.items import PlanItem, RoundItem
from smlt.records import RunTable, to_item
from smlt.store import NotFound, S3Store


class Snapshot:
    """The run's state in `state_dir`, brought up to date by `save()` after every round.

    A snapshot holds what a resumed run needs to plan round r+1 afresh, r being the newest
    aggregated round: the META item, the PLAN and ROUND items of rounds 0..r, the run's objects
    but the updates (never read again once a round is aggregated), and model r+1. The round in
    progress is left out, so a resume never meets half a round. Every save reads only what is
    new: the new rounds' items, and the keys after round r (S3 lists in key order; objects are
    written once under per-round keys); the dataset's keys once."""

    def __init__(self, engine, names, run_id: str, state_dir: Path):
        self.engine, self.names, self.run_id, self.state_dir = engine, names, run_id, state_dir
        self.items: dict[str, dict[str, Any]] = {}
        self.newest = -1  # the newest aggregated round in the snapshot
        self.after: str | None = None  # artifacts keys up to here are copied
        self.dataset_copied = False

    def save(self, new_rounds: list[RoundItem] | None = None) -> dict[int, PlanItem]:
        """Add the ROUND items aggregated since the last save (read here when not given) and
        their plans; copy the new objects. Returns the new rounds' PLAN items by round.

        Items are kept as stored (META and PLAN as read, ROUND as its model stores it): a
        snapshot is a copy of the partition, read back by `restore_snapshot`."""
        table = RunTable(self.names.table, self.run_id, client=self.engine.client("dynamodb"))
        if new_rounds is None:
            new_rounds = table.rounds(after=self.newest if self.newest >= 0 else None)
        new_rounds = [r for r in new_rounds if keys.round_sk(r.round) not in self.items]
        got = table.get_many(keys.META, *(keys.plan_sk(r.round) for r in new_rounds))
        meta = got[keys.META]
        if meta is None:
            return {}
        self.items[keys.META] = meta
        plans: dict[int, PlanItem] = {}
        for r in new_rounds:
            sk = keys.round_sk(r.round)
            self.items[sk] = {"pk": table.pk, "sk": sk, **r.attrs()}
            plan = got[keys.plan_sk(r.round)]
            if plan is not None:
                self.items[keys.plan_sk(r.round)] = plan
                plans[r.round] = PlanItem.model_validate(plan)
        self.newest = max([self.newest, *(r.round for r in new_rounds)])
        artifacts = S3Store(self.names.artifacts_bucket, client=self.engine.client("s3"))
        listed = artifacts.list(keys.run_prefix(self.run_id), start_after=self.after)
        self._copy(artifacts, [k for k in listed if _kept(k, self.newest)])
        # Round newest+1's prefix gains its updates after model newest+1: list it again next time.
        self.after = keys.round_prefix(self.run_id, self.newest + 1)
        if not self.dataset_copied:
            bucket, prefix = _dataset_location(meta)
            data = S3Store(bucket, client=self.engine.client("s3"))
            self._copy(data, data.list(prefix))
            self.dataset_copied = True
        tmp = self.state_dir / "items.json.tmp"
        tmp.write_text(json.dumps(list(self.items.values()), default=str))
        tmp.replace(self.state_dir / "items.json")  # atomic: a crash mid-write keeps the previous snapshot
        return plans

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


def _dataset_location(meta: dict[str, Any]) -> tuple[str, str]:
    # Read raw: the snapshot copies items verbatim and needs only the dataset's location.
    return keys.parse_s3_uri(meta["job"]["dataset"]["uri"])


def saved_items(run_id: str, state_dir: Path) -> list[dict[str, Any]]:
    """The saved items of ``run_id``, or RunNotFound saying what is there instead (read before the
    engine starts: an unknown run costs nothing)."""
    items_file = state_dir / "items.json"
    if not items_file.exists():
        raise RunNotFound(
            f"no saved state in {state_dir}: `smlt run --local JOB --out OUT` saves it in OUT/.state "
            "after every round; pass that run's --out"
        )
    try:
        items = json.loads(items_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise RunNotFound(f"{items_file} is unreadable ({e}); start the run again") from None
    metas = [i for i in items if isinstance(i, dict) and i.get("sk") == keys.META]
    if not any(i.get("pk") == keys.pk(run_id) for i in metas):
        held = ", ".join(repr(m.get("run_id")) for m in metas) or "none"
        raise RunNotFound(f"no run {run_id!r} in the saved state in {state_dir} (it holds: {held})")
    return items


def restore_snapshot(engine, names, run_id: str, state_dir: Path) -> None:
    items = saved_items(run_id, state_dir)
    s3 = engine.client("s3")
    root = state_dir / "s3"
    for bucket_dir in root.iterdir():
        store = S3Store(bucket_dir.name, client=s3)
        for path in bucket_dir.rglob("*"):
            if path.is_file():
                store.put(path.relative_to(bucket_dir).as_posix(), path.read_bytes())
    ddb = engine.client("dynamodb")
    for item in items:
        ddb.put_item(TableName=names.table, Item=to_item(item))
