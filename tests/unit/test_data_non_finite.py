"""NaN, Inf and numbers beyond float32 in a dataset are refused when it is prepared, naming the
file, the column, the first line and how many rows (issue #38: they used to reach the workers as
a `Diverged … lower training.learning_rate`)."""

from __future__ import annotations

import numpy as np
import pytest

from smlt.cli import main
from smlt.runtime.data.arrays import non_finite
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.pipeline import prepare_version


def _csv(path, sizes, n=60):
    rng = np.random.default_rng(0)
    lines = ["size,rooms,colour,label"]
    for i in range(n):
        size = sizes.get(i, f"{rng.normal():.4f}")
        lines.append(f"{size},{i % 5},{['red', 'blue'][i % 2]},{i % 2}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


FIX = "fix or drop those rows in the source (or rescale the column: a feature must stay within ±3.4e38)"


def test_a_csv_with_inf_nan_or_a_number_beyond_float32_is_refused_naming_column_line_and_rows(tmp_path, capsys):
    csv = _csv(tmp_path / "d.csv", {4: "inf", 20: "1e39", 30: "nan"})
    out = tmp_path / "ds"
    assert main(["data", "prepare", csv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    # The first in file order (line 6: row 4 after the header), and the column's count.
    assert f"error: InvalidDataset: {csv}: column 'size', line 6: 'inf' is not a finite number; " in err, err
    assert "3 of 60 rows of column 'size' are not" in err and FIX in err, err
    assert "Traceback" not in err and not out.exists()

    only_big = _csv(tmp_path / "big.csv", {20: "1e39"})
    with pytest.raises(InvalidDataset, match=r"line 22: '1e39' is not a finite number within ±3.4e38"):
        prepare_dataset(only_big, str(tmp_path / "big"))


def test_an_npz_with_nan_features_names_the_feature_and_the_rows(tmp_path):
    x = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    x[7, 2], x[9, 2] = np.nan, np.inf
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(50) % 2)
    with pytest.raises(InvalidDataset) as e:
        prepare_dataset(str(tmp_path / "d.npz"), str(tmp_path / "ds"))
    assert "d.npz: 2 rows of 50 hold NaN or Inf features: feature 2 (2 rows, first row 7); " + FIX in str(e.value)


def test_a_pipeline_version_that_overflows_the_first_versions_scale_is_refused(tmp_path):
    """The first version fixes the statistics: a later version's values, standardised with them,
    can overflow float32 although each is a finite number; the shards would hold Inf."""
    rng = np.random.default_rng(1)
    v1 = tmp_path / "v1.csv"
    v1.write_text("size,label\n" + "".join(f"{rng.normal() * 1e-6:.6e},{i % 2}\n" for i in range(40)))
    prepare_version(str(v1), str(tmp_path / "incoming/p/v1"), shards=2)
    v2 = tmp_path / "v2.csv"
    v2.write_text("size,label\n" + "".join(f"{3e38 if i in (3, 9) else rng.normal():.4e},{i % 2}\n" for i in range(40)))
    with pytest.raises(InvalidDataset, match=r"split, standardised\): 1 row of \d+ hold|2 rows of \d+ hold") as e:
        prepare_version(str(v2), str(tmp_path / "incoming/p/v2"), shards=2)
    assert "column 'size'" in str(e.value) and "first line" in str(e.value)
    assert not (tmp_path / "incoming/p/v2/manifest.json").exists()


def test_the_rule_names_columns_of_one_hot_features_once():
    x = np.zeros((4, 3), np.float32)
    x[1, 1] = x[2, 2] = np.nan
    assert (
        non_finite(x, ["size", "colour", "colour"]) == "2 rows of 4 hold NaN or Inf features: column 'colour' (2 rows)"
    )
    assert non_finite(np.zeros((3, 2), np.float32)) is None
    assert non_finite(np.full((2, 2), 7, np.int64)) is None  # token ids, uint8 images: always finite


def test_a_regression_label_that_is_inf_or_nan_is_refused_naming_its_line(tmp_path, capsys):
    rows = [f"{i * 0.5 if i not in (6, 30) else ('inf' if i == 6 else 'nan')},{i}" for i in range(40)]
    csv = tmp_path / "y.csv"
    csv.write_text("price,rooms\n" + "\n".join(rows) + "\n")
    assert main(["data", "prepare", str(csv), "--label", "price", "--out", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert f"{csv}: column 'price', line 8: 'inf' is not a finite number; 2 of 40 rows of column 'price'" in err, err
    assert "RuntimeWarning" not in err and "Traceback" not in err, err

    y = np.arange(30, dtype=np.float64)
    y[4], y[9] = np.nan, np.inf
    np.savez(tmp_path / "d.npz", x=np.ones((30, 2), np.float32), y=y)
    with pytest.raises(InvalidDataset, match=r"d.npz: 2 of 30 regression targets are NaN or Inf \(the first: row 4"):
        prepare_dataset(str(tmp_path / "d.npz"), str(tmp_path / "ds2"), options=SourceOptions(task="regression"))
