"""Folders of recorded curves (smlt.sim.curves.read / load_folder, smlt.sim.workloads.load_workloads):
each file carries what its workload needs, and a file lacking something is refused naming the
file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smlt.sim.curves import CURVES, CurveDataError
from smlt.sim.workloads import WORKLOADS, load_workloads

CURVE_SETS = Path(__file__).resolve().parents[3] / "bench" / "curves"


def _copy(src: Path, dst: Path, **change) -> Path:
    data = json.loads(src.read_text())
    for key, value in change.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    dst.mkdir(exist_ok=True)
    out = dst / src.name
    out.write_text(json.dumps(data))
    return out


def test_the_tuning_curves_carry_their_family_and_target():
    assert {w.name: (w.family, w.target) for w in WORKLOADS.values()} == {
        "digits-cnn": ("cnn", 0.97),
        "digits-mlp": ("mlp", 0.97),
        "resnet18": ("resnet", 0.55),
        "transformer": ("transformer", 0.70),
    }


@pytest.mark.parametrize("folder", ["held-out", "held-out-2"])
def test_the_held_out_folders_load_as_workloads_no_other_set_holds(folder):
    held = load_workloads(CURVE_SETS / folder)
    others = {p.stem for p in CURVE_SETS.glob("*/*.json") if p.parent.name != folder}
    assert len(held) >= 5 and not set(held) & (set(WORKLOADS) | others)
    for w in held.values():
        assert 0 < w.target <= w.curves.acc_best  # a target the recording reaches
        assert w.sample_shape[1] >= 2 and w.train_rows > 0 and w.dataset_bytes > 0


def test_a_dropped_in_folder_works_without_code(tmp_path):
    _copy(CURVES / "digits-mlp.json", tmp_path / "mine")
    (tmp_path / "mine" / "digits-mlp.json").rename(tmp_path / "mine" / "other.json")
    path = tmp_path / "mine" / "other.json"
    path.write_text(path.read_text().replace('"name": "digits-mlp"', '"name": "other"'))
    w = load_workloads(tmp_path / "mine")["other"]
    assert (w.family, w.target, w.train_rows) == ("mlp", 0.97, WORKLOADS["digits-mlp"].train_rows)
    assert w.curves.samples_to(w.target, 4, 20) == WORKLOADS["digits-mlp"].curves.samples_to(0.97, 4, 20)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"target": None}, "target"),
        ({"family": None}, "family"),
        ({"family": "gnn"}, "family"),
        ({"train_rows": "many"}, "train_rows"),
        ({"target": 1.5}, "target"),
        ({"runs": []}, "runs"),
    ],
)
def test_a_file_lacking_a_field_is_refused_naming_the_file_and_the_field(tmp_path, change, field):
    bad = _copy(CURVES / "digits-cnn.json", tmp_path, **change)
    with pytest.raises(CurveDataError) as e:
        load_workloads(tmp_path)
    assert str(bad) in str(e.value) and repr(field) in str(e.value)


def test_an_incomplete_grid_or_a_misnamed_file_is_refused(tmp_path):
    data = json.loads((CURVES / "digits-cnn.json").read_text())
    _copy(CURVES / "digits-cnn.json", tmp_path, runs=data["runs"][1:])
    with pytest.raises(CurveDataError, match=r"digits-cnn\.json: field 'runs'.*not full: none at 1 x 5"):
        load_workloads(tmp_path)
    _copy(CURVES / "digits-cnn.json", tmp_path, name="cnn")
    with pytest.raises(CurveDataError, match=r"field 'name' is 'cnn'"):
        load_workloads(tmp_path)


def test_a_file_that_is_not_json_or_an_empty_folder_is_refused(tmp_path):
    with pytest.raises(CurveDataError, match="no curve files"):
        load_workloads(tmp_path)
    (tmp_path / "broken.json").write_text('{"name": ')
    with pytest.raises(CurveDataError, match=r"broken\.json: not JSON"):
        load_workloads(tmp_path)
    with pytest.raises(CurveDataError, match="no such folder"):
        load_workloads(tmp_path / "nowhere")
