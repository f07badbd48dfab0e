"""`smlt predict` on a table reads it block by block (LoadedModel._predict_table): the predictions,
ids, accuracy, written files, notes and refusals are those of the rows read whole (`read_inputs`,
then `predict_rows`), whatever the blocks."""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import numpy as np
import pytest

from smlt.inference import LoadedModel, Predictions
from smlt.runtime.data import table_reader
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.tables import open_table
from smlt.runtime.errors import InvalidDataset
from tests.unit.untrained import load_folder, run_folder, untrained

CITIES = ["Paris", "Rome", "Oslo"]
SMALL = 2048  # bytes of CSV a block: a few dozen rows


def _write(path: Path, header: list[str], rows: list[list[object]]) -> str:
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return str(path)


def _train(n: int, seed: int, regression: bool = False) -> list[list[object]]:
    rng = np.random.default_rng(seed)
    rows: list[list[object]] = []
    for i in range(n):
        w, p = rng.normal(70, 12), rng.normal(20, 5)
        label = f"{w / 7 + p:.3f}" if regression else ("buy" if w / 70 + p / 20 + rng.normal(0, 0.3) > 2 else "skip")
        rows.append([f"{w:.3f}", f"{p:.3f}", CITIES[i % 3], label])
    return rows


def _model(tmp_path: Path, regression: bool = False, missing: str = "impute") -> LoadedModel:
    name = ("reg" if regression else "cls") + missing
    src = _write(tmp_path / f"{name}.csv", ["weight", "price", "city", "label"], _train(300, 1, regression))
    m = prepare_dataset(
        src, str(tmp_path / f"prepared_{name}"), shards=2, options=SourceOptions.model_validate({"missing": missing})
    )
    assert [(t.name, t.kind) for t in m.columns or []] == [
        ("weight", "numeric"),
        ("price", "numeric"),
        ("city", "onehot"),
    ]
    card, blob = untrained(m, "mlp", tmp_path / f"prepared_{name}")
    return load_folder(run_folder(tmp_path / f"out_{name}", card, blob))


@pytest.fixture
def model(tmp_path: Path) -> LoadedModel:
    return _model(tmp_path)


def _new(n: int = 3000, regression: bool = False, label: str | None = None) -> tuple[list[str], list[list[object]]]:
    """Rows in another order, with an unused column and an order id: unseen cities spread over the
    file (Lima every 97th row, Nice every 301st, Bern twice, Kyiv once in the last rows), the
    weight in grams (far from training), the data's labels."""
    rng = np.random.default_rng(7)
    rows: list[list[object]] = []
    for i in range(n):
        w, p = rng.normal(70, 12), rng.normal(20, 5)
        city = CITIES[i % 3]
        if i % 97 == 5:
            city = "Lima"
        elif i % 301 == 7:
            city = "Nice"
        elif i in (1500, 2500):
            city = "Bern"
        elif i == n - 3:
            city = "Kyiv"
        y = f"{w / 7 + p:.3f}" if regression else ("buy" if i % 3 else "skip")
        rows.append([f"ord-{i}", city, f"{p:.3f}", "x", f"{w * 1000:.1f}", y])
    if label is not None:
        rows[-5][-1] = label
    return ["order", "city", "price", "note", "weight", "label"], rows


def _whole(model: LoadedModel, data: object, id_column: str | None = None) -> Predictions:
    """The predictions of the rows read whole, as before they were streamed."""
    return model.predict_rows(model.inputs(data, id_column=id_column))


def _same(a: Predictions, b: Predictions, tmp_path: Path) -> None:
    assert (a.task, a.ids, a.columns, a.id_name, a.notes) == (b.task, b.ids, b.columns, b.id_name, b.notes)
    for x, y in ((a.index, b.index), (a.probabilities, b.probabilities), (a.values, b.values), (a.truth, b.truth)):
        assert (x is None) == (y is None)
        if x is not None and y is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y)
    assert (a.accuracy, a.rmse) == (b.accuracy, b.rmse)
    for suffix in (".csv", ".parquet"):
        assert a.write(tmp_path / f"a{suffix}").read_bytes() == b.write(tmp_path / f"b{suffix}").read_bytes()
    assert _members(a.write(tmp_path / "a.xlsx")) == _members(b.write(tmp_path / "b.xlsx"))


