"""An Excel workbook (.xlsx, .xlsm) is a table source wherever a CSV is, read as the CSV Excel's
"Save as CSV UTF-8" writes of its first sheet (smlt.runtime.data.workbook): the same shards as that
CSV, the same predictions, its rows and messages named by the workbook and the sheet's rows; blank
rows and columns of a sheet's used range are none; a damaged, encrypted or empty one is named."""

from __future__ import annotations

import datetime as dt
import logging
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smlt.runtime.data.manifest import Manifest
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.tabular import read_table
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.modelcard import read_card
from tests.unit.untrained import loaded, untrained

openpyxl = pytest.importorskip("openpyxl")

HEADER = ["size", "city", "member", "signup", "seen", "rooms", "ratio", "label"]


def _values(rows: int = 300) -> list[list[Any]]:
    """Rows of every kind of cell: floats, whole numbers as floats and ints, text, booleans, dates,
    date-times, empty cells and an error value (a formula that failed) in a number column."""
    rng = np.random.default_rng(0)
    out: list[list[Any]] = []
    for i in range(rows):
        out.append(
            [
                float(round(rng.normal(50, 10), 3)),
                ["Paris", "Lyon", None, "Nice"][i % 4],
                bool(i % 3),
                dt.datetime(2024, 1, 1) + dt.timedelta(days=int(rng.integers(0, 900))),
                dt.datetime(2024, 3, 1, 8, 30) + dt.timedelta(hours=int(rng.integers(0, 5000))),
                None if i % 11 == 0 else float(rng.integers(1, 6)),  # 3.0: written 3
                "#DIV/0!" if i % 13 == 0 else float(rng.random()),
                ["buy", "skip"][int(rng.integers(0, 2))],
            ]
        )
    return out


