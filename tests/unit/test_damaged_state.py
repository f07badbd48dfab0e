"""A saved local state is checked before anything is restored from it: META, ROUND items 0..r
without a gap, a PLAN per round, every saved model with the digest its item recorded."""

import hashlib
import json

import pytest

from smlt.runtime import keys
from smlt.runtime.errors import DamagedState
from smlt.snapshot import saved_items, state_dir

RUN = "st"


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _round(rnd: int, model_sha256: str | None) -> dict:
    item = {"pk": keys.pk(RUN), "sk": keys.round_sk(rnd), "round": rnd, "workers": 2, "memory_mb": 1769}
    item.update(local_steps=5, batch_size=32, model_sha256=model_sha256)
    return item


def _state(tmp_path, rounds: int = 3) -> tuple:
    """A saved state of `rounds` rounds: models 0..rounds (one object each) with their digests."""
    folder = state_dir(tmp_path, RUN)
    models = [f"model {r}".encode() * 10 for r in range(rounds + 1)]
    for r, blob in enumerate(models):
        path = folder / "s3" / "arts" / keys.model_key(RUN, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    items = [{"pk": keys.pk(RUN), "sk": keys.META, "run_id": RUN, "model0_sha256": _sha(models[0])}]
    for r in range(rounds):
        items += [{"pk": keys.pk(RUN), "sk": keys.plan_sk(r), "round": r}, _round(r, _sha(models[r + 1]))]
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
