"""Rows without a label (a Kaggle train+test concatenation, rows awaiting review) are left out of
both splits and said once, as AutoGluon does: a label cell is missing when it is empty, or a
missing marker (`NA`, `#N/A`, `NULL`, ...) in a label column of numbers; in a text label column
`NA` is a class. What is prepared is what the same file with those rows deleted by hand prepares
to, byte for byte: the same split, shards and statistics (LabelFit.labelled, before the split, in
both passes; whole file or in parts)."""

from __future__ import annotations

import gzip
import json
import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smlt.cli import main
from smlt.runtime.data import fit_state, split, table_reader
from smlt.runtime.data.parts import merge_fits
from smlt.runtime.data.prepare import TableTransforms, fit_part, fit_parts, prepare_dataset, prepare_parts
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.pipeline import feature_spec, prepare_version
from smlt.runtime.progress import collected_notices

N = 3000


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of about 2 KB (a 3,000-row file is ~100 of them) and split blocks of 512 rows."""
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(split, "SPLIT_ROWS", 512)


def _columns(n: int = N, seed: int = 0) -> dict[str, np.ndarray]:
    """a (some empty), b, colour (some empty), leak (a copy of the label), label (0/1)."""
    rng = np.random.default_rng(seed)
    a = np.round(rng.normal(3, 2, n), 4)
    colour = rng.choice(["red", "green", "blue"], n)
    label = (a + (colour == "red") + rng.normal(0, 0.5, n) > 3.5).astype(int)
    return {
        "a": np.where(rng.random(n) < 0.1, "", np.char.mod("%.4f", a)),
        "b": np.char.mod("%.3f", rng.normal(5e3, 1e3, n)),
        "colour": np.where(rng.random(n) < 0.05, "", colour),
        "leak": np.char.mod("%d", label),
        "label": np.char.mod("%d", label),
    }


def _unlabelled(n: int = N, seed: int = 1) -> np.ndarray:
    """Where rows lose their label: scattered ones, and a run of 700 (whole blocks without one)."""
    rng = np.random.default_rng(seed)
    gone = rng.random(n) < 0.08
    gone[1200:1900] = True
    return gone


def _csv(path: Path, cols: dict[str, np.ndarray], keep: np.ndarray | None = None) -> str:
    keep = np.ones(len(cols["label"]), bool) if keep is None else keep
    rows = zip(*(v[keep] for v in cols.values()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([",".join(cols), *(",".join(r) for r in rows)]) + "\n")
    return str(path)


def _prepared(dest: Path) -> tuple[dict, dict[str, bytes]]:
    """The manifest (but for its name and source) and every shard's bytes."""
    manifest = json.loads((dest / "manifest.json").read_text())
    for k in ("name", "source"):
        manifest.pop(k)
    return manifest, {p.name: p.read_bytes() for p in sorted(dest.glob("*.safetensors"))}


def _told(caplog, path: str | None = None) -> list[str]:
    """The notices, the file's name made neutral (two files prepare to the same notices)."""
    said = [r.getMessage() for r in caplog.records if r.name == "smlt.notice"]
    return [s.replace(path, "F") for s in said] if path else said


def _lines(gone: np.ndarray, first: int = 2) -> list[int]:
    return (np.flatnonzero(gone) + first).tolist()


def test_a_csv_with_empty_labels_prepares_as_the_file_with_those_rows_deleted(tmp_path, small_blocks, caplog):
    cols, gone = _columns(), _unlabelled()
    cols["label"] = np.where(gone, "", cols["label"])
    messy = _csv(tmp_path / "messy" / "d.csv", cols)
    clean = _csv(tmp_path / "clean" / "d.csv", cols, ~gone)
    caplog.set_level(logging.INFO, logger="smlt.notice")
    m = prepare_dataset(messy, str(tmp_path / "p_messy"), shards=4, seed=3)
    told_messy = _told(caplog, messy)
    caplog.clear()
    prepare_dataset(clean, str(tmp_path / "p_clean"), shards=4, seed=3)
    told_clean = _told(caplog, clean)

    assert m.train.rows + m.validation.rows == int((~gone).sum())
    assert _prepared(tmp_path / "p_messy") == _prepared(tmp_path / "p_clean")  # split, shards, statistics
    first = _lines(gone)[:3]
    notice = (
        f"F: {int(gone.sum()):,} of {N:,} rows have no label in column 'label' "
        f"(lines {first[0]}, {first[1]}, {first[2]}, ...): left out of training and validation"
    )
    assert told_messy == [notice, *told_clean]  # said once; the leak and the rest as for the clean file
    assert any("'leak'" in t for t in told_clean)  # found on the labelled rows only


