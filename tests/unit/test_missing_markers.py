"""Missing markers (`NA` from R's write.csv, `#N/A` from Excel, `NULL` from a database, ...): in a
CSV or JSON Lines column whose other cells are numbers they are empty cells, imputed or refused
as empty cells are, and said once per column; in a text column they are text (a level). Prepare
and predict read them by the one rule in table_reader.Block."""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smlt.cli import main
from smlt.inference import read_inputs
from smlt.runtime.data.manifest import Manifest
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.table_fit import ColumnFit
from smlt.runtime.data.table_reader import MISSING_MARKERS, Block
from smlt.runtime.data.tables import open_table
from smlt.runtime.data.tabular import apply_columns, read_table
from smlt.runtime.errors import InvalidDataset
from tests.unit.untrained import loaded, untrained


def block_of(path) -> Block:
    blocks = list(open_table(path).blocks())
    assert len(blocks) == 1
    return blocks[0]


def test_a_marker_is_an_empty_cell_of_a_number_column_and_text_in_a_text_column(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text('b,c\n1.5,NA\nNA,Namibia\n" #N/A ",x\n,y\n2,NA\nnan,z\n')
    block = block_of(csv)
    parsed = block.numbers("b")
    assert parsed is not None
    values, gaps = parsed
    np.testing.assert_array_equal(gaps, [False, True, True, True, False, False])
    np.testing.assert_array_equal(values[[0, 4]], [1.5, 2.0])
    assert np.isnan(values[5])  # `nan` is the number NaN (refused as not finite), not a marker
    np.testing.assert_array_equal(block.markers("b"), [False, True, True, False, False, False])
    np.testing.assert_array_equal(block.gaps("b"), [False, False, False, True, False, False])  # read as text
    assert list(block.column("b", numeric=False)) == ["1.5", "NA", "#N/A", "", "2", "nan"]
    assert np.isnan(block.column("b", numeric=True)[1])
    # A column with text is text: its markers are cells like any other.
    assert block.numbers("c") is None
    assert list(block.column("c", numeric=False)) == ["NA", "Namibia", "x", "y", "NA", "z"]
    assert not block.gaps("c").any()
    assert block.first_not_a_number("c") == 1  # `Namibia`, not the marker before it


def test_every_marker_and_only_markers_are_empty(tmp_path):
    csv = tmp_path / "d.csv"
    cells = [*MISSING_MARKERS, "1", "na", "Nil", "NaN", "NA NA", "#NA"]
    csv.write_text("b\n" + "\n".join(f'"{c}"' for c in cells) + "\n")
    block = block_of(csv)
    assert block.numbers("b") is None  # `na`, `Nil`, ... are text
    assert list(block.markers("b")) == [True] * len(MISSING_MARKERS) + [False] * 6
    csv.write_text("b\n" + "\n".join([*MISSING_MARKERS, "1", "NaN"]) + "\n")
    parsed = block_of(csv).numbers("b")
    assert parsed is not None and list(parsed[1]) == [True] * len(MISSING_MARKERS) + [False, False]


def test_decimal_commas_json_lines_and_parquet(tmp_path):
    euro = tmp_path / "e.csv"
    euro.write_text("a;b\n1;0,5\n2;NA\n3;NULL\n")
    parsed = block_of(euro).numbers("b")
    assert parsed is not None and parsed[0][0] == 0.5 and list(parsed[1]) == [False, True, True]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps({"b": v}) for v in [1.5, "NA", None, "2"]) + "\n")
    parsed = block_of(jsonl).numbers("b")
    assert parsed is not None and list(parsed[1]) == [False, True, True, False]
    # Parquet has nulls of its own: a string "NA" in it is text.
    pq.write_table(pa.table({"b": pa.array(["1", "NA"])}), tmp_path / "d.parquet")
    parquet = block_of(tmp_path / "d.parquet")
    assert parquet.numbers("b") is None and not parquet.markers("b").any()


