"""The README's service snippets ("Use the model": `import json, numpy as np, onnxruntime` ...), run
as they are written in a Python without smlt, beside a real `model.onnx`: the table snippet for each
kind of table model, number columns only (spec smlt-serving/1, input `columns`), number and text
columns (/2, `numbers` and `text`), text columns only (/2, `text` alone), its price equal to `smlt
predict`'s on the same row, a boolean False included (a level, `False`, never a missing cell given
the column's imputed level); the image snippet (Pillow alone, as the spec's words say) and the
token-id snippet, their probabilities equal to `smlt predict`'s on the same images (of other sizes
and modes than training's) or ids, for a batch of 1 and of 7."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smlt.exporter import export_model
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from tests.unit.untrained import loaded, untrained

ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "onnxscript"))
pytestmark = pytest.mark.skipif(not ONNX, reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")
README = Path(__file__).resolve().parents[2] / "README.md"


def _snippet(kind: str = "a model of a table's columns") -> str:
    """The README's service snippet whose session line says `kind`."""
    text = README.read_text()
    found = [
        code
        for code in re.findall(r"```python\n(import json, numpy as np, onnxruntime\n.*?)```", text, re.S)
        if f'InferenceSession("model.onnx")  # {kind}' in code
    ]
    assert len(found) == 1, f"README: the service snippet for {kind} is gone"
    return found[0]