def _members(path: Path) -> dict[str, bytes]:
    """A workbook's files but docProps/core.xml (it and the zip's own bytes hold when it was written)."""
    with zipfile.ZipFile(path) as z:
        return {name: z.read(name) for name in z.namelist() if name != "docProps/core.xml"}


def _told(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "smlt.notice"]


def _predict_both(model: LoadedModel, path: str, monkeypatch, caplog, id_column: str | None = None):
    """(streamed in one block, streamed in blocks of SMALL bytes, read whole), each with its notices."""
    out = []
    for block_bytes in (table_reader.BLOCK_BYTES, SMALL, None):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="smlt.notice"):
            if block_bytes is None:
                out.append((_whole(model, path, id_column), _told(caplog)))
                continue
            monkeypatch.setattr(table_reader, "BLOCK_BYTES", block_bytes)
            out.append((model.predict(path, id_column=id_column), _told(caplog)))
    monkeypatch.undo()
    return out


def test_a_table_in_many_blocks_predicts_as_read_whole(model: LoadedModel, tmp_path: Path, monkeypatch, caplog) -> None:
    path = _write(tmp_path / "new.csv", *_new())
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", SMALL)
    assert len(list(open_table(path).blocks())) > 50
    monkeypatch.undo()
    for id_column in (None, "order"):
        (one, told_one), (many, told_many), (whole, told_whole) = _predict_both(
            model, path, monkeypatch, caplog, id_column
        )
        _same(one, whole, tmp_path)
        _same(many, whole, tmp_path)
        assert told_one == told_many == told_whole
        assert len(whole) == 3000 and whole.accuracy is not None
        assert whole.ids[:2] == (["line 2", "line 3"] if id_column is None else ["ord-0", "ord-1"])
        unseen, far, unused = whole.notes
        assert "column 'city': 44 of 3,000 rows hold values the model never saw in training" in unseen
        assert "('Lima', 'Nice', 'Bern' and 1 more)" in unseen
        assert "column 'weight': mean " in far and "more than 10 sd from that mean" in far
        assert unused.endswith("columns not used by the model: " + ("note" if id_column else "order, note"))


def test_an_id_on_a_number_column_and_a_label_not_a_class(
    model: LoadedModel, tmp_path: Path, monkeypatch, caplog
) -> None:
    path = _write(tmp_path / "new.csv", *_new(label="maybe"))
    (one, told_one), (many, told_many), (whole, told_whole) = _predict_both(model, path, monkeypatch, caplog, "weight")
    _same(one, whole, tmp_path)
    _same(many, whole, tmp_path)
    assert told_one == told_many == told_whole
    assert whole.truth is None and whole.accuracy is None
    assert any("label 'maybe' is not one of the model's classes (buy, skip)" in t for t in told_whole)
    assert whole.id_name == "weight" and "." in whole.ids[0]


def test_a_regression_in_many_blocks(tmp_path: Path, monkeypatch, caplog) -> None:
    model = _model(tmp_path, regression=True)
    header, rows = _new(regression=True)
    path = _write(tmp_path / "new.csv", header, rows)
    (one, _), (many, _), (whole, _) = _predict_both(model, path, monkeypatch, caplog)
    _same(one, whole, tmp_path)
    _same(many, whole, tmp_path)
    assert whole.rmse is not None and whole.values is not None and whole.values.shape == (3000, 1)
    # a target far from training's is told too
    for row in rows:
        row[-1] = f"{float(str(row[-1])) * 1000:.1f}"
    path = _write(tmp_path / "far.csv", header, rows)
    (one, _), (many, _), (whole, _) = _predict_both(model, path, monkeypatch, caplog)
    _same(many, whole, tmp_path)
    assert any("target column 'label'" in n for n in whole.notes)