def test_a_column_fit_counts_markers_as_empty_cells_and_says_so_once(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("b\n1\nNA\n2\nNULL\nNA\n")
    block = block_of(csv)
    fit, other = ColumnFit("b", None, True, 100), ColumnFit("b", None, True, 100)
    gaps = fit.add(block, np.ones(len(block), bool))
    other.add(block, np.ones(len(block), bool))
    fit.merge(other, 6)
    assert list(gaps) == [False, True, False, True, True] and fit.numeric and fit.train_gaps == 6
    assert fit.markers_read("d.csv") == (
        "d.csv: column 'b': 6 cells written 'NA' or 'NULL' are read as empty "
        "(imputed with the train split's median, see --missing)"
    )
    # Read as text (a word among the numbers), a marker is neither a cell that is not a number
    # nor one counted: the notice names the word and counts the cells a number column would have.
    csv.write_text("b\n" + "\n".join(["NA", *map(str, range(20)), "twelve", "NA"]) + "\n")
    block = block_of(csv)
    text = ColumnFit("b", None, False, 100)
    text.add(block, np.ones(len(block), bool))
    assert text.markers_read("d.csv") is None
    told = text.mostly_numbers()
    assert told is not None and "line 23: 'twelve' is not a number" in told and "20 of its 21 cells" in told


R_ROWS = 300


def r_style_csv(path, marker_every=10):
    """What R's write.csv writes of a data frame with missing numbers: quoted text, `NA` cells."""
    rng = np.random.default_rng(0)
    lines = ['"size","colour","label"']
    for i in range(R_ROWS):
        size = rng.normal(10, 3)
        cell = "NA" if i % marker_every == 3 else f"{size:.3f}"
        lines.append(f'{cell},"{["red", "blue"][i % 2]}","{"big" if size > 10 else "small"}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_r_csv_with_na_prepares_a_number_column_imputed_and_predict_reads_na_as_empty(tmp_path, caplog):
    src = r_style_csv(tmp_path / "r.csv")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        assert main(["data", "prepare", str(src), "--out", str(tmp_path / "p")]) == 0
    told = [r.getMessage() for r in caplog.records if "read as empty" in r.getMessage()]
    assert told == [
        f"{src}: column 'size': {R_ROWS // 10} cells written 'NA' are read as empty "
        "(imputed with the train split's median, see --missing)"
    ]
    m = Manifest.model_validate_json((tmp_path / "p" / "manifest.json").read_text())
    size = (m.columns or [])[0]
    assert size.name == "size" and size.kind == "numeric" and size.indicator and isinstance(size.fill, float)
    assert m.x.shape == [1 + 1 + 2]  # size, its indicator, colour one-hot
    # Predict: `NA` in the number column is an empty cell (the median, the indicator set); in the
    # text column it is an unseen level (no level at all), not an empty cell.
    new = tmp_path / "new.csv"
    new.write_text('"size","colour","label"\nNA,"red","big"\n12.5,"NA","big"\n#N/A,"blue","small"\n')
    x = read_inputs(m, new).x
    raw = x * np.asarray(m.normalization.std) + np.asarray(m.normalization.mean)
    np.testing.assert_allclose(raw[:, 0], [size.fill, 12.5, size.fill], rtol=1e-5)
    np.testing.assert_allclose(raw[:, 1], [1, 0, 1], atol=1e-5)
    np.testing.assert_allclose(raw[1, 2:], [0, 0], atol=1e-5)
    # A model predicts on it.
    model = loaded(*untrained(m, "logreg", tmp_path / "p"))
    preds = model.predict(new)
    assert len(preds.labels) == 3 and set(preds.labels) <= {"big", "small"}
    # Another word in the number column is named, not the marker before it.
    new.write_text("size,colour\nNA,red\nlots,blue\n")
    with pytest.raises(InvalidDataset, match=r"new.csv: column 'size', line 3: 'lots' is not a number"):
        read_inputs(m, new)


def test_markers_refused_name_the_first_and_a_text_column_keeps_them_as_a_level(tmp_path, capsys):
    src = r_style_csv(tmp_path / "r.csv")
    assert main(["data", "prepare", str(src), "--missing", "refuse", "--out", str(tmp_path / "p")]) == 2
    assert "r.csv: column 'size', line 5 is empty (written 'NA'): missing values are refused" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
    # A text column: `NA` is a level (Namibia), in prepare and in predict alike, even where the
    # file to predict on has no other word in it.
    csv = tmp_path / "c.csv"
    rows = [["NA", "FR", "DE"][i % 3] + f",{i % 2}" for i in range(60)]
    csv.write_text("country,label\n" + "\n".join(rows) + "\n")
    m = prepare_dataset(str(csv), str(tmp_path / "c"), shards=2)
    country = (m.columns or [])[0]
    assert country.kind == "onehot" and country.levels == ["DE", "FR", "NA"] and not country.indicator
    later = tmp_path / "later.csv"
    later.write_text("country\nNA\n")
    x = apply_columns(m, read_table(later, {"other"}))
    raw = x * np.asarray(m.normalization.std) + np.asarray(m.normalization.mean)
    np.testing.assert_allclose(raw[0], [0, 0, 1], atol=1e-5)
    assert read_inputs(m, later).x.tolist() == x.tolist()


def test_a_numeric_label_written_na_is_an_empty_label(tmp_path, caplog):
    csv = tmp_path / "d.csv"
    csv.write_text("a,y\n" + "\n".join(f"{i},{'NA' if i == 7 else i * 0.5}" for i in range(40)) + "\n")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(csv), str(tmp_path / "p"))
    assert m.train.rows + m.validation.rows == 39  # its row left out (tests/unit/test_unlabelled_rows.py)
    assert "column 'y' (line 9; 1 written 'NA'): left out" in caplog.text
    # read as a file alone, the column of numbers and `NA` is a number column
    table = read_table(csv)
    assert table.columns["y"][7] == ""


def test_many_blocks_and_parts_read_markers_as_one_file_does(tmp_path, monkeypatch, caplog):
    from smlt.runtime.data import fit_state, split, table_reader
    from smlt.runtime.data.prepare import fit_parts

    monkeypatch.setattr(table_reader, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(split, "SPLIT_ROWS", 512)
    n = 3000
    size = np.where(np.arange(n) % 9 == 4, "NA", np.char.mod("%.3f", np.random.default_rng(1).normal(5, 1, n)))
    # numbers and `NA` for many blocks, then words: text throughout, `NA` a level
    code = np.where(np.arange(n) % 4 == 0, "NA", np.char.mod("%d", np.arange(n) % 3))
    code[2600:] = np.where(np.arange(2600, n) % 2, "x", "NA")
    label = np.char.mod("%d", np.arange(n) % 2)
    lines = [f"{s},{c},{y}" for s, c, y in zip(size, code, label)]
    whole = tmp_path / "whole.csv"
    whole.write_text("\n".join(["size,code,label", *lines]) + "\n")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(whole), str(tmp_path / "p"))
    kinds = {c.name: c for c in m.columns or []}
    assert kinds["size"].kind == "numeric" and kinds["size"].indicator
    assert kinds["code"].kind == "onehot" and kinds["code"].levels == ["0", "1", "2", "NA", "x"]
    told = [r.getMessage() for r in caplog.records if "read as empty" in r.getMessage()]
    assert told == [
        f"{whole}: column 'size': {int((size == 'NA').sum())} cells written 'NA' are read as empty "
        "(imputed with the train split's median, see --missing)"
    ]
    # In parts (the rows of three files), merged after a trip through the scratch state.
    paths = []
    for i, (a, b) in enumerate([(0, 1000), (1000, 2700), (2700, n)]):
        part = tmp_path / f"part-{i}.csv"
        part.write_text("\n".join(["size,code,label", *lines[a:b]]) + "\n")
        paths.append(str(part))
    merged, _ = fit_parts(paths, options=None)
    merged = fit_state.loads(fit_state.dumps(merged))
    (fit,) = [c for c in merged.columns if c.name == "size"]
    assert fit.marked == int((size == "NA").sum()) and fit.written == {"NA"}
    columns = {c.name: c for c in merged.transforms("classification")}
    assert columns["size"].kind == "numeric" and columns["code"].levels == kinds["code"].levels


def test_a_pipeline_version_reads_markers_by_its_first_versions_columns(tmp_path, caplog):
    from smlt.runtime.pipeline import prepare_version

    prepare_version(str(r_style_csv(tmp_path / "v1.csv")), str(tmp_path / "incoming/p/v1"), shards=2)
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        prepare_version(str(r_style_csv(tmp_path / "v2.csv", 7)), str(tmp_path / "incoming/p/v2"), shards=2)
    assert "v2.csv: column 'size': 43 cells written 'NA' are read as empty (imputed with the pipeline's recorded " in (
        caplog.text
    )
    # A first version prepared with --missing refuse refuses gaps later, a marker too.
    full = tmp_path / "f1.csv"
    full.write_text("size,label\n" + "\n".join(f"{i * 0.5},{i % 2}" for i in range(60)) + "\n")
    prepare_version(str(full), str(tmp_path / "incoming/q/v1"), shards=2, options=SourceOptions(missing="refuse"))
    full.write_text("size,label\n" + "\n".join(f"{'NULL' if i == 9 else i * 0.5},{i % 2}" for i in range(60)) + "\n")
    with pytest.raises(InvalidDataset, match=r"f1.csv: column 'size', line 11 is empty \(written 'NULL'\)"):
        prepare_version(str(full), str(tmp_path / "incoming/q/v2"), shards=2)