def test_a_compressed_csv_and_json_lines_leave_unlabelled_rows_out_too(tmp_path, caplog):
    cols = _columns(200)
    gone = np.zeros(200, bool)
    gone[[4, 50, 51]] = True
    clean = _csv(tmp_path / "clean.csv", cols, ~gone)
    prepare_dataset(clean, str(tmp_path / "p_clean"), shards=2)
    caplog.set_level(logging.INFO, logger="smlt.notice")

    cols["label"] = np.where(gone, "", cols["label"])
    body = Path(_csv(tmp_path / "plain.csv", cols)).read_bytes()
    packed = tmp_path / "d.csv.gz"
    packed.write_bytes(gzip.compress(body))
    prepare_dataset(str(packed), str(tmp_path / "p_gz"), shards=2)
    assert _prepared(tmp_path / "p_gz") == _prepared(tmp_path / "p_clean")

    # JSON Lines: a label left out of its object, or null (the numbers as the CSV writes them)
    rows = [
        {k: (None if v == "" else float(v) if k in "ab" else v) for k, v in zip(cols, r)} for r in zip(*cols.values())
    ]
    for r in rows:
        r["leak"], r["label"] = int(r["leak"]), None if r["label"] is None else int(r["label"])
    rows[4].pop("label")
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prepare_dataset(str(jsonl), str(tmp_path / "p_jsonl"), shards=2)
    assert _prepared(tmp_path / "p_jsonl") == _prepared(tmp_path / "p_clean")
    told = [t for t in _told(caplog) if "no label" in t]
    assert told == [
        f"{packed}: 3 of 200 rows have no label in column 'label' (lines 6, 52, 53): left out of training and validation",
        f"{jsonl}: 3 of 200 rows have no label in column 'label' (lines 5, 51, 52): left out of training and validation",
    ]


def test_a_parquet_files_null_labels_are_left_out(tmp_path, caplog):
    rng = np.random.default_rng(4)
    n = 400
    x = rng.normal(size=n)
    y = np.round(2 * x + rng.normal(0, 0.1, n), 3)
    gone = np.zeros(n, bool)
    gone[[0, 7, 300]] = True
    y_null = pa.array(np.where(gone, 0, y), mask=gone)

    def write(path: Path, keep: np.ndarray, label: pa.Array) -> str:
        pq.write_table(pa.table({"x": x[keep], "kind": np.array(["p", "q"])[np.arange(n) % 2][keep], "y": label}), path)
        return str(path)

    everything = np.ones(n, bool)
    caplog.set_level(logging.INFO, logger="smlt.notice")
    m = prepare_dataset(write(tmp_path / "nulls.parquet", everything, y_null), str(tmp_path / "p1"))
    prepare_dataset(write(tmp_path / "clean.parquet", ~gone, pa.array(y[~gone])), str(tmp_path / "p2"))
    assert m.task == "regression" and m.train.rows + m.validation.rows == n - 3
    assert _prepared(tmp_path / "p1") == _prepared(tmp_path / "p2")
    # a float NaN is empty in a Parquet number column, as a null is
    nan = write(tmp_path / "nan.parquet", everything, pa.array(np.where(gone, np.nan, y)))
    prepare_dataset(nan, str(tmp_path / "p3"))
    assert _prepared(tmp_path / "p3") == _prepared(tmp_path / "p2")
    # a text label's nulls
    kinds = np.array(["cat", "dog"])[(x > 0).astype(int)]
    text = write(tmp_path / "text.parquet", everything, pa.array(np.where(gone, None, kinds).tolist(), pa.string()))
    prepare_dataset(text, str(tmp_path / "p4"))
    prepare_dataset(write(tmp_path / "t2.parquet", ~gone, pa.array(kinds[~gone])), str(tmp_path / "p5"))
    assert _prepared(tmp_path / "p4") == _prepared(tmp_path / "p5")
    assert [t for t in _told(caplog) if "no label" in t] == [
        f"{tmp_path / name}.parquet: 3 of 400 rows have no label in column 'y' (rows 1, 8, 301): "
        "left out of training and validation"
        for name in ("nulls", "nan", "text")
    ]


