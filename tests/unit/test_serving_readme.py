"""The README's service snippet ("Use the model": `import json, numpy as np, onnxruntime` ...), run
as it is written in a Python without smlt, beside each kind of table model's exported `model.onnx`:
number columns only (spec smlt-serving/1, input `columns`), number and text columns (/2, `numbers`
and `text`), text columns only (/2, `text` alone). Its price equals `smlt predict`'s on the same row,
a boolean False included (a level, `False`, never a missing cell given the column's imputed level)."""

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


def _snippet() -> str:
    text = README.read_text()
    found = re.search(r"```python\n(import json, numpy as np, onnxruntime\n.*?)```", text, re.S)
    assert found, "README: the service snippet is gone"
    return found.group(1)


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
    code = (
        'import sys\nsys.modules["smlt"] = None  # a service without smlt\n'
        + _snippet()
        + "\nprint(repr(float(price)))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr
    price = float(ran.stdout.strip().splitlines()[-1])
    std = model.manifest.target.std[0]
    assert abs(price - want[0, 0]) <= 1e-5 * std + 1e-6 * abs(want[0, 0]), (price, want)


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