def test_a_dataframe_and_a_parquet_file_in_many_blocks(model: LoadedModel, tmp_path: Path, monkeypatch) -> None:
    pd = pytest.importorskip("pandas")
    header, rows = _new()
    df = pd.DataFrame(rows, columns=header)
    df["weight"] = df["weight"].astype(float)
    whole = _whole(model, df)
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", SMALL)
    _same(model.predict(df), whole, tmp_path)
    path = tmp_path / "new.parquet"
    df.to_parquet(path)
    whole = _whole(model, str(path))
    monkeypatch.setattr(table_reader, "PARQUET_ROWS", 100)
    _same(model.predict(str(path)), whole, tmp_path)
    assert whole.ids[:2] == ["row 1", "row 2"]
    for path in (tmp_path / "new.jsonl", tmp_path / "new.xlsx"):
        if path.suffix == ".jsonl":
            df.to_json(path, orient="records", lines=True)
        else:
            df.to_excel(path, index=False)
        monkeypatch.undo()
        whole = _whole(model, str(path), "order")
        monkeypatch.setattr(table_reader, "BLOCK_BYTES", SMALL)
        _same(model.predict(str(path), id_column="order"), whole, tmp_path)
        assert len(whole) == 3000 and whole.ids[0] == "ord-0" and len(whole.notes) == 3


def _refused(model: LoadedModel, path: str, monkeypatch, id_column: str | None = None) -> str:
    with pytest.raises(InvalidDataset) as whole:
        _whole(model, path, id_column)
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", SMALL)
    with pytest.raises(InvalidDataset) as streamed:
        model.predict(path, id_column=id_column)
    monkeypatch.undo()
    assert str(streamed.value) == str(whole.value)
    return str(whole.value)


def test_a_bad_cell_in_a_late_block_is_refused_as_read_whole(model: LoadedModel, tmp_path: Path, monkeypatch) -> None:
    header, rows = _new()
    rows[2900][4] = "heavy"
    path = _write(tmp_path / "bad.csv", header, rows)
    assert _refused(model, path, monkeypatch) == f"{path}: column 'weight', line 2902: 'heavy' is not a number"
    # a number beyond float32 earlier, counted over all the rows; the first column's refusal first
    rows[2900][4] = "70.5"
    rows[100][4], rows[2000][4] = "1e39", "inf"
    rows[2950][2] = "cheap"
    path = _write(tmp_path / "bad2.csv", header, rows)
    told = _refused(model, path, monkeypatch)
    assert told.startswith(f"{path}: column 'weight', line 102: '1e39' is not a finite number")
    assert "2 of 3000 rows of column 'weight' are not" in told
    # an empty cell anywhere (a model that refuses them) is told first; an id column that is not there last
    rows[2990][2] = ""
    path = _write(tmp_path / "bad3.csv", header, rows)
    assert "line 102: '1e39' is not a finite number" in _refused(model, path, monkeypatch, "nope")
    refusing = _model(tmp_path, missing="refuse")
    assert "column 'price', line 2992 is empty: missing values are refused" in _refused(refusing, path, monkeypatch)
    rows[100][4], rows[2000][4], rows[2950][2], rows[2990][2] = "1", "2", "3", "4"
    path = _write(tmp_path / "ok.csv", header, rows)
    assert "id column (--id): no column 'nope'" in _refused(model, path, monkeypatch, "nope")
    # a column of the model's that is not there
    path = _write(tmp_path / "no_price.csv", [h for h in header if h != "price"], [r[:2] + r[3:] for r in rows])
    assert "no column 'price'" in _refused(model, path, monkeypatch)
    # a row of too many values late in the file, after a bad cell: the reader's refusal, as read whole
    rows[100][4], rows[2800] = "heavy", [*rows[2800], "more"]
    path = _write(tmp_path / "broken.csv", header, rows)
    assert _refused(model, path, monkeypatch) == (
        f"{path}: line 2802 has 7 values, the header 6: a cell holding the delimiter (',') without quotes? Quote such "
        'a cell ("Smith, John"), as a spreadsheet saving CSV does'
    )