def _csv_cell(v: Any) -> str:
    """A value as Excel's CSV writes it, written by hand."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    if isinstance(v, dt.datetime):
        return v.date().isoformat() if v.time() == dt.time(0) else v.isoformat(sep=" ")
    return str(v)


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    path.write_text("\n".join(",".join(_csv_cell(v) for v in r) for r in [header, *rows]) + "\n")
    return path


def _workbook(path: Path, header: list[Any], rows: list[list[Any]], **sheets: list[list[Any]]) -> Path:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Sales"
    sheet.append(header)
    for r in rows:
        sheet.append(r)
    for title, cells in sheets.items():
        other = book.create_sheet(title)
        for r in cells:
            other.append(r)
    book.save(path)
    return path


def _cached(path: Path, formula: str, value: str) -> None:
    """Give a formula cell the value Excel would have cached (openpyxl writes none)."""
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    xml = members["xl/worksheets/sheet1.xml"].decode()
    members["xl/worksheets/sheet1.xml"] = re.sub(
        rf"<f>{re.escape(formula)}</f><v ?/>", f"<f>{formula}</f><v>{value}</v>", xml
    ).encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, body in members.items():
            z.writestr(name, body)


def _hashes(m: Manifest) -> list[str]:
    return [s.sha256 for s in m.train.shards + m.validation.shards]


def test_a_workbook_prepares_to_the_shards_of_its_csv(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("smlt.runtime.data.table_reader.BLOCK_BYTES", 4 << 10)  # many blocks
    rows = _values()
    book = _workbook(tmp_path / "sales.xlsx", HEADER, rows)
    csv = _write_csv(tmp_path / "sales.csv", HEADER, rows)
    a = prepare_dataset(str(csv), str(tmp_path / "a"), shards=2)
    b = prepare_dataset(str(book), str(tmp_path / "b"), shards=2)
    assert b.name == "sales" and _hashes(a) == _hashes(b) and a.columns == b.columns
    kinds = {c.name: c.kind for c in b.columns or []}
    assert kinds["signup"] == kinds["seen"] == "date" and kinds["rooms"] == kinds["ratio"] == "numeric"
    table = read_table(book)
    assert table.unit == "row" and table.rows[:3].tolist() == [2, 3, 4]  # the sheet's rows, header in row 1
    assert table.columns["rooms"][:3].tolist() == read_table(csv).columns["rooms"][:3].tolist()


def test_a_formulas_cached_value_is_read(tmp_path: Path) -> None:
    rows = [[i, f"=A{i + 2}*2", i % 2] for i in range(40)]
    book = _workbook(tmp_path / "f.xlsx", ["a", "b", "label"], rows)
    for i in range(40):
        _cached(book, f"A{i + 2}*2", str(i * 2))
    table = read_table(book)
    assert table.columns["b"].tolist() == [str(i * 2) for i in range(40)]  # a number column as its text
    csv = _write_csv(
        tmp_path / "f.csv", ["a", "b", "label"], [[float(i), float(i * 2), float(i % 2)] for i in range(40)]
    )
    assert _hashes(prepare_dataset(str(book), str(tmp_path / "x"))) == _hashes(
        prepare_dataset(str(csv), str(tmp_path / "y"))
    )


def test_blank_rows_and_columns_of_a_used_range_are_none(tmp_path: Path, capsys) -> None:
    """A table placed at B3, blank rows between its rows, formatted empty cells past its last column
    and row (Excel's used range): the table alone; a later row's cell past the header is a column
    without a name, left out as a CSV's is; messages name the sheet's rows."""
    rows = _values(60)
    book = openpyxl.Workbook()
    sheet = book.active
    at = 3
    for j, name in enumerate(HEADER):
        sheet.cell(at, 2 + j, name)
    line = at
    for i, r in enumerate(rows):
        line += 2 if i % 10 == 0 else 1  # a blank row before every tenth
        for j, v in enumerate(r):
            sheet.cell(line, 2 + j, v)
    sheet.cell(line + 5, 2 + len(HEADER) + 3).number_format = "0.00"  # formatted, empty
    book.save(tmp_path / "placed.xlsx")
    csv = _write_csv(tmp_path / "placed.csv", HEADER, rows)
    a = prepare_dataset(str(csv), str(tmp_path / "a"), shards=2)
    b = prepare_dataset(str(tmp_path / "placed.xlsx"), str(tmp_path / "b"), shards=2)
    assert _hashes(a) == _hashes(b)
    assert read_table(tmp_path / "placed.xlsx").rows[:3].tolist() == [5, 6, 7]

    sheet.cell(at + 2, 2 + len(HEADER) + 1, "stray")  # a cell right of the header, in its first row
    book.save(tmp_path / "stray.xlsx")
    with pytest.raises(InvalidDataset, match=r"stray.xlsx: column 'rooms', row 5 is empty: missing values are refused"):
        prepare_dataset(str(tmp_path / "stray.xlsx"), str(tmp_path / "c"), options=_refuse())
    table = read_table(tmp_path / "stray.xlsx")
    assert list(table.columns) == [*HEADER, "Unnamed: 8", "Unnamed: 9"]


def _refuse() -> Any:
    from smlt.runtime.data.options import SourceOptions

    return SourceOptions(missing="refuse")


def test_the_first_visible_sheet_is_read_and_the_others_named(tmp_path: Path, caplog) -> None:
    rows = [[i, i % 2] for i in range(30)]
    book = _workbook(
        tmp_path / "m.xlsx", ["a", "label"], rows, Notes=[["written by hand"], ["a note"]], Old=[["x", "y"]]
    )
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        assert read_table(book).columns["a"].tolist() == [str(i) for i in range(30)]
    told = [r.getMessage() for r in caplog.records if "sheets" in r.getMessage()]
    assert told == [
        f"{book}: 3 sheets; read the first, 'Sales', not 'Notes', 'Old': to read another, move it first in the "
        "workbook (or save it as CSV UTF-8)"
    ]
    wb = openpyxl.load_workbook(book)
    wb["Sales"].sheet_state = "hidden"
    wb.save(book)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        assert list(read_table(book).columns) == ["written by hand"]
    assert "read the first visible, 'Notes', not 'Sales', 'Old'" in caplog.records[0].getMessage()


def test_an_empty_encrypted_or_damaged_workbook_is_named(tmp_path: Path) -> None:
    _workbook(tmp_path / "empty.xlsx", [], [])
    with pytest.raises(InvalidDataset, match=r"empty.xlsx: sheet 'Sales' is empty: a table needs a header row"):
        prepare_dataset(str(tmp_path / "empty.xlsx"), str(tmp_path / "e"))
    _workbook(tmp_path / "head.xlsx", ["a", "label"], [[None, None]])
    with pytest.raises(InvalidDataset, match=r"head.xlsx: sheet 'Sales' has a header row and no row below it"):
        prepare_dataset(str(tmp_path / "head.xlsx"), str(tmp_path / "h"))
    (tmp_path / "locked.xlsx").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600))
    with pytest.raises(InvalidDataset, match=r"locked.xlsx: an encrypted \(password-protected\) workbook"):
        prepare_dataset(str(tmp_path / "locked.xlsx"), str(tmp_path / "l"))
    good = _workbook(tmp_path / "good.xlsx", ["a", "label"], [[1, 0], [2, 1]]).read_bytes()
    (tmp_path / "cut.xlsm").write_bytes(good[: len(good) // 2])
    with pytest.raises(InvalidDataset, match=r"cut.xlsm: not a readable Excel workbook \(BadZipFile"):
        prepare_dataset(str(tmp_path / "cut.xlsm"), str(tmp_path / "c"))
    (tmp_path / "p.xlsx.gz").write_bytes(b"x")
    with pytest.raises(InvalidDataset, match=r"p.xlsx.gz: a workbook compresses itself"):
        prepare_dataset(str(tmp_path / "p.xlsx.gz"), str(tmp_path / "p"))
    _workbook(tmp_path / "twice.xlsx", ["a", "a", "label"], [[1, 2, 0]])
    with pytest.raises(
        InvalidDataset,
        match=r"^.*twice.xlsx: column 'a' appears twice in the header \(columns \d and \d, counting from 1\): rename one of them$",
    ):
        read_table(tmp_path / "twice.xlsx")
    assert not list(Path(__import__("tempfile").gettempdir()).glob("smlt-workbook-*/twice.csv"))


def test_predict_on_a_workbook_is_predict_on_its_csv(tmp_path: Path) -> None:
    rows = _values(120)
    csv = _write_csv(tmp_path / "shop.csv", HEADER, rows)
    m = prepare_dataset(str(csv), str(tmp_path / "shop-prepared"), shards=2)
    card, blob = untrained(m, "mlp", tmp_path / "shop-prepared")
    read = read_card(blob, "m")
    assert read is not None
    model = loaded(read, blob)
    new = _values(40)
    new[3][1] = "Oslo"  # a city the model never saw: the same note, naming the workbook
    a = model.predict(str(_write_csv(tmp_path / "new.csv", HEADER, new)))
    b = model.predict(str(_workbook(tmp_path / "new.xlsx", HEADER, new)))
    assert a.labels == b.labels and a.accuracy == b.accuracy and a.accuracy is not None
    np.testing.assert_array_equal(a.probability, b.probability)
    assert b.notes == [n.replace(str(tmp_path / "new.csv"), str(tmp_path / "new.xlsx")) for n in a.notes]
    assert a.ids[0] == "line 2" and b.ids[0] == "row 2"


def test_workbooks_are_sources_and_parts_of_their_own_format() -> None:
    from smlt.runtime.steps.prepare import find_source, limit_of
    from smlt.runtime.steps.prepare_limits import MAX_WORKBOOK_BYTES, WORKBOOK_LIMIT, TooLargeForLambda
    from smlt.runtime.steps.upload_parts import table_parts

    where = "s3://b/incoming/p/v1/"
    found = find_source({"sales.xlsx": 100, "_SUCCESS": 0}, where)
    assert found.kind == "file" and limit_of(found) is WORKBOOK_LIMIT
    with pytest.raises(TooLargeForLambda, match=r"sales.xlsm is .* of an Excel workbook: 90.0 MB"):
        find_source({"sales.xlsm": MAX_WORKBOOK_BYTES + 1}, where)
    parts = table_parts({"2026-10.xlsx": 10, "2026-11.xlsx": 12}, where)
    assert parts is not None and parts.format == "xlsx"
    assert table_parts({"a.csv": 1, "b.xlsx": 1}, where) is None  # two formats: MixedUpload by find_source
    with pytest.raises(TooLargeForLambda, match=r"up to 90.0 MB"):
        table_parts({"a.xlsx": 1, "b.xlsx": MAX_WORKBOOK_BYTES + 1}, where)


def test_a_sheet_whose_stated_range_is_too_small_loses_no_row(tmp_path: Path) -> None:
    """Some writers state a sheet's range (`<dimension ref=...>`) smaller than its cells; read-only
    openpyxl would stop there."""
    book = _workbook(tmp_path / "d.xlsx", ["a", "b", "label"], [[i, i * 2, i % 2] for i in range(50)])
    with zipfile.ZipFile(book) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    xml = members["xl/worksheets/sheet1.xml"].decode()
    members["xl/worksheets/sheet1.xml"] = re.sub(r'<dimension ref="[^"]*"', '<dimension ref="A1:B3"', xml).encode()
    with zipfile.ZipFile(book, "w") as z:
        for name, body in members.items():
            z.writestr(name, body)
    assert openpyxl.load_workbook(book, read_only=True).active.max_row == 3
    table = read_table(book)
    assert len(table) == 50 and list(table.columns) == ["a", "b", "label"]
