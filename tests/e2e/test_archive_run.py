"""`smlt run --local` of a job whose dataset.uri is a zip of an image folder, as Kaggle's come (one
wrapping folder, macOS' `__MACOSX/` and `.DS_Store` beside it): prepared from the archive, trained on
the local engine, the model's classes the folder's, `smlt predict` on the same zip; a damaged zip
refused before any run starts."""

from __future__ import annotations

import csv
import json
import zipfile

from tests.e2e.test_model_out import WORDS, cli  # noqa: F401 - the fixture
from tests.unit.test_archives import _zip_folder


def _digit_images(tmp_path, n: int = 300):
    from PIL import Image
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    pixels = (x[:n] * (255 / 16)).round().astype("uint8").reshape(-1, 8, 8)
    folder = tmp_path / "digits"
    for i, (img, label) in enumerate(zip(pixels, y[:n])):
        (folder / WORDS[label]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(folder / WORDS[label] / f"{i:04d}.png")
    return folder


def test_a_run_trains_on_a_zip_of_an_image_folder(cli, tmp_path, capsys):  # noqa: F811
    archive = _zip_folder(_digit_images(tmp_path), tmp_path / "digits.zip")
    job = json.loads(open("examples/digits.json").read())
    job["dataset"] = {"uri": str(archive), "image_size": 8, "channels": 1}
    job["training"].update(max_rounds=2, target_value=None)
    job["workers"].update(initial=2, max=2)
    job["run_id"] = "zip-images"
    (tmp_path / "job.json").write_text(json.dumps(job))
    out = tmp_path / "out"
    assert cli(["run", "--local", str(tmp_path / "job.json"), "--out", str(out)]) == 0
    card = json.loads((out / "model.json").read_text())
    assert card["classes"] == sorted(WORDS) and card["input_shape"] == [1, 8, 8]
    assert json.loads((out / "metrics.json").read_text())["final"]["val_accuracy"] > 0.2  # 10 classes: chance is 0.1
    # smlt predict takes the same zip: its images, named inside the wrapping folder, with their labels
    assert cli(["predict", str(out), str(archive), "--out", str(tmp_path / "p.csv")]) == 0
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert len(rows) == 300 and rows[0]["id"].split("/")[0] in WORDS and rows[0]["label"] in WORDS
    assert "accuracy" in capsys.readouterr().out

    archive.write_bytes(archive.read_bytes()[:1000])  # an interrupted download
    assert zipfile.is_zipfile(archive) is False
    capsys.readouterr()
    assert cli(["run", "--local", str(tmp_path / "job.json"), "--out", str(tmp_path / "again")]) != 0
    err = capsys.readouterr().err
    assert f"{archive}: not a readable zip archive" in err and "Traceback" not in err
    assert not (tmp_path / "again" / "model.json").exists()
