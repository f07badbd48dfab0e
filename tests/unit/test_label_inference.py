"""What a table's label becomes when the task is not named: whole numbers with few values are
classes, a quantity such as an age is refused until named, and classes (or one-hot levels) that
differ only in case are told, never merged."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset

CASE = "differ only in letter case or spacing"


def _write(path: Path, header: list[str], rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def _prepare(src: Path, out: Path, caplog, **options) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        prepare_dataset(str(src), str(out), options=SourceOptions(**options))
    return caplog.text


def _ages(n: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2)).round(3)
    age = np.clip(np.round(50 + 10 * x[:, 0] - 8 * x[:, 1] + 3 * rng.normal(size=n)), 18, 90).astype(int)
    return x, age


def test_an_age_label_is_not_read_as_dozens_of_classes(tmp_path, caplog):
    x, age = _ages()
    src = _write(tmp_path / "age.csv", ["a", "b", "age"], [[*x[i], age[i]] for i in range(len(age))])
    distinct = len(set(age.tolist()))
    with pytest.raises(InvalidDataset) as refused:
        _prepare(src, tmp_path / "p", caplog)
    said = str(refused.value)
    assert f"label column 'age' has {distinct} distinct whole-number values ({age.min()} to {age.max()})" in said
    assert "--task regression" in said and '"task": "regression"' in said and "--task classification" in said
    assert not (tmp_path / "p").exists()
    _prepare(src, tmp_path / "p", caplog, task="regression")
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["task"] == "regression"


def test_a_dozen_whole_numbers_are_classes_with_a_word_on_quantities(tmp_path, caplog):
    src = _write(tmp_path / "rooms.csv", ["a", "rooms"], [[(i * 7) % 31, 1 + i % 14] for i in range(500)])
    told = _prepare(src, tmp_path / "p", caplog)
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["task"] == "classification" and manifest["classes"] == [str(i) for i in range(1, 15)]
    assert "label column 'rooms' has 14 distinct whole-number values (1 to 14), read as 14 classes" in told
    assert "--task regression" in told
    # ten classes (digits 0-9) are classes without a word
    src = _write(tmp_path / "digits.csv", ["a", "digit"], [[(i * 7) % 31, i % 10] for i in range(500)])
    assert "distinct whole-number values" not in _prepare(src, tmp_path / "q", caplog)


def test_classes_and_levels_differing_only_in_case_are_told_not_merged(tmp_path, caplog):
    rng = np.random.default_rng(1)
    rows = []
    for i in range(600):
        city = ["Paris", "Rome", "Oslo"][i % 3]
        label = "yes" if rng.random() < 0.5 else "no"
        if i % 10 == 0:
            label, city = label.capitalize(), city.lower()
        rows.append([round(rng.normal(), 3), city, label])
    src = _write(tmp_path / "t.csv", ["a", "city", "label"], rows)
    told = _prepare(src, tmp_path / "p", caplog)
    assert (
        f"t.csv: label column 'label': 'No' and 'no'; 'Yes' and 'yes' {CASE}, and are learnt as different classes"
        in told
    )
    assert "t.csv: column 'city': 'Oslo' and 'oslo'; 'Paris' and 'paris'; " in told
    assert "learnt as different levels" in told
    # told, not merged: the classes stay as written
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["classes"] == ["No", "Yes", "no", "yes"]


def test_one_spelling_per_class_is_not_told(tmp_path, caplog):
    rows = [[i % 7, ["Paris", "Rome"][i % 2], ["a", "b"][(i // 3) % 2]] for i in range(300)]
    assert CASE not in _prepare(_write(tmp_path / "t.csv", ["a", "city", "label"], rows), tmp_path / "p", caplog)


def test_a_last_column_of_names_is_refused_as_a_label_of_one_row_per_class(tmp_path, caplog):
    rng = np.random.default_rng(1)
    rows = [[f"{rng.normal():.3f}", f"{rng.normal():.3f}", "yes" if i % 3 else "no", f"person {i}"] for i in range(400)]
    rows[7][3] = rows[8][3]  # a few names twice: still a class per row, nearly
    src = _write(tmp_path / "people.csv", ["a", "b", "bought", "name"], rows)
    with pytest.raises(InvalidDataset) as refused:
        _prepare(src, tmp_path / "p", caplog)
    said = str(refused.value)
    assert "label column 'name' has 399 distinct values in 400 rows: most classes have a single row" in said
    assert "--label COLUMN" in said and "using the last, 'name'" in caplog.text
    assert not (tmp_path / "p" / "manifest.json").exists()
    # named, the real label prepares; and a label of many classes with rows enough for each stays a label
    _prepare(src, tmp_path / "p", caplog, label="bought", drop=["name"])
    many = [[f"{rng.normal():.3f}", f"c{i % 150}"] for i in range(400)]  # 150 classes, 2-3 rows each
    _prepare(_write(tmp_path / "many.csv", ["a", "label"], many), tmp_path / "q", caplog)
