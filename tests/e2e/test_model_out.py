"""The model goes out: after a local run, two lines of Python load the model and predict on the
validation rows with the run's own accuracy; `smlt predict` on an image folder writes class names,
for a user's CNN sent with --code (imported from the code stored beside the model); `smlt export`
writes an ONNX file checked against `smlt predict` on the run's validation rows, which a server feeds
the raw digits."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from sklearn.datasets import load_digits

import smlt
import smlt.runner
from smlt.cli import main
from smlt.datasets import local_dataset_folder
from tests.e2e.test_usercode import PKG, _job, user_code  # noqa: F401 - the fixture

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@pytest.fixture
def cli(local, monkeypatch):
    """`smlt ...` as the CLI runs it, on the session's engine instead of a new one."""
    engine, names = local
    monkeypatch.setattr(smlt.runner, "start_engine", lambda faults: (engine, names, None))
    monkeypatch.setattr(engine, "stop", lambda: None)
    return main


def test_two_lines_load_the_model_and_predict_with_the_runs_accuracy(cli, tmp_path, capsys):
    job = json.loads(open("examples/digits.json").read())
    job["training"].update(max_rounds=3, target_value=None)
    job["run_id"] = "model-out"
    (tmp_path / "job.json").write_text(json.dumps(job))
    out = tmp_path / "out"
    assert cli(["run", "--local", str(tmp_path / "job.json"), "--out", str(out)]) == 0
    final = json.loads((out / "metrics.json").read_text())["final"]
    validation = local_dataset_folder("sklearn:digits")  # the prepared dataset the run trained on

    model = smlt.load_model(out)
    predictions = model.predict(validation)

    assert predictions.accuracy == pytest.approx(final["val_accuracy"], abs=1e-12)
    assert len(predictions) == final["val_rows"] and set(predictions.labels) <= {str(i) for i in range(10)}
    card = json.loads((out / "model.json").read_text())
    assert card["model"]["name"] == "mlp" and card["builtin"] and card["input_shape"] == [64]
    assert card["classes"] == [str(i) for i in range(10)] and card["metrics"]["val_accuracy"] == final["val_accuracy"]
    assert card["model_sha256"] == final["model_sha256"]
    # The same model by run id, from the run's saved state under --out.
    assert smlt.load_model("model-out", out=out).card.run_id == "model-out"
    # Raw digits (0..16 pixel values) go through the recorded standardisation, never refitted.
    x, y = load_digits(return_X_y=True)
    np.savez(tmp_path / "raw.npz", x=x, y=y)
    assert smlt.predict(model, tmp_path / "raw.npz").accuracy > 0.8

    # The run's curves, read with tensorboard's own reader: one point per round.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard" / "model-out"))
    events.Reload()
    assert [e.step for e in events.Scalars("metrics/val_accuracy")] == [0, 1, 2, 3]
    assert events.Scalars("metrics/val_accuracy")[-1].value == pytest.approx(final["val_accuracy"])
    assert len(events.Scalars("cost/spent_of_budget")) == 4

    assert cli(["export", str(out), "--format", "onnx", "--data", str(validation)]) == 0
    assert (out / "model.onnx").stat().st_size > 0
    assert "outputs within" in capsys.readouterr().out
    # A server feeds the raw digits as they are: the graph standardises them and gives probabilities.
    import onnxruntime

    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    spec = json.loads(session.get_modelmeta().custom_metadata_map["smlt.serving"])
    probabilities = session.run(None, {spec["input"]["name"]: x.astype(np.float32)})[0]
    served = np.array(spec["classes"])[probabilities.argmax(1)]
    assert (served == smlt.predict(model, tmp_path / "raw.npz").labels).all()


def _word_images(tmp_path):
    from PIL import Image

    x, y = load_digits(return_X_y=True)
    pixels = (x * (255 / 16)).round().astype(np.uint8).reshape(-1, 8, 8)
    folder = tmp_path / "images"
    for i, (img, label) in enumerate(zip(pixels, y)):
        (folder / WORDS[label]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(folder / WORDS[label] / f"{i:04d}.png")
    return folder


def test_smlt_predict_on_an_image_folder_writes_class_names_for_a_users_cnn(cli, tmp_path, user_code, capsys):  # noqa: F811
    images = _word_images(tmp_path)
    job = _job(tmp_path, "model-out-cnn", {"uri": str(images), "image_size": 8, "channels": 1})
    out = tmp_path / "out"
    assert cli(["run", "--local", str(job), "--out", str(out), "--code", str(user_code)]) == 0
    assert (out / "code.zip").is_file()  # the user's code beside the model, as the card's sha256 says
    capsys.readouterr()
    assert cli(["predict", str(out), str(images), "--out", str(tmp_path / "p.csv")]) == 0
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert len(rows) == 1797 and {r["prediction"] for r in rows} <= set(WORDS)
    assert rows[0]["id"].split("/")[0] in WORDS and rows[0]["label"] == rows[0]["id"].split("/")[0]
    accuracy = sum(r["prediction"] == r["label"] for r in rows) / len(rows)
    assert accuracy > 0.8
    assert f"accuracy {accuracy:.4f}" in capsys.readouterr().out
    # And to a torch.export program, the user's CNN included.
    assert cli(["export", str(out), "--format", "torch-export"]) == 0
    assert (out / "model.pt2").stat().st_size > 0


def test_the_python_api_trains_a_dict_job_and_returns_typed_results(cli, tmp_path):
    job = json.loads(open("examples/digits.json").read())
    job["training"].update(max_rounds=2, target_value=None)
    job["run_id"] = "api-run"
    run = smlt.train(job, out=tmp_path / "out")
    assert isinstance(run, smlt.TrainResult) and run.run_id == "api-run" and run.metrics.rounds == 2
    assert run.model_path == tmp_path / "out" / "model.safetensors" and "model.json" in run.files
    model = run.load_model()
    assert model.card.metrics is not None and model.card.metrics.val_accuracy == run.metrics.val_accuracy
    done = smlt.export(model, "torch-export", out=tmp_path / "m.pt2", data=local_dataset_folder("sklearn:digits"))
    assert done.path.is_file() and done.max_abs_diff <= 1e-5