def _houses(path: Path) -> Path:
    rng = np.random.default_rng(3)
    lines = ["rooms,area,age,city,garden,price"]
    for i in range(200):
        rooms, age, city = int(rng.integers(1, 6)), int(rng.integers(0, 80)), ["Paris", "Lyon", "Nice"][i % 3]
        area = "" if i % 9 == 0 else round(40 + 25 * rooms + float(rng.normal(0, 10)), 1)
        garden = i % 4 != 0  # True most often: its imputed level, which a False made "" would get
        price = 50000 + 30000 * rooms - 500 * age + 80000 * (city == "Paris") + 20000 * garden
        lines.append(f"{rooms},{area},{age},{city},{garden},{price + float(rng.normal(0, 10000)):.0f}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "drop, spec_format",
    [
        (["city", "garden"], "smlt-serving/1"),
        ([], "smlt-serving/2"),
        (["rooms", "area", "age"], "smlt-serving/2"),
    ],
    ids=["numbers", "numbers-and-text", "text"],
)
def test_the_readme_snippet_runs_as_written_without_smlt(tmp_path, drop, spec_format):
    src = _houses(tmp_path / "houses.csv")
    options = SourceOptions(label="price", task="regression", drop=drop)
    manifest = prepare_dataset(str(src), str(tmp_path / "prepared"), shards=2, options=options)
    card, blob = untrained(manifest, "mlp", run_id="run-readme")
    model = loaded(card, blob, str(tmp_path / "m"))
    done = export_model(model, "onnx", tmp_path / "model.onnx")
    assert done.spec is not None and done.spec.format == spec_format
    if done.spec.inputs:
        assert "a boolean as the CSV held it ('False', never \"\"" in done.spec.inputs[-1].means

    # the snippet's request, as a CSV row smlt predict reads: area missing, no garden (not the imputed level)
    (tmp_path / "row.csv").write_text("rooms,area,age,city,garden\n3,,10,Paris,False\n")
    want = model.predict(tmp_path / "row.csv").values
    assert want is not None
    seven: list[dict[str, object]] = [
        {"rooms": 3, "area": None, "age": 10, "city": "Paris", "garden": False},
        {"rooms": 1, "area": 55.5, "age": 70, "city": " Nice ", "garden": True},  # spaces: stripped
        {"rooms": 5, "area": 160.0, "age": 0, "city": "Berlin", "garden": False},  # unseen city
        {"rooms": 2, "area": 90.0, "age": 33, "city": None, "garden": None},  # missing: imputed
        {"rooms": 4, "area": 140.0, "age": 5, "city": "Lyon", "garden": "maybe"},  # unseen garden
        {"rooms": 2, "area": None, "age": 79, "city": "paris", "garden": True},  # another case: unseen
        {"rooms": 1, "area": 60.0, "age": 1, "city": "Nice", "garden": False},
    ]
    csv = "rooms,area,age,city,garden\n" + "".join(
        ",".join("" if r[c] is None else str(r[c]) for c in ("rooms", "area", "age", "city", "garden")) + "\n"
        for r in seven
    )
    (tmp_path / "seven.csv").write_text(csv)
    predicted = model.predict(tmp_path / "seven.csv")
    assert predicted.values is not None
    code = (
        'import sys\nsys.modules["smlt"] = None  # a service without smlt\n'
        + _snippet()
        + "\nprint(repr(float(price)))\n"
        + "for rows in json.loads(sys.argv[1]):\n"
        + "    got = session.run(None, feeds_of(rows))\n"
        + "    print(json.dumps([got[0][:, 0].tolist(), got[1].tolist() if len(got) > 1 else None]))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-I", "-c", code, json.dumps([seven[:1], seven])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    *_, said, one, batch = ran.stdout.strip().splitlines()
    price = float(said)
    std = model.manifest.target.std[0]
    assert abs(price - want[0, 0]) <= 1e-5 * std + 1e-6 * abs(want[0, 0]), (price, want)
    (one_values, _), (values, unseen) = json.loads(one), json.loads(batch)
    np.testing.assert_allclose(one_values, want[:, 0], rtol=1e-6, atol=1e-5 * std)
    np.testing.assert_allclose(values, predicted.values[:, 0], rtol=1e-6, atol=1e-5 * std)
    if spec_format == "smlt-serving/2":  # unseen: the cells smlt predict's notice counts
        text = done.spec.text_columns or []
        flagged = {c: sum(row[j] for row in unseen) for j, c in enumerate(text)}
        assert flagged == {"city": 2, "garden": 1}
        for c, n in flagged.items():
            assert any(
                f"column '{c}': {n} of 7 rows hold values the model never saw" in note for note in predicted.notes
            )


# The README's recipe for `encoded_features` (number and one-hot text columns), from the model card
# a .pt2 carries, in plain Python: what a torch service without smlt computes.
RECIPE = r"""
import json, sys
sys.modules["smlt"] = None
import numpy as np, torch

extra = {"smlt.serving": "", "smlt.model_card": ""}
program = torch.export.load("model.pt2", extra_files=extra).module()
spec, card = json.loads(extra["smlt.serving"]), json.loads(extra["smlt.model_card"])
assert spec["input"]["name"] == "encoded_features" and "smlt.model_card" in spec["input"]["means"]
rows = json.loads(sys.argv[1])
features = []
for row in rows:
    f = []
    for t in card["features"]["columns"]:
        v = row[t["name"]]
        gap = v is None or str(v).strip() == ""
        if t["kind"] == "numeric":
            f.append(float(t["fill"]) if gap else float(v))
        else:
            cell = t["fill"] if gap else str(v).strip()
            f += [float(cell == level) for level in t["levels"]]
        if t["indicator"]:
            f.append(float(gap))
    features.append(f)
norm = card["features"]["normalization"]
x = (np.array(features) - np.array(norm["mean"])) / np.array(norm["std"])
print(json.dumps(program(torch.from_numpy(x.astype(np.float32))).detach().numpy()[:, 0].tolist()))
"""


def test_the_readme_recipe_for_a_torch_export_of_text_columns_gives_what_predict_gives(tmp_path):
    src = _houses(tmp_path / "houses.csv")
    options = SourceOptions(label="price", task="regression")
    manifest = prepare_dataset(str(src), str(tmp_path / "prepared"), shards=2, options=options)
    card, blob = untrained(manifest, "mlp", run_id="run-recipe")
    model = loaded(card, blob, str(tmp_path / "m"))
    done = export_model(model, "torch-export", tmp_path / "model.pt2")
    assert done.spec is not None and done.spec.kind == "encoded_features"
    assert any(t.indicator for t in manifest.columns or [])  # area's missing cells: an indicator feature

    rows = [
        {"rooms": 3, "area": None, "age": 10, "city": "Paris", "garden": False},
        {"rooms": 1, "area": 55.5, "age": 70, "city": " Nice ", "garden": True},  # spaces around: stripped
        {"rooms": 5, "area": 160, "age": 0, "city": "Berlin", "garden": False},  # unseen: none of the levels
    ]
    csv = "rooms,area,age,city,garden\n" + "".join(
        ",".join("" if r[c] is None else str(r[c]) for c in ("rooms", "area", "age", "city", "garden")) + "\n"
        for r in rows
    )
    (tmp_path / "rows.csv").write_text(csv)
    want = model.predict(tmp_path / "rows.csv").values
    assert want is not None
    ran = subprocess.run(
        [sys.executable, "-I", "-c", RECIPE, json.dumps(rows)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    got = np.array(json.loads(ran.stdout.strip().splitlines()[-1]))
    std = model.manifest.target.std[0]
    np.testing.assert_allclose(got, want[:, 0], rtol=1e-6, atol=1e-5 * std)


def _run_snippet(folder: Path, kind: str, batches: list) -> list[np.ndarray]:
    """The README's snippet for `kind` as written (its own example request included), then its
    `classify` on each of `batches`: the probabilities, as a service without smlt computes them."""
    code = (
        'import sys\nsys.modules["smlt"] = None  # a service without smlt\n'
        + _snippet(kind)
        + "\nfor batch in json.loads(sys.argv[1]):\n    print(json.dumps(classify(batch)[1].tolist()))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-I", "-c", code, json.dumps(batches)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    return [np.array(json.loads(line)) for line in ran.stdout.strip().splitlines()[-len(batches) :]]


def _digit_images(folder: Path) -> Path:
    from PIL import Image
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    pixels = (x * (255 / 16)).round().astype(np.uint8).reshape(-1, 8, 8)
    for i in range(60):
        (folder / str(y[i] % 3)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[i]).convert("RGB").save(folder / str(y[i] % 3) / f"{i}.png")
    return folder


def test_the_readme_image_snippet_gives_what_predict_gives_on_batches_of_1_and_7(tmp_path):
    from PIL import Image

    manifest = prepare_dataset(str(_digit_images(tmp_path / "images")), str(tmp_path / "prepared"), shards=2)
    card, blob = untrained(manifest, "lenet", run_id="run-readme-image")
    model = loaded(card, blob, str(tmp_path / "m"))
    done = export_model(model, "onnx", tmp_path / "model.onnx")
    assert done.spec is not None and done.spec.kind == "image" and done.spec.input.dtype == "uint8"

    # a service's images: other sizes, modes and depths than training's 8x8 RGB PNGs, one transparent
    source = Image.open(sorted((tmp_path / "images").rglob("*.png"))[0])
    new = tmp_path / "new"
    new.mkdir()
    source.resize((32, 32)).save(new / "a-big.png")
    source.convert("L").save(new / "b-gray.png")
    source.convert("P").save(new / "c-palette.png")
    source.resize((20, 12)).save(new / "d-wide.jpg")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: upright is the tag applied
    source.resize((16, 12)).save(new / "e-rotated.jpg", exif=exif)
    Image.fromarray(np.asarray(source.convert("L")).astype(np.uint16) * 257).save(new / "f-deep.png")  # 16-bit
    clear = np.asarray(source.convert("RGBA")).copy()
    clear[:4, :, 3] = 0  # transparent rows: their stored colour is what prepare, predict and the spec take
    Image.fromarray(clear, "RGBA").save(new / "g-transparent.png")
    source.save(tmp_path / "photo.png")  # the snippet's own example request
    files = sorted(new.iterdir())
    assert len(files) == 7

    want = model.predict(new)  # ids: the image paths, sorted
    assert [Path(i).name for i in want.ids] == [f.name for f in files]
    one, seven = _run_snippet(tmp_path, "a model of images", [[str(files[0])], [str(f) for f in files]])
    assert one.shape == (1, len(model.classes)) and seven.shape == (7, len(model.classes))
    alone = model.predict(files[0]).probabilities
    assert want.probabilities is not None and alone is not None
    np.testing.assert_allclose(seven, want.probabilities, rtol=0, atol=1e-5)
    np.testing.assert_allclose(one, alone, rtol=0, atol=1e-5)


def test_the_readme_token_id_snippet_gives_what_predict_gives_on_batches_of_1_and_7(tmp_path):
    source = "synthetic:tokens?rows=200&length=8&vocab=30&classes=3&seed=0"
    manifest = prepare_dataset(source, str(tmp_path / "prepared"), shards=2)
    card, blob = untrained(manifest, "transformer", run_id="run-readme-tokens")
    model = loaded(card, blob, str(tmp_path / "m"))
    done = export_model(model, "onnx", tmp_path / "model.onnx")
    assert done.spec is not None and done.spec.kind == "token_ids" and done.spec.input.shape == ["batch", 8]

    rows = np.random.default_rng(5).integers(0, manifest.vocab_size or 30, (7, 8), dtype=np.int64)
    one, seven = _run_snippet(tmp_path, "a model of token ids (a transformer)", [rows[:1].tolist(), rows.tolist()])
    batch, alone = model.predict(rows).probabilities, model.predict(rows[:1]).probabilities
    assert batch is not None and alone is not None
    np.testing.assert_allclose(seven, batch, rtol=0, atol=1e-5)
    np.testing.assert_allclose(one, alone, rtol=0, atol=1e-5)