def test_a_number_labels_missing_markers_are_left_out_a_text_labels_are_a_class(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="smlt.notice")
    numbers = tmp_path / "d.csv"
    marks = {7: "NA", 8: " #N/A ", 20: "NULL", 30: ""}
    numbers.write_text("a,y\n" + "\n".join(f"{i},{marks.get(i, i * 0.5)}" for i in range(40)) + "\n")
    m = prepare_dataset(str(numbers), str(tmp_path / "p"))
    assert m.task == "regression" and m.train.rows + m.validation.rows == 36
    clean = tmp_path / "c.csv"
    clean.write_text("a,y\n" + "\n".join(f"{i},{i * 0.5}" for i in range(40) if i not in marks) + "\n")
    prepare_dataset(str(clean), str(tmp_path / "c"))
    assert _prepared(tmp_path / "p") == _prepared(tmp_path / "c")
    assert [t for t in _told(caplog) if "no label" in t] == [
        f"{numbers}: 4 of 40 rows have no label in column 'y' (lines 9, 10, 22, ...; 3 written '#N/A' or 'NA' "
        "or 'NULL'): left out of training and validation"
    ]
    # In a text label column `NA` is a class (Namibia), an empty cell is still missing.
    caplog.clear()
    text = tmp_path / "t.csv"
    text.write_text("a,y\n" + "\n".join(f"{i},{['NA', 'DE', 'FR'][i % 3] if i != 5 else ''}" for i in range(40)) + "\n")
    m = prepare_dataset(str(text), str(tmp_path / "t"))
    assert m.classes == ["DE", "FR", "NA"] and m.train.rows + m.validation.rows == 39
    assert [t for t in _told(caplog) if "no label" in t] == [
        f"{text}: 1 of 40 rows have no label in column 'y' (line 7): left out of training and validation"
    ]


def test_a_label_of_numbers_and_na_for_many_blocks_then_words_keeps_na_as_a_class(tmp_path, small_blocks, caplog):
    """Pass 1 left `NA` rows out while the label was numbers; a word later makes it text, `NA` a
    class: pass 1 starts again (whole file and in parts), and pass 2 reads it as text too."""
    n = 3000
    label = np.where(np.arange(n) % 7 == 3, "NA", np.char.mod("%d", np.arange(n) % 2)).astype("U8")
    label[2500::50] = "other"
    label[2501] = ""  # still missing
    x = np.char.mod("%.3f", np.random.default_rng(2).normal(size=n))
    whole = _csv(tmp_path / "w.csv", {"x": x, "label": label})
    caplog.set_level(logging.INFO, logger="smlt.notice")
    m = prepare_dataset(whole, str(tmp_path / "p"), shards=2)
    assert m.classes == ["0", "1", "NA", "other"] and m.train.rows + m.validation.rows == n - 1
    assert [t for t in _told(caplog) if "no label" in t] == [
        f"{whole}: 1 of 3,000 rows have no label in column 'label' (line 2503): left out of training and validation"
    ]
    # in parts: the first two numbers and NA, the last with the words
    parts = [
        _csv(tmp_path / f"part-{i}.csv", {"x": x[a:b], "label": label[a:b]})
        for i, (a, b) in enumerate([(0, 1000), (1000, 2000), (2000, n)])
    ]
    fit, rows = fit_parts(parts)
    assert fit.labels.as_text and not fit.flipped and sum(r.train + r.validation for r in rows) == n - 1
    mp = prepare_parts(parts, str(tmp_path / "parts"))
    assert mp.classes == m.classes and mp.train.rows + mp.validation.rows == n - 1


def test_a_table_in_parts_leaves_out_the_same_rows_as_the_parts_deleted_by_hand(tmp_path, small_blocks, caplog):
    cols, gone = _columns(), _unlabelled()
    cols["label"] = np.where(gone, "", cols["label"])
    cuts = [(0, 1000), (1000, 2000), (2000, N)]
    messy, clean = [], []
    for i, (a, b) in enumerate(cuts):
        part = {k: v[a:b] for k, v in cols.items()}
        messy.append(_csv(tmp_path / "messy" / f"part-{i:05d}.csv", part))
        clean.append(_csv(tmp_path / "clean" / f"part-{i:05d}.csv", part, ~gone[a:b]))
    caplog.set_level(logging.INFO, logger="smlt.notice")
    m = prepare_parts(messy, str(tmp_path / "p_messy"), seed=5)
    told = [t for t in _told(caplog) if "no label" in t]
    prepare_parts(clean, str(tmp_path / "p_clean"), seed=5)
    assert m.train.rows + m.validation.rows == int((~gone).sum())
    assert _prepared(tmp_path / "p_messy") == _prepared(tmp_path / "p_clean")
    first = _lines(gone)[:3]  # all in the first part (lines 2 on)
    assert first[-1] < 1000
    notice = (
        f"{messy[0]} and 2 more parts: {int(gone.sum()):,} of {N:,} rows have no label in column 'label' "
        f"(part-00000.csv lines {first[0]}, {first[1]}, {first[2]}, ...): left out of training and validation"
    )
    assert told == [notice]
    # As the Distributed Map's children and the step after the Map do: each part's pass 1 stored
    # and read back, then merged; the whole table's notice once.
    caplog.clear()
    fits = [fit_state.loads(fit_state.dumps(fit_part(p, i, seed=5))) for i, p in enumerate(messy)]
    TableTransforms.of(merge_fits(fits))
    assert [t for t in _told(caplog) if "no label" in t] == [notice]


