"""Predictions written as an Excel workbook (`smlt predict ... --out p.xlsx`, `Predictions.write`):
one sheet, `predictions`, with the CSV's columns and values, numbers as numbers and text as text
(as the Parquet file types them); more rows than a sheet holds refused before anything is
written; the file replaced whole or not at all, an existing one as the CSV overwrites it."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import openpyxl
import pyarrow.parquet as pq
import pytest

from smlt import inference
from smlt.cli import main
from smlt.inference import Predictions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset
from tests.unit.untrained import load_folder, run_folder, untrained


def _write(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return path


def _shop(n: int, seed: int) -> list[list[object]]:
    """Rows of HEADER: the label buy/skip, and a customer number (not in the training data)."""
    rng = np.random.default_rng(seed)
    cities = ["Paris", "Rome", "Oslo"]
    return [
        [int(rng.integers(18, 80)), f"{rng.normal(50, 15):.2f}", cities[i % 3], ["buy", "skip"][i % 2], 1000 + i]
        for i in range(n)
    ]


HEADER = ["age", "income", "city", "label", "cust"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A classifier of shop.csv (age, income, city; label buy/skip) in a run's output folder."""
    src = _write(tmp_path / "shop.csv", HEADER[:4], [r[:4] for r in _shop(120, 1)])
    m = prepare_dataset(str(src), str(tmp_path / "prepared"), shards=2)
    card, blob = untrained(m, "logreg", tmp_path / "prepared")
    return run_folder(tmp_path / "out_shop", card, blob, with_json=False)


def _sheet(path: Path) -> list[tuple[object, ...]]:
    wb = openpyxl.load_workbook(path)
    assert wb.sheetnames == ["predictions"]
    return list(wb["predictions"].values)


def _same_as_the_csv_and_the_parquet(preds: Predictions, folder: Path) -> list[tuple[object, ...]]:
    """The workbook's cells: the CSV's text (a number's exact text) and the Parquet file's types."""
    sheet = _sheet(preds.write(folder / "p.xlsx"))
    with preds.write(folder / "p.csv").open(newline="") as f:
        text = list(csv.reader(f))
    typed = pq.read_table(preds.write(folder / "p.parquet")).to_pylist()
    assert len(sheet) == len(text) == len(typed) + 1
    assert list(sheet[0]) == text[0] == list(typed[0])
    for held, line, row in zip(sheet[1:], text[1:], typed):
        # an empty text (a row's `unseen` naming no column) is an empty cell, as a sheet holds no ""
        cells = tuple("" if c is None and v == "" else c for c, v in zip(held, row.values()))
        assert [type(c) for c in cells] == [type(v) for v in row.values()]  # str stays str, float float
        assert list(cells) == list(row.values())
        assert [c if isinstance(c, str) else repr(c) for c in cells] == line
    return sheet


def test_a_classifiers_workbook_holds_the_csvs_columns_and_values(model: Path, tmp_path: Path) -> None:
    new = _write(tmp_path / "new.csv", HEADER, _shop(30, 2))
    preds = load_folder(model).predict(new, id_column="cust")
    sheet = _same_as_the_csv_and_the_parquet(preds, tmp_path)
    assert sheet[0] == ("cust", "prediction", "probability", "label", "unseen")  # unseen: its text columns
    assert sheet[1][0] == "1000" and sheet[1][1] in ("buy", "skip")  # an id is text, as in the Parquet file
    assert all(isinstance(r[2], float) and 0.5 <= r[2] <= 1 for r in sheet[1:])
    by_line = load_folder(model).predict(new)
    assert _same_as_the_csv_and_the_parquet(by_line, tmp_path)[1][0] == "line 2"


