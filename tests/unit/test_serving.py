"""The served export (smlt.serving, smlt.exporter.export_model): for each kind of data smlt trains
on, the exported file takes what the data holds (feature values and number columns in their own
units with NaN for a missing cell, uint8 image pixels, token ids; a table with a text column: its
encoded rows), gives probabilities or values in the label's units, equals `smlt predict` on the
same rows within 1e-5 (a batch of one row too) and carries its contract (input and output names,
classes, columns) in the file. The onnx cases skip when the onnx extra is not installed.

Measured here (torch 2.13, onnxruntime 1.31, CPU), max abs diff of the exported file from `smlt
predict` on the data's first 64 rows (torch-export / onnx): probabilities 0 / 2.2e-08 to 6.0e-08;
house prices in the 1e5s 1.9e-02 / 1.8e-02 (a float32's rounding, under 1e-7 of the value). Run with
-s to see them.
"""

import importlib.util
import json
import re
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits

from smlt.cli import main
from smlt.exporter import SERVED_TOLERANCE, ExportFailed, export_model, export_module
from smlt.inference import LoadedModel
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset
from smlt.serving import served_module, serving_spec, stored_rows
from tests.unit.untrained import loaded, run_folder, untrained

ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "onnxscript"))
needs_onnx = pytest.mark.skipif(not ONNX, reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
FORMATS = ["torch-export", pytest.param("onnx", marks=needs_onnx)]
KINDS = ["features", "image_float", "image_uint8", "columns", "encoded_features", "token_ids"]


def _csv(path, header, rows):
    path.write_text("\n".join([",".join(header), *(",".join(map(str, r)) for r in rows)]) + "\n")
    return path


def _houses(path):
    """Number columns, some cells empty (imputed, one with its indicator), a price in the 1e5s."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(300):
        rooms, age = int(rng.integers(1, 6)), int(rng.integers(0, 80))
        area = 40 + 25 * rooms + rng.normal(0, 10)
        price = 50000 + 3000 * area - 500 * age + rng.normal(0, 10000)
        rows.append([rooms if i % 23 else "", "" if i % 7 == 0 else round(area, 1), age, round(price, 2)])
    return _csv(path, ["rooms", "area", "age", "price"], rows)


def _fruit(path):
    """Two number columns, a text column (one-hot) and a date column (some empty): the encoded
    rows are the graph's input."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(300):
        k = int(rng.integers(3))
        colour = ["red", "green", "yellow"][(k + int(rng.random() < 0.2)) % 3]
        weight = "" if i % 11 == 0 else round(100 + 50 * k + rng.normal(0, 10), 2)
        picked = "" if i % 13 == 0 else str(np.datetime64("2024-01-01") + int(rng.integers(0, 90)) + 30 * k)
        rows.append([weight, round(5 + 3 * k + rng.normal(0, 1), 2), colour, picked, ["apple", "pear", "banana"][k]])
    return _csv(path, ["weight", "length", "colour", "picked", "kind"], rows)


def _images(folder):
    x, y = load_digits(return_X_y=True)
    pixels = (x * (255 / 16)).round().astype(np.uint8).reshape(-1, 8, 8)
    for i in range(90):
        (folder / str(y[i] % 3)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[i]).convert("RGB").save(folder / str(y[i] % 3) / f"{i}.png")
    return folder


# kind -> (source, model, options, the data a server holds)
def _case(kind, tmp):
    digits = load_digits().data
    if kind == "features":
        return "sklearn:digits", "mlp", None, digits  # pixel values 0..16, as the user has them
    if kind == "image_float":
        return "sklearn:digits?shape=1x8x8", "lenet", None, digits.reshape(-1, 1, 8, 8).astype(np.float32)
    if kind == "image_uint8":
        folder = _images(tmp / "images")
        return str(folder), "lenet", None, folder
    if kind == "columns":
        src = _houses(tmp / "houses.csv")
        return str(src), "mlp", SourceOptions(label="price"), src
    if kind == "encoded_features":
        src = _fruit(tmp / "fruit.csv")
        return str(src), "mlp", SourceOptions(label="kind"), src
    return "synthetic:tokens?rows=200&length=8&vocab=30&classes=3&seed=0", "transformer", None, None


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Each kind's prepared dataset, a model with seeded weights loaded as `smlt.load_model` loads
    it, and the data to predict on (tokens: the prepared folder)."""
    made = {}
    for kind in KINDS:
        tmp = tmp_path_factory.mktemp(kind)
        source, name, options, data = _case(kind, tmp)
        manifest = prepare_dataset(source, str(tmp / "prepared"), shards=2, options=options)
        card, blob = untrained(manifest, name, run_id=f"run-{kind}")
        folder = run_folder(tmp / "run", card, blob)
        made[kind] = (loaded(card, blob, str(folder)), tmp / "prepared" if data is None else data, folder)
    return made


def _run(path, fmt, x):
    """The exported file as a server runs it (onnxruntime, or torch.export.load), and its spec."""
    if fmt == "onnx":
        import onnx
        import onnxruntime

        onnx.checker.check_model(str(path))  # the named batch axis and the metadata keep it valid
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        spec = json.loads(session.get_modelmeta().custom_metadata_map["smlt.serving"])
        (inp,), (out,) = session.get_inputs(), session.get_outputs()
        assert (inp.name, out.name) == (spec["input"]["name"], spec["output"]["name"])
        assert inp.shape[0] == out.shape[0] == "batch"
        return session.run(None, {inp.name: x})[0], spec
    extra = {"smlt.serving": "", "smlt.model_card": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.export.load(str(path), extra_files=extra).module()
    got = program(torch.from_numpy(x))
    assert not got.requires_grad  # a server's call builds no autograd graph
    assert json.loads(extra["smlt.model_card"])["run_id"]
    return got.numpy(), json.loads(extra["smlt.serving"])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_export_takes_what_the_data_holds_and_gives_what_predict_gives(models, kind, fmt, tmp_path):
    model, data, _ = models[kind]
    done = export_model(model, fmt, tmp_path / "served", data=data)
    rows = model.serving_input(data)
    assert done.against == "smlt predict" and done.rows == min(64, len(rows)) and done.spec is not None
    print(f"{kind} {fmt}: max abs diff from smlt predict {done.max_abs_diff:.2e}")

    rows = rows[:5]
    predicted = model.predict_rows(stored_rows(model, rows))
    for x in (rows, rows[:1]):  # a batch of one row as well
        got, spec = _run(done.path, fmt, x)
        assert spec["input"]["dtype"] == str(x.dtype) and spec["kind"] == done.spec.kind
        if model.card.task == "classification":
            assert spec["classes"] == model.classes and spec["output"]["name"] == "probabilities"
            np.testing.assert_allclose(got, predicted.probabilities[: len(x)], rtol=0, atol=SERVED_TOLERANCE)
        else:
            assert spec["targets"] == ["price"] and spec["output"]["name"] == "values"
            assert predicted.values is not None
            np.testing.assert_allclose(got, predicted.values[: len(x)], rtol=1e-6, atol=SERVED_TOLERANCE * 1e5)

    expected = {
        "features": ("features", "float32", [64]),
        "image_float": ("image", "float32", [1, 8, 8]),
        "image_uint8": ("image", "uint8", [3, 8, 8]),
        "columns": ("columns", "float32", [3]),
        "encoded_features": ("encoded_features", "float32", [model.card.input_shape[0]]),
        "token_ids": ("token_ids", "int64", [8]),
    }[kind]
    assert (done.spec.input.name, done.spec.input.dtype, done.spec.input.shape[1:]) == expected


def test_the_server_feeds_the_datas_own_values_not_the_standardised_ones(models):
    """Raw digits pixels (0..16) and a CSV's numbers with empty cells are the graph's input as they
    are: the served module on them equals predict on the same data."""
    model, digits, _ = models["features"]
    x = model.serving_input(digits)
    assert np.array_equal(x, digits.astype(np.float32))  # nothing done to them outside the graph
    with torch.no_grad():
        got = served_module(model)(torch.from_numpy(x[:50])).numpy()
    np.testing.assert_allclose(got, model.predict(digits[:50]).probabilities, atol=SERVED_TOLERANCE)

    houses, src, _ = models["columns"]
    x = houses.serving_input(src)
    assert np.isnan(x).any() and x.shape[1] == 3  # an empty cell is NaN, imputed inside the graph
    assert np.isnan(x[0, :2]).all() and x[0, 2] == 50  # the first row: rooms and area empty, age 50
    with torch.no_grad():
        got = served_module(houses)(torch.from_numpy(x)).numpy()
    want = houses.predict(src).values
    assert want is not None and np.abs(want).min() > 1e4  # in the label's units, not standardised
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5 * houses.manifest.target.std[0])


@pytest.mark.parametrize("kind", ["features", "columns"])
def test_a_prepared_dataset_folder_checks_the_export_on_its_stored_rows(models, kind, tmp_path):
    model, _, run = models[kind]
    folder = run.parent / "prepared"
    x = model.serving_input(folder)
    if kind == "columns":
        assert np.isnan(x[:, 1]).any()  # a stored missing indicator is NaN again in its column
    done = export_model(model, "torch-export", tmp_path / "m.pt2", data=folder)
    assert done.against == "smlt predict" and done.max_abs_diff <= SERVED_TOLERANCE * 1e5


def test_raw_exports_the_bare_network_checked_against_pytorch(models, tmp_path):
    model, _, _ = models["image_uint8"]
    done = export_model(model, "torch-export", tmp_path / "raw.pt2", raw=True)
    assert done.against == "PyTorch" and done.spec is not None and done.spec.raw
    assert (done.spec.input.name, done.spec.input.dtype, done.spec.output.name) == ("model_input", "float32", "logits")
    x = torch.randn(3, 3, 8, 8)
    got, spec = _run(done.path, "torch-export", x.numpy())
    with torch.no_grad():
        assert np.allclose(got, model.module(x).numpy(), atol=1e-5)
    assert spec["raw"] and "normalisation" in spec["input"]["means"]


def test_a_card_without_the_feature_spec_exports_only_raw(models, tmp_path):
    model, _, _ = models["features"]
    bare = LoadedModel(model.module, model.card.model_copy(update={"features": None}), "out/old")
    with pytest.raises(ExportFailed, match=r"out/old: its model card records no feature spec.*--raw"):
        export_model(bare, "onnx", tmp_path / "m.onnx")
    assert export_model(bare, "torch-export", tmp_path / "m.pt2", raw=True).against == "PyTorch"


def test_an_export_that_differs_from_predict_is_refused_and_the_models_flags_are_kept(models, tmp_path):
    model, digits, _ = models["features"]
    served = served_module(model)
    x = torch.from_numpy(model.serving_input(digits)[:4])
    with torch.no_grad():
        want = served(x).numpy().astype(np.float64)
    with pytest.raises(ExportFailed, match=r"differ from smlt predict's by up to 0\.001 \(tolerance 1e-05\)"):
        export_module(served, x, "torch-export", tmp_path / "m.pt2", expect=(want + 1e-3, np.asarray(1e-5), 0.0))
    assert all(p.requires_grad for p in model.module.parameters())  # frozen for the export only


def test_smlt_export_prints_what_a_server_feeds_and_reads(models, capsys):
    _, _, folder = models["columns"]
    assert main(["export", str(folder), "--format", "torch-export"]) == 0
    out = capsys.readouterr().out
    assert "outputs within" in out and "of smlt predict's on 8 rows" in out
    assert "input  'columns' float32 [batch, 3]" in out and "columns: rooms, area, age" in out
    assert "output 'values' float32 [batch, 1]: the predicted price in the label's own units" in out
    assert (folder / "model.pt2").is_file()
    assert main(["export", str(folder), "--format", "torch-export", "--raw", "--out", str(folder / "raw.pt2")]) == 0
    assert "input  'model_input' float32 [batch, 5]" in capsys.readouterr().out  # 3 columns, 2 indicators


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_token_id_outside_the_vocabulary_is_an_error_never_a_silent_wrap(models, fmt, tmp_path):
    """ONNX's Gather reads -1 as the last id: a padding -1 would be a wrong answer, not an error."""
    model, prepared, _ = models["token_ids"]
    done = export_model(model, fmt, tmp_path / "tokens", data=prepared)
    x = model.serving_input(prepared)[:2].copy()
    vocab = model.card.vocab_size
    x[1, 3] = -1
    with pytest.raises(Exception, match=r"out of data bounds|index out of range"):
        _run(done.path, fmt, x)
    x[1, 3] = vocab - 1  # the last id is fine
    _run(done.path, fmt, x)
    with pytest.raises(
        InvalidDataset, match=rf"array: row 1, position 3: token id -1 is not one of the model's ids 0\.\.{vocab - 1}"
    ):
        model.predict(np.concatenate([x[:1], np.where(np.arange(8) == 3, -1, x[1:])]))
    with pytest.raises(InvalidDataset, match=r"row 0, position 0: token id 2\.5 is not one"):
        model.predict(np.full((1, 8), 2.5))


def test_smlt_model_says_what_the_export_takes_and_a_finished_run_names_its_card(models, capsys, tmp_path):
    _, _, folder = models["image_uint8"]
    assert main(["model", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "smlt export writes a model that takes and gives:" in out
    assert "input  'image' uint8 [batch, 3, 8, 8]: RGB images of 8x8 pixels, uint8 0..255" in out
    assert "it reads these columns" not in out  # images: no columns
    _, _, folder = models["encoded_features"]
    assert main(["model", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "it reads these columns of a table (the label 'kind' aside), in order:" in out
    assert "  'weight': number; a missing cell is" in out
    assert re.search(r"  'colour': text, one of [^;]+; a missing cell is '\w+'", out)
    assert re.search(
        r"  'picked': date: days, month, weekday; a missing cell is \d{4}-\d\d-\d\d \(and an indicator\)", out
    )

    from smlt.runner import done_lines

    for name in ("model.safetensors", "model.json", "metrics.json"):
        (tmp_path / name).write_text("{}")
    final = {"rounds": 1, "stop_reason": "max_rounds", "estimated_cost_usd": 0.0, "task": "classification"}
    assert (
        done_lines("r", final, 1.0, tmp_path)[2]
        == f"  outputs in {tmp_path}/: model.safetensors model.json metrics.json"
    )


def test_onnx_without_its_extra_names_the_extra_before_reading_the_rows(models, monkeypatch, tmp_path):
    import importlib.util as util

    model, _, _ = models["features"]
    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    with pytest.raises(
        ExportFailed, match=r"needs the onnx extra \(onnxscript not installed\): pip install 'smlt\[onnx\]'"
    ):
        export_model(model, "onnx", tmp_path / "m.onnx", data=tmp_path / "no-such.csv")


def _as_the_spec_says(path, c, h, w):
    """An image made the served input by the spec's words alone (what a server without smlt does)."""
    from PIL import ImageOps

    img = ImageOps.exif_transpose(Image.open(path))
    if img.mode.startswith("I;16") or img.mode == "I":  # 16-bit grayscale: round(value / 257)
        img = Image.fromarray(np.clip(np.rint(np.asarray(img, np.float64) / 257), 0, 255).astype(np.uint8), "L")
    img = img.convert("RGB" if c == 3 else "L")
    if img.size != (w, h):
        img = img.resize((w, h), Image.Resampling.BILINEAR)
    a = np.asarray(img, np.uint8)
    return a.transpose(2, 0, 1) if c == 3 else a[None]


def test_images_of_another_size_mode_or_depth_made_as_the_spec_says_are_what_smlt_feeds(models, tmp_path):
    model, folder, _ = models["image_uint8"]
    spec = serving_spec(model)
    _, c, h, w = spec.input.shape
    assert "16-bit grayscale" in spec.input.means and "round(value / 257)" in spec.input.means
    source = Image.open(sorted(folder.rglob("*.png"))[0])
    odd = tmp_path / "odd"
    odd.mkdir()
    source.resize((32, 32)).save(odd / "big.png")
    source.convert("RGBA").save(odd / "rgba.png")
    source.convert("P").save(odd / "palette.png")
    source.resize((20, 12)).save(odd / "wide.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the viewer turns it upright
    source.resize((16, 12)).save(odd / "rotated.jpg", exif=exif)
    deep = np.asarray(source.convert("L")).astype(np.uint16) * 257
    Image.fromarray(deep).save(odd / "deep.png")  # 16-bit grayscale: PIL's convert would make it white
    assert Image.open(odd / "deep.png").mode.startswith("I")
    files = sorted(odd.iterdir())
    want = model.serving_input(odd)
    got = np.stack([_as_the_spec_says(f, c, h, w) for f in files])
    assert got.dtype == want.dtype == np.uint8 and got.shape == want.shape == (len(files), c, h, w)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_smlt_predict_refuses_gives_nan_outputs_never_a_class(models, fmt, tmp_path):
    """An infinity (any float input), or a NaN where nothing is imputed (an array's feature), is
    refused by `smlt predict`; the exported file gives that row NaN in every output column, even
    from a network that would answer it (a clamp first), and the other rows as before."""
    model, digits, _ = models["features"]
    clamped = LoadedModel(torch.nn.Sequential(torch.nn.Hardtanh(-3.0, 3.0), model.module), model.card, model.source)
    done = export_model(clamped, fmt, tmp_path / "digits", data=digits[:8])
    assert "NaN in every output column" in done.spec.output.means
    x = digits[:4].astype(np.float32)
    x[1, 5], x[2, 0] = np.nan, np.inf
    got, spec = _run(done.path, fmt, x)
    assert np.isnan(got[1:3]).all() and not np.isnan(got[[0, 3]]).any()
    np.testing.assert_allclose(got[[0, 3]], clamped.predict(x[[0, 3]]).probabilities, atol=SERVED_TOLERANCE)
    assert "np.isnan(out).any(1)" in spec["output"]["means"]
    with torch.no_grad():  # without the check, the clamp would make the infinity a class
        assert torch.isfinite(clamped.module(torch.from_numpy((x[2:3] - 8) / 6))).all()
    with pytest.raises(
        InvalidDataset,
        match=r"^array: 2 rows of 4 hold NaN or Inf features: feature 0 \(1 row, first row 2\), feature 5 \(1 row, "
        r"first row 1\): the model has no answer for such a row \(an exported model gives it NaN outputs\): fix or "
        r"drop those rows and predict again$",
    ):
        clamped.predict(x)

    houses, src, _ = models["columns"]
    done = export_model(houses, fmt, tmp_path / "houses", data=src)
    rows = houses.serving_input(src)[:3].copy()
    rows[0, 1] = np.nan  # imputed: an answer
    rows[1, 2] = np.inf  # refused by predict: NaN
    got, _ = _run(done.path, fmt, rows)
    assert np.isfinite(got[[0, 2]]).all() and np.isnan(got[1]).all()
