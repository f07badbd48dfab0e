"""The README's service snippet ("Use the model": `import json, numpy as np, onnxruntime` ...), run
as it is written in a Python without smlt, beside each kind of table model's exported `model.onnx`:
number columns only (spec smlt-serving/1, input `columns`), number and text columns (/2, `numbers`
and `text`), text columns only (/2, `text` alone). Its price equals `smlt predict`'s on the same row,
a boolean False included (a level, `False`, never a missing cell given the column's imputed level)."""

import importlib.util
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
