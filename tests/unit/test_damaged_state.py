"""A saved local state is checked before anything is restored from it: every item against the
digest it was saved with, META, ROUND items 0..r without a gap, a PLAN per round, every saved
model with the digest its item recorded, the saved dataset's shards against its manifest."""

import hashlib
import json

import pytest

from smlt.runtime import keys
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import DamagedState
from smlt.snapshot import _ItemsFile, saved_items, state_dir

RUN = "st"


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _round(rnd: int, model_sha256: str | None) -> dict:
    item = {"pk": keys.pk(RUN), "sk": keys.round_sk(rnd), "round": rnd, "workers": 2, "memory_mb": 1769}
    item.update(local_steps=5, batch_size=32, model_sha256=model_sha256)
    return item


def _state(tmp_path, rounds: int = 3, digests: bool = False) -> tuple:
    """A saved state of `rounds` rounds: models 0..rounds (one object each) with their digests,
    the run's dataset (iris, 4 shards). `digests`: items.json as Snapshot writes it (each item
    with its digest); else as a state saved before items carried one."""
    folder = state_dir(tmp_path, RUN)
    if not (folder / "s3" / "data" / "iris" / "manifest.json").exists():
        prepare_dataset("sklearn:iris", str(folder / "s3" / "data" / "iris"), shards=4)
    models = [f"model {r}".encode() * 10 for r in range(rounds + 1)]
    for r, blob in enumerate(models):
        path = folder / "s3" / "arts" / keys.model_key(RUN, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    job = {"dataset": {"uri": "s3://data/iris"}, "training": {"learning_rate": 0.05, "momentum": 0.9}}
    items = [{"pk": keys.pk(RUN), "sk": keys.META, "run_id": RUN, "model0_sha256": _sha(models[0]), "job": job}]
    for r in range(rounds):
        items += [{"pk": keys.pk(RUN), "sk": keys.plan_sk(r), "round": r}, _round(r, _sha(models[r + 1]))]
    if digests:
        _ItemsFile(folder / "items.json").write(items[0], items[1:])
    else:
        (folder / "items.json").write_text(json.dumps(items))
    return folder, items


def _refused(tmp_path, match: str) -> str:
    before = {p: p.read_bytes() for p in state_dir(tmp_path, RUN).rglob("*") if p.is_file()}
    with pytest.raises(DamagedState, match=match) as e:
        saved_items(RUN, tmp_path)
    after = {p: p.read_bytes() for p in state_dir(tmp_path, RUN).rglob("*") if p.is_file()}
    assert after == before  # nothing changed
    assert "start the run again" in str(e.value)
    return str(e.value)


def test_an_intact_state_is_accepted(tmp_path):
    _, items = _state(tmp_path)
    assert saved_items(RUN, tmp_path) == items


def test_a_missing_round_item_is_refused(tmp_path):
    folder, items = _state(tmp_path)
    (folder / "items.json").write_text(json.dumps([i for i in items if i["sk"] != keys.round_sk(1)]))
    msg = _refused(tmp_path, r"ROUND item ROUND#000001 is missing \(rounds saved: \[0, 2\]\)")
    assert str(folder / "items.json") in msg


def test_a_round_without_its_plan_is_refused(tmp_path):
    folder, items = _state(tmp_path)
    (folder / "items.json").write_text(json.dumps([i for i in items if i["sk"] != keys.plan_sk(2)]))
    _refused(tmp_path, r"round 2 has no PLAN item \(PLAN#000002\)")


def test_a_flipped_byte_in_a_saved_model_is_refused_naming_the_file(tmp_path):
    folder, _ = _state(tmp_path)
    path = folder / "s3" / "arts" / keys.model_key(RUN, 2)
    blob = bytearray(path.read_bytes())
    blob[3] ^= 1
    path.write_bytes(bytes(blob))
    msg = _refused(tmp_path, "model 2 has sha256")
    assert str(path) in msg and _sha(bytes(blob)) in msg


def test_a_damaged_model_0_and_a_missing_model_are_refused(tmp_path):
    folder, _ = _state(tmp_path)
    path = folder / "s3" / "arts" / keys.model_key(RUN, 0)
    path.write_bytes(b"other")
    _refused(tmp_path, "model 0 has sha256")
    folder, _ = _state(tmp_path)  # repaired
    (folder / "s3" / "arts" / keys.model_key(RUN, 3)).unlink()
    _refused(tmp_path, "model 3 is not saved")


def test_items_without_meta_are_refused(tmp_path):
    folder, items = _state(tmp_path)
    (folder / "items.json").write_text(json.dumps([i for i in items if i["sk"] != keys.META]))
    _refused(tmp_path, "has items but no META item")


def test_an_intact_state_with_digests_is_accepted(tmp_path):
    _, items = _state(tmp_path, digests=True)
    assert saved_items(RUN, tmp_path) == items  # the digests are checked and left out


def test_an_edited_item_is_refused_naming_the_item_and_the_field(tmp_path):
    """The one-character edit of issue #38: learning_rate 0.05 -> 0.95 in items.json."""
    folder, _ = _state(tmp_path, digests=True)
    text = (folder / "items.json").read_text()
    assert text.count('"learning_rate": 0.05') == 1
    (folder / "items.json").write_text(text.replace('"learning_rate": 0.05', '"learning_rate": 0.95'))
    msg = _refused(tmp_path, r"item 'META' of 'RUN#st' was changed after it was saved")
    assert "field job.training.learning_rate no longer matches its digest" in msg
    assert str(folder / "items.json") in msg


def test_an_item_added_to_a_state_with_digests_is_refused(tmp_path):
    folder, _ = _state(tmp_path, digests=True)
    items = json.loads((folder / "items.json").read_text())
    items.append({"pk": keys.pk(RUN), "sk": "ATTEMPT#000000#x", "duration_s": 0.1})
    (folder / "items.json").write_text(json.dumps(items))
    _refused(tmp_path, r"item 'ATTEMPT#000000#x' of 'RUN#st' has no digest")


def test_a_damaged_dataset_shard_is_refused_naming_its_file(tmp_path):
    folder, _ = _state(tmp_path)
    (shard, *_) = sorted((folder / "s3" / "data" / "iris").glob("train-*.safetensors"))
    blob = bytearray(shard.read_bytes())
    blob[-1] ^= 1
    shard.write_bytes(bytes(blob))
    msg = _refused(tmp_path, "does not match the sha256 its manifest lists")
    assert f"the saved state {shard} is damaged: dataset shard train-" in msg
    shard.unlink()
    _refused(tmp_path, rf"dataset shard {shard.name} is not saved")
