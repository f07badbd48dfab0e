"""The model card: one ModelCard written into model.safetensors' metadata and read back, class
names recorded by prepare, and a model rebuilt from the card alone predicting through the
manifest's recorded transforms."""

import csv
import logging

import numpy as np
import pytest
import torch
from safetensors.torch import save

from smlt.inference import read_inputs
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.job import parse_job
from smlt.runtime.modelcard import InvalidModel, build_card, read_card, with_card
from smlt.runtime.tensors.format import views
from tests.unit.untrained import loaded, untrained


def _csv(path, rows):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["size", "colour", "label"])
        w.writerows(rows)
    return path


def test_prepare_records_class_names_as_written(tmp_path):
    rng = np.random.default_rng(0)
    rows = [[float(rng.normal()), rng.choice(["red", "blue"]), rng.choice(["cat", "dog", "fox"])] for _ in range(40)]
    m = prepare_dataset(str(_csv(tmp_path / "t.csv", rows)), str(tmp_path / "p"), shards=2)
    assert m.classes == ["cat", "dog", "fox"]
    digits = prepare_dataset("sklearn:digits", str(tmp_path / "d"), shards=2)
    assert digits.classes == [str(i) for i in range(10)]
    diabetes = prepare_dataset("sklearn:diabetes", str(tmp_path / "r"), shards=2)
    assert diabetes.classes is None and diabetes.target is not None


def test_the_card_rides_in_the_safetensors_metadata_and_the_tensors_stay_byte_identical(tmp_path):
    manifest = prepare_dataset("sklearn:iris", str(tmp_path / "p"), shards=2)
    raw = (tmp_path / "p" / "manifest.json").read_bytes()
    job = parse_job({"dataset": {"uri": "s3://b/datasets/iris/"}, "model": {"name": "logreg"}})
    card = build_card("r1", job, manifest, raw, None)
    blob = save({"w": torch.arange(6.0).reshape(2, 3)}, metadata={"kept": "yes"})
    carded = with_card(blob, card)
    assert read_card(carded, "m") == card
    tensors, meta = views(carded)
    assert meta["kept"] == "yes" and (tensors["w"] == np.arange(6.0).reshape(2, 3)).all()
    assert read_card(blob, "m") is None  # a model from before cards
    assert card.features is not None and card.features.train.shards == []  # the feature spec, not the shards
    assert card.classes == ["setosa", "versicolor", "virginica"] and card.input_shape == [4] and card.output_dim == 3
    assert len(card.data.manifest_sha256 or "") == 64
    with pytest.raises(InvalidModel, match="not a safetensors file"):
        read_card(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops", "model.safetensors")


def test_a_model_built_from_its_card_predicts_new_csv_rows_with_the_recorded_transforms(tmp_path, caplog):
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(200):
        colour = str(rng.choice(["red", "blue"]))
        size = float(rng.normal(10, 3))
        rows.append([size, colour, "big" if size > 10 else "small"])
    src = _csv(tmp_path / "t.csv", rows)
    manifest = prepare_dataset(str(src), str(tmp_path / "p"), shards=2)

    def reads_the_size(net: torch.nn.Module) -> None:
        """A logistic regression that reads the standardised size: big when it is above the mean."""
        for p in net.parameters():
            p.zero_()
        lin = [m for m in net.modules() if isinstance(m, torch.nn.Linear)][0]
        size_col = 0  # the first feature is the numeric size
        lin.weight[0, size_col], lin.weight[1, size_col] = 5.0, -5.0
        lin.bias[0] = lin.bias[1] = 0.0

    card, blob = untrained(manifest, "logreg", tmp_path / "p", edit=reads_the_size)
    model = loaded(card, blob)
    new = _csv(
        tmp_path / "new.csv",
        [[15.0, "red", "big"], [4.0, "blue", "small"], [manifest_mean(manifest) + 1, "red", "big"]],
    )
    preds = model.predict(new)
    assert preds.labels == ["big", "small", "big"] and preds.accuracy == 1.0
    out = preds.write(tmp_path / "p.csv")
    lines = out.read_text().splitlines()
    assert lines[0] == "id,prediction,probability,label,unseen" and lines[1].startswith("line 2,big,")
    # A table's own column names the rows (a submission's PassengerId), in the header too.
    named = tmp_path / "named.csv"
    named.write_text("ref,size,colour\nA-1,15.0,red\nB-2,4.0,blue\n")
    by_ref = model.predict(named, id_column="ref")
    assert by_ref.ids == ["A-1", "B-2"] and by_ref.rows()[0][0] == "ref"
    # A number column of the model as the id: its cells as written (1234567, not 1.23457e+06).
    sized = tmp_path / "sized.csv"
    sized.write_text("size,colour\n1234567,red\n4.25,blue\n,red\n")
    assert model.predict(sized, id_column="size").ids == ["1234567", "4.25", ""]
    with pytest.raises(
        InvalidDataset, match=r"named.csv: id column \(--id\): no column 'refs' \(did you mean 'ref'\?\)"
    ):
        model.predict(named, id_column="refs")
    with pytest.raises(InvalidDataset, match="id column 'ref': the data is not a table"):
        model.predict(np.zeros((1, 3), np.float32), id_column="ref")
    # The rows went through the recorded transforms: the same stored features prepare wrote.
    x = read_inputs(manifest, new).x
    assert x.shape == (3, manifest.features)
    # A label the model never saw: predictions, no accuracy, and a notice saying why.
    odd = _csv(tmp_path / "odd.csv", [[15.0, "red", "big"], [4.0, "blue", "huge"]])
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        preds = model.predict(odd)
    assert preds.labels == ["big", "small"] and preds.accuracy is None
    assert "odd.csv: label 'huge' is not one of the model's classes (big, small)" in caplog.text


def manifest_mean(manifest):
    return manifest.normalization.mean[0]


def test_regression_predictions_are_in_the_labels_units(tmp_path):
    rng = np.random.default_rng(2)
    rows = [[float(s), str(rng.choice(["red", "blue"])), 1000.0 + 50.0 * s] for s in rng.normal(0, 1, 120)]
    src = _csv(tmp_path / "r.csv", rows)
    manifest = prepare_dataset(str(src), str(tmp_path / "p"), shards=2, options=None)
    assert manifest.task == "regression" and manifest.target is not None

    def zero(net: torch.nn.Module) -> None:  # predicts the standardised target 0: the train mean, in the user's units
        for p in net.parameters():
            p.zero_()

    model = loaded(*untrained(manifest, "logreg", run_id="r2", edit=zero))
    preds = model.predict(src)
    assert preds.columns == ["label"] and preds.values is not None
    assert np.allclose(preds.values, manifest.target.mean[0]) and 900 < preds.values[0, 0] < 1100
    assert preds.rmse is not None and preds.rmse > 10  # against the file's own labels, in its units
    preds.write(tmp_path / "p.parquet")
    import pyarrow.parquet as pq

    written = pq.read_table(tmp_path / "p.parquet")
    assert written.column_names == ["id", "label", "label_true", "unseen"]  # the file's own values beside them
    assert written.column("label_true").to_pylist()[0] == pytest.approx(rows[0][2])