def test_the_first_rows_without_a_label_are_named_by_their_part(tmp_path, caplog):
    cols = _columns(90)
    cols["label"][[40, 70, 75, 80]] = ""
    parts = [_csv(tmp_path / f"part-{i}.csv", {k: v[i * 30 : i * 30 + 30] for k, v in cols.items()}) for i in range(3)]
    caplog.set_level(logging.INFO, logger="smlt.notice")
    prepare_parts(parts, str(tmp_path / "p"))
    assert [t for t in _told(caplog) if "no label" in t] == [
        f"{parts[0]} and 2 more parts: 4 of 90 rows have no label in column 'label' (part-1.csv line 12; part-2.csv lines 12, 17, "
        "...): left out of training and validation"
    ]


def test_a_pipelines_later_version_leaves_unlabelled_rows_out_and_its_notes_say_so(tmp_path):
    cols = _columns(300)
    v1 = prepare_dataset(_csv(tmp_path / "v1.csv", cols), str(tmp_path / "v1"), shards=2)
    spec = feature_spec(v1, 1)
    later, gone = _columns(300, seed=9), np.zeros(300, bool)
    gone[[3, 4, 250]] = True
    later["label"] = np.where(gone, "", later["label"])
    v2 = _csv(tmp_path / "v2.csv", later)
    with collected_notices() as notes:  # what a pipeline's Prepare step answers as `prepared.notes`
        prepare_dataset(v2, str(tmp_path / "v2"), shards=2, features=spec)
    prepare_dataset(_csv(tmp_path / "v2c.csv", later, ~gone), str(tmp_path / "v2c"), shards=2, features=spec)
    assert _prepared(tmp_path / "v2") == _prepared(tmp_path / "v2c")
    assert (
        f"{v2}: 3 of 300 rows have no label in column 'label' (lines 5, 6, 252): left out of training and validation"
        in notes
    )

    # prepare_version, the CLI's way to a pipeline's version folder
    pipe = tmp_path / "incoming" / "shop"
    prepare_version(_csv(tmp_path / "first.csv", cols), str(pipe / "v1"), shards=2)
    with collected_notices() as notes:
        m, _ = prepare_version(v2, str(pipe / "v2"), shards=2)
    assert m.train.rows + m.validation.rows == 297 and any("have no label" in n for n in notes)


def test_too_few_labelled_rows_are_refused_naming_the_column(tmp_path):
    empty = tmp_path / "e.csv"
    empty.write_text("a,label\n" + "\n".join(f"{i}," for i in range(50)) + "\n")
    with pytest.raises(InvalidDataset, match=r"e.csv: no row has a label in column 'label' \(all 50 are empty\)"):
        prepare_dataset(str(empty), str(tmp_path / "p"))
    assert not (tmp_path / "p").exists()
    marked = tmp_path / "m.csv"
    marked.write_text("a,y\n" + "\n".join(f"{i},{'NA' if i else 2.5}" for i in range(50)) + "\n")
    with pytest.raises(InvalidDataset, match=r"m.csv: only 1 of 50 rows has a label in column 'y': at least 2"):
        prepare_dataset(str(marked), str(tmp_path / "p"))
    nulls = tmp_path / "n.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0], "label": pa.array([None, None], pa.int64())}), nulls)
    with pytest.raises(InvalidDataset, match=r"n.parquet: no row has a label in column 'label' \(all 2 are empty\)"):
        prepare_dataset(str(nulls), str(tmp_path / "p"))
    # in parts: the whole table's count, after the merge
    parts = [empty, tmp_path / "e2.csv"]
    parts[1].write_text("a,label\n1,\n")
    with pytest.raises(
        InvalidDataset, match=re.escape(f"{empty} and 1 more parts: no row has a label in column 'label' (all 51")
    ):
        prepare_parts([str(p) for p in parts], str(tmp_path / "q"))


def test_the_cli_prints_the_notice_on_stderr(tmp_path, capsys):
    cols = _columns(100)
    cols["label"][[10, 20]] = ""
    src = _csv(tmp_path / "d.csv", cols)
    assert main(["data", "prepare", src, "--out", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    assert (
        f"{src}: 2 of 100 rows have no label in column 'label' (lines 12, 22): left out of training and validation"
        in err
    )