def _as_before(preds: Predictions, path: Path) -> bytes:
    """The Parquet file of the whole rows' table, as `write` made it before it wrote row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    header, body = preds.rows()
    pq.write_table(pa.table({h: [r[j] for r in body] for j, h in enumerate(header)}), path)
    return path.read_bytes()


def test_parquet_predictions_are_the_file_the_whole_table_makes(model: LoadedModel, tmp_path: Path) -> None:
    path = _write(tmp_path / "new.csv", *_new(300))
    for preds in (
        model.predict(path),
        model.predict(path, id_column="label"),  # a name twice: one column, as the whole table's dict had
        _model(tmp_path, regression=True).predict(_write(tmp_path / "reg.csv", *_new(300, regression=True))),
        Predictions("regression", [], ["y"], values=np.zeros((0, 1))),
    ):
        assert preds.write(tmp_path / "p.parquet").read_bytes() == _as_before(preds, tmp_path / "before.parquet")


def _parts_folder(tmp_path: Path, header: list[str], rows: list[list[object]], sizes: list[int]) -> Path:
    """`rows` as Spark writes a table: part-0000i.csv, a `.crc` beside each, `_SUCCESS`."""
    folder = tmp_path / "spark_out"
    folder.mkdir()
    start = 0
    for i, n in enumerate(sizes):
        _write(folder / f"part-{i:05d}.csv", header, rows[start : start + n])
        (folder / f".part-{i:05d}.csv.crc").write_bytes(b"crc")
        start += n
    (folder / "_SUCCESS").write_bytes(b"")
    return folder


def test_a_folder_of_parts_predicts_every_parts_rows_in_order(
    model: LoadedModel, tmp_path: Path, monkeypatch, caplog
) -> None:
    """`smlt predict MODEL DIR` on a folder of a table's parts: the predictions of the table in one
    file, in the parts' order, each named by its part and line (or by --id); streamed block by
    block (in blocks of any size) as the parts read whole give them."""
    from smlt.cli import main

    header, rows = _new(1200)
    sizes = [500, 1, 699]
    folder = _parts_folder(tmp_path, header, rows, sizes)
    one = model.predict(_write(tmp_path / "whole.csv", header, rows))
    for id_column in (None, "order"):
        (streamed, _), (small, _), (whole, _) = _predict_both(model, str(folder), monkeypatch, caplog, id_column)
        for got in (streamed, small):
            assert got.ids == whole.ids and got.truth is not None and whole.truth is not None
            assert np.array_equal(got.truth, whole.truth)
            for a, b in ((got.index, whole.index), (got.probabilities, whole.probabilities)):
                assert a is not None and b is not None and np.array_equal(a, b)
        assert streamed.probabilities is not None and one.probabilities is not None
        assert np.array_equal(streamed.probabilities, one.probabilities) and streamed.accuracy == one.accuracy
        if id_column is None:
            expected = [f"part-{i:05d}.csv line {j + 2}" for i, n in enumerate(sizes) for j in range(n)]
            assert streamed.ids == expected and streamed.ids[500] == "part-00001.csv line 2"
        else:
            assert streamed.ids == [str(r[0]) for r in rows] and streamed.id_name == "order"
    # the notes are the whole table's, told of the folder (as of one file)
    assert [n.replace(str(folder), "T") for n in streamed.notes] == [
        n.replace(str(tmp_path / "whole.csv"), "T")
        for n in model.predict(str(tmp_path / "whole.csv"), id_column="order").notes
    ]
    out = tmp_path / "p.csv"
    assert main(["predict", str(tmp_path / "out_clsimpute"), str(folder), "--out", str(out)]) == 0  # model's run
    lines = out.read_text().splitlines()
    assert (
        len(lines) == 1201
        and lines[1].startswith("part-00000.csv line 2,")
        and lines[501].startswith("part-00001.csv line 2,")
    )


def test_a_folder_of_parts_refuses_by_the_part(model: LoadedModel, tmp_path: Path) -> None:
    header, rows = _new(300)
    folder = _parts_folder(tmp_path, header, rows, [100, 100, 100])
    with pytest.raises(
        InvalidDataset, match=r"spark_out/part-00001\.csv: column 'weight', line 4: 'heavy' is not a number"
    ):
        rows[102][4] = "heavy"
        _write(folder / "part-00001.csv", header, rows[100:200])
        model.predict(str(folder))
    _write(folder / "part-00002.csv", [h.replace("note", "remark") for h in header], rows[200:])
    with pytest.raises(InvalidDataset, match=r"spark_out/part-00002\.csv has no column 'note'"):
        model.predict(str(folder))


def test_a_folder_of_parts_in_another_encoding(model: LoadedModel, tmp_path: Path) -> None:
    header, rows = _new(200)
    for r in rows:
        r[3] = "café"  # the unused note, in cp1252
    folder = _parts_folder(tmp_path, header, rows, [120, 80])
    for p in sorted(folder.glob("part-*.csv")):
        p.write_bytes(p.read_text().encode("cp1252"))
    got = model.predict(str(folder), encoding="cp1252")
    whole = model.predict_rows(model.inputs(str(folder), encoding="cp1252"))
    assert got.ids == whole.ids and len(got) == 200 and got.ids[120] == "part-00001.csv line 2"
    with pytest.raises(InvalidDataset, match=r"spark_out/part-00000\.csv"):
        model.predict(str(folder))


def test_the_written_predictions_flag_each_row_whose_text_the_model_never_saw(
    model: LoadedModel, tmp_path: Path, monkeypatch, caplog
) -> None:
    """The column `unseen` names, per row, the text columns holding a value the model never saw
    (the cells the notice counts), streamed in blocks as read whole, in each written format."""
    import pyarrow.parquet as pq
    from openpyxl import load_workbook

    header, rows = _new()
    rows[10][1] = ""  # a missing city: imputed, never unseen
    path = _write(tmp_path / "new.csv", header, rows)
    (streamed_one, _), (streamed, told), (whole, _) = _predict_both(model, path, monkeypatch, caplog, "order")
    _same(streamed, whole, tmp_path)
    _same(streamed_one, whole, tmp_path)
    want = ["city" if r[1] not in CITIES and r[1] != "" else "" for r in rows]
    assert sum(map(bool, want)) > 30 and want[10] == ""
    n = sum(map(bool, want))
    assert any(f"column 'city': {n} of {len(rows):,} rows hold values the model never saw" in t for t in told)

    written = streamed.write(tmp_path / "p.csv").read_text().splitlines()
    assert written[0] == "order,prediction,probability,label,unseen"
    assert [line.rsplit(",", 1)[1] for line in written[1:]] == want
    table = pq.read_table(streamed.write(tmp_path / "p.parquet"))
    assert table.column_names[-1] == "unseen" and table.column("unseen").to_pylist() == want
    sheet = load_workbook(streamed.write(tmp_path / "p.xlsx"), read_only=True)["predictions"]
    cells = [r[-1] for r in sheet.iter_rows(values_only=True)]
    assert cells[0] == "unseen" and [c or "" for c in cells[1:]] == want


def test_a_model_without_text_columns_writes_no_unseen_column(tmp_path: Path) -> None:
    rows = [[r[0], r[1], r[3]] for r in _train(300, 1)]
    src = _write(tmp_path / "numbers.csv", ["weight", "price", "label"], rows)
    m = prepare_dataset(src, str(tmp_path / "prepared"), shards=2)
    card, blob = untrained(m, "mlp", tmp_path / "prepared")
    model = load_folder(run_folder(tmp_path / "out", card, blob))
    got = model.predict(_write(tmp_path / "new.csv", ["weight", "price"], [r[:2] for r in rows[:5]]))
    assert got.unseen is None
    assert got.write(tmp_path / "p.csv").read_text().splitlines()[0] == "id,prediction,probability"