def test_a_regressions_workbook_holds_exact_floats_and_text_never_a_formula(tmp_path: Path) -> None:
    values = np.array([[0.1 + 0.2, 2.0], [1e-7, -1234567.891], [1.0 / 3.0, 0.0]])
    preds = Predictions(
        "regression", ["=SUM(A1:A9)", "#N/A", "r 3"], ["price", "rent"], values=values, truth=values[::-1] * 2
    )
    sheet = _same_as_the_csv_and_the_parquet(preds, tmp_path)
    assert sheet[0] == ("id", "price", "rent", "price_true", "rent_true")
    assert sheet[1][:3] == ("=SUM(A1:A9)", 0.30000000000000004, 2.0) and sheet[2][0] == "#N/A"
    assert isinstance(sheet[1][2], float)  # 2.0, not the int 2
    wb = openpyxl.load_workbook(tmp_path / "p.xlsx")
    assert [wb["predictions"][f"A{r}"].data_type for r in (2, 3)] == ["s", "s"]  # no formula, no error cell
    # A non-finite value: an empty cell for NaN, the CSV's text for an infinity.
    odd = Predictions("regression", ["a"], ["y"], values=np.array([[np.nan]]), truth=np.array([np.inf]))
    assert _sheet(odd.write(tmp_path / "odd.xlsx"))[1] == ("a", None, "inf")


def test_the_cli_writes_a_workbook_and_says_so(model: Path, tmp_path: Path, capsys) -> None:
    new = _write(tmp_path / "new.csv", HEADER, _shop(20, 3))
    out = tmp_path / "p.xlsx"
    assert main(["predict", str(model), str(new), "--out", str(out), "--id", "cust"]) == 0
    assert f"wrote 20 predictions to {out}" in capsys.readouterr().out
    sheet = _sheet(out)
    assert len(sheet) == 21 and sheet[0] == ("cust", "prediction", "probability", "label", "unseen")
    assert [r[0] for r in sheet[1:]] == [str(1000 + i) for i in range(20)]


def test_more_rows_than_a_sheet_holds_are_refused_before_anything_is_written(
    model: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(inference, "XLSX_MAX_ROWS", 20)  # the header and 19 predictions
    new = _write(tmp_path / "new.csv", HEADER, _shop(20, 3))
    out = tmp_path / "p.xlsx"
    assert main(["predict", str(model), str(new), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"error: InvalidDataset: --out {out}: 20 predictions and the header are more rows than an Excel sheet "
        "holds (20): write them to a .csv or .parquet file" in err
    )
    assert not out.exists()
    preds = load_folder(model).predict(new)
    out.write_bytes(b"earlier")
    with pytest.raises(InvalidDataset, match="more rows than an Excel sheet holds"):
        preds.write(out)
    assert out.read_bytes() == b"earlier"
    monkeypatch.setattr(inference, "XLSX_MAX_ROWS", 21)  # exactly full
    assert len(_sheet(preds.write(out))) == 21
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["new.csv", "p.xlsx", "shop.csv"]


def test_an_existing_file_is_replaced_whole_as_the_csv_overwrites_it(tmp_path: Path) -> None:
    preds = Predictions("regression", ["a", "b"], ["y"], values=np.array([[1.5], [2.5]]))
    out = tmp_path / "p.xlsx"
    out.write_bytes(b"an older file")
    os.chmod(out, 0o640)
    assert _sheet(preds.write(out)) == [("id", "y"), ("a", 1.5), ("b", 2.5)]
    assert out.stat().st_mode & 0o777 == 0o640  # its permissions kept, as an overwrite keeps them
    # Written through a symlink, as open() writes, the link left a link.
    real = tmp_path / "real.xlsx"
    link = tmp_path / "link.xlsx"
    link.symlink_to(real)
    preds.write(link)
    assert link.is_symlink() and _sheet(real)[1] == ("a", 1.5)
    # A value a cell cannot hold: refused, naming where, the earlier file untouched and no temporary file left.
    before = out.read_bytes()
    bad = Predictions("regression", ["a", "b\x01"], ["y"], values=np.array([[1.0], [2.0]]))
    with pytest.raises(InvalidDataset, match=r"row 3, column 'id': 'b\\x01' holds a control character"):
        bad.write(out)
    long = Predictions("regression", ["x" * 32_768], ["y"], values=np.array([[1.0]]))
    with pytest.raises(InvalidDataset, match=r"row 2, column 'id': 'x+' holds 32,768 characters, which an Excel"):
        long.write(out)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.xlsx", "p.xlsx", "real.xlsx"]


def test_another_suffix_is_refused_naming_the_three(tmp_path: Path) -> None:
    preds = Predictions("regression", ["a"], ["y"], values=np.array([[1.0]]))
    with pytest.raises(InvalidDataset, match=r"write predictions to a \.csv, \.parquet or \.xlsx file"):
        preds.write(tmp_path / "p.xls")
