"""`smlt data prepare` streams a CSV or Parquet file in blocks of bounded size (issue #31): a file
many blocks long prepares to what numpy computes from the whole file at once, to the same bytes
whatever the block size, and its refusals name the right line however far into the file it is."""

from __future__ import annotations

import csv
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import load

from smlt.runtime.data import split, spool, table_reader
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.pipeline import prepare_version

BLOCK = 2048  # bytes of CSV per block in these tests: a file of 5,000 rows is ~100 blocks
ROWS = 5000


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of BLOCK bytes and split blocks of 512 rows; records the longest block read."""
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", BLOCK)
    monkeypatch.setattr(split, "SPLIT_ROWS", 512)
    read = {"bodies": 0, "longest": 0}
    parse = table_reader._csv_block

    def recording(table, body, *args):
        read["bodies"] += 1
        read["longest"] = max(read["longest"], len(body))
        return parse(table, body, *args)

    monkeypatch.setattr(table_reader, "_csv_block", recording)
    return read


def _table(n=ROWS, seed=0):
    """id, a (some empty), b (large), colour (3 levels, some empty), label (0/1, learnable)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(3, 2, n)
    b = rng.normal(5e3, 1e3, n)
    colour = rng.choice(["red", "green", "blue"], n)
    label = (a + (colour == "red") + rng.normal(0, 0.5, n) > 3.5).astype(int)
    a_text = np.where(rng.random(n) < 0.1, "", np.char.mod("%.6f", a))
    colour_text = np.where(rng.random(n) < 0.05, "", colour)
    return {
        "id": np.arange(n).astype(str),
        "a": a_text,
        "b": np.char.mod("%.3f", b),
        "colour": colour_text,
        "label": label.astype(str),
    }


def _write(path, cols, lines=None):
    names = list(cols)
    body = [",".join(r) for r in zip(*(cols[c] for c in names))]
    path.write_text("\n".join([",".join(names)] + (lines or body)) + "\n")
    return str(path)


def _split(n, fraction=0.2, seed=0, rows=512):
    """The split rule, computed here from its definition."""
    rng = np.random.default_rng(seed)
    val, train = [], []
    for start in range(0, n, rows):
        size = min(rows, n - start)
        order = start + rng.permutation(size)
        k = max(1, int(round(size * fraction)))
        val.append(order[:k])
        train.append(order[k:])
    return np.concatenate(val), np.concatenate(train)


def _stored(folder, info):
    arrays = [load((folder / s.key).read_bytes()) for s in info.shards]
    return np.concatenate([a["x"] for a in arrays]), np.concatenate([a["y"] for a in arrays])


def test_a_csv_many_blocks_long_prepares_to_what_numpy_computes_from_the_whole_file(tmp_path, small_blocks):
    cols = _table()
    m = prepare_dataset(_write(tmp_path / "d.csv", cols), str(tmp_path / "out"), shards=4)
    assert small_blocks["bodies"] > 50 and small_blocks["longest"] <= 2 * BLOCK

    val, train = _split(ROWS)
    assert (m.train.rows, m.validation.rows) == (len(train), len(val))
    # The transforms, fitted on the train split alone.
    a = np.array([float(v) if v else np.nan for v in cols["a"]])
    fill = float(np.median(a[train][~np.isnan(a[train])]))
    by_name = {c.name: c for c in m.columns or []}
    assert by_name["a"].fill == fill and by_name["a"].indicator and by_name["b"].fill is not None
    assert by_name["colour"].kind == "onehot" and by_name["colour"].levels == ["blue", "green", "red"]
    present = cols["colour"][train][cols["colour"][train] != ""]
    levels, counts = np.unique(present, return_counts=True)
    assert by_name["colour"].fill == levels[np.argmax(counts)]
    # The features numpy makes of every row, and their train statistics.
    colour = np.where(cols["colour"] == "", by_name["colour"].fill, cols["colour"])
    x = np.column_stack(
        [
            cols["id"].astype(float),
            np.where(np.isnan(a), fill, a),
            np.isnan(a),
            cols["b"].astype(float),
            *(colour == level for level in ("blue", "green", "red")),
            cols["colour"] == "",
        ]
    ).astype(np.float32)
    mean, std = x[train].mean(axis=0, dtype=np.float64), x[train].std(axis=0, dtype=np.float64)
    np.testing.assert_allclose(m.normalization.mean, mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m.normalization.std, std, rtol=1e-12)
    # Every train row once, standardised with them, its label beside it; shards of equal size.
    stored_x, stored_y = _stored(tmp_path / "out", m.train)
    ids = np.round(stored_x[:, 0] * std[0] + mean[0]).astype(int)
    assert sorted(ids) == sorted(train)
    expected = ((x - mean.astype(np.float32)) / std.astype(np.float32)).astype(np.float32)
    np.testing.assert_allclose(stored_x, expected[ids], atol=1e-6)
    np.testing.assert_array_equal(stored_y, cols["label"].astype(int)[ids])
    assert len(m.train.shards) == 4 and {s.rows for s in m.train.shards} <= {len(train) // 4, len(train) // 4 + 1}
    assert not np.array_equal(ids[:100], np.sort(ids[:100]))  # a shard's rows are shuffled


def test_the_block_size_changes_nothing_written(tmp_path, monkeypatch):
    cols = _table(3000, seed=1)
    path = _write(tmp_path / "d.csv", cols)
    monkeypatch.setattr(split, "SPLIT_ROWS", 512)
    whole = prepare_dataset(path, str(tmp_path / "whole"), shards=3)
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", 1000)
    blocks = prepare_dataset(path, str(tmp_path / "blocks"), shards=3)
    assert blocks == whole
    for s in whole.train.shards + whole.validation.shards:
        assert (tmp_path / "blocks" / s.key).read_bytes() == (tmp_path / "whole" / s.key).read_bytes()


def test_parquet_read_in_batches_prepares_like_the_csv(tmp_path, small_blocks, monkeypatch):
    monkeypatch.setattr(table_reader, "PARQUET_ROWS", 300)
    cols = _table(2000, seed=2)
    a = prepare_dataset(_write(tmp_path / "d.csv", cols), str(tmp_path / "a"), shards=2)
    table = {
        "id": pa.array(cols["id"].astype(int)),
        "a": pa.array([float(v) if v else None for v in cols["a"]]),
        "b": pa.array(cols["b"].astype(float)),
        "colour": pa.array([v or None for v in cols["colour"]]),
        "label": pa.array(cols["label"].astype(int)),
    }
    pq.write_table(pa.table(table), tmp_path / "d.parquet", row_group_size=700)
    b = prepare_dataset(str(tmp_path / "d.parquet"), str(tmp_path / "b"), shards=2)
    assert a.columns == b.columns and a.classes == b.classes and a.train.rows == b.train.rows
    np.testing.assert_allclose(a.normalization.mean, b.normalization.mean, rtol=1e-9)
    np.testing.assert_allclose(_stored(tmp_path / "a", a.train)[0], _stored(tmp_path / "b", b.train)[0], atol=1e-6)


def test_a_column_numeric_for_many_blocks_then_text_is_text_throughout(tmp_path, small_blocks):
    cols = _table(3000, seed=3)
    cols["b"] = np.where(np.arange(3000) % 3 == 0, "small", "big")
    cols["b"][:2500] = np.char.mod("%d", np.arange(2500) % 2)  # numbers until line 2502
    m = prepare_dataset(_write(tmp_path / "d.csv", cols), str(tmp_path / "out"))
    (b,) = [c for c in m.columns or [] if c.name == "b"]
    assert b.kind == "onehot" and b.levels == ["0", "1", "big", "small"]


def test_quoted_newlines_blank_lines_and_crlf_keep_their_line_numbers(tmp_path, small_blocks):
    lines = []
    for i in range(3000):
        note = f'"a note\non two lines, {i}"' if i % 7 == 0 else "plain"
        size = "inf" if i == 2900 else f"{i % 50}.5"
        lines.append(f"{size},{note},{i % 2}\r")
        if i % 11 == 0:
            lines.append("\r")  # a blank line: not a row
    path = tmp_path / "d.csv"
    path.write_text("size,note,label\r\n" + "\n".join(lines) + "\n", newline="")
    with open(path, newline="") as f:  # Python's csv: the line each row ends on
        reader = csv.reader(f)
        next(reader)
        line_of = [reader.line_num for r in reader if r]
    with pytest.raises(
        InvalidDataset, match=rf"column 'size', line {line_of[2900]}: 'inf' is not a finite number; 1 of 3000 rows"
    ):
        prepare_dataset(str(path), str(tmp_path / "out"))


@pytest.mark.parametrize(
    "change, options, message",
    [
        (
            lambda c: c["a"].__setitem__(4000, "inf") or c["a"].__setitem__(4500, "nan"),
            {},
            r"column 'a', line 4002: 'inf' is not a finite number; 2 of 5000 rows of column 'a' are not",
        ),
        (
            lambda c: c["b"].__setitem__(4321, "1e39"),
            {},
            r"column 'b', line 4323: '1e39' is not a finite number within ±3.4e38",
        ),
        (
            lambda c: c["label"].__setitem__(4200, "many"),
            {"task": "regression"},
            r"column 'label', line 4202: 'many' is not a number \(task is regression\)",
        ),
    ],
)
def test_a_bad_cell_far_past_the_first_block_is_named_by_its_line(tmp_path, small_blocks, change, options, message):
    cols = _table()
    cols = {k: v.astype(object) for k, v in cols.items()}
    change(cols)
    with pytest.raises(InvalidDataset, match=message):
        prepare_dataset(_write(tmp_path / "d.csv", cols), str(tmp_path / "out"), options=SourceOptions(**options))
    assert not (tmp_path / "out").exists()


def test_a_row_without_a_label_far_past_the_first_block_is_named_and_left_out(tmp_path, small_blocks, caplog):
    cols = _table()
    n = len(cols["label"])
    cols["label"][4100] = ""
    csv = _write(tmp_path / "d.csv", cols)
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(csv, str(tmp_path / "out"))
    assert m.train.rows + m.validation.rows == n - 1
    assert f"{csv}: 1 of {n:,} rows have no label in column 'label' (line 4102): left out" in caplog.text


def test_missing_cells_refused_far_past_the_first_block(tmp_path, small_blocks):
    cols = _table()
    cols["a"] = np.where(cols["a"] == "", "1.0", cols["a"])
    cols["colour"] = np.where(cols["colour"] == "", "red", cols["colour"])
    cols["b"][3777] = ""
    with pytest.raises(InvalidDataset, match=r"column 'b', line 3779 is empty: missing values are refused"):
        prepare_dataset(
            _write(tmp_path / "d.csv", cols), str(tmp_path / "out"), options=SourceOptions(missing="refuse")
        )


def test_a_ragged_line_or_bytes_not_utf8_far_past_the_first_block(tmp_path, small_blocks):
    cols = _table()
    lines = [",".join(r) for r in zip(*cols.values())]
    lines[3500] = "1,2,3,4"
    with pytest.raises(InvalidDataset, match=r"d.csv: line 3502 has 4 values, the header 5"):
        prepare_dataset(_write(tmp_path / "d.csv", cols, lines), str(tmp_path / "out"))
    lines = [",".join(r) for r in zip(*cols.values())]
    path = tmp_path / "e.csv"
    _write(path, cols, lines)
    data = path.read_bytes()
    at = data.index(lines[4000].encode())
    path.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
    with pytest.raises(InvalidDataset, match=r"e.csv: line 4002, character 1 \(column 'id'\): byte 0xFF is not UTF-8"):
        prepare_dataset(str(path), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_quote_never_closed_is_refused_by_its_line_in_any_block(tmp_path, small_blocks):
    """Its row was lost when the open quote's bytes made a block of their own (no record ends)."""
    cols = _table()
    lines = [",".join(r) for r in zip(*cols.values())]
    for at in (len(lines) - 1, 3500, 2):
        broken = list(lines)
        broken[at] = broken[at].replace(",", ',"', 1)
        with pytest.raises(
            InvalidDataset, match=rf"d.csv: line {at + 2}: a quote \(\"\) opened in this row is never closed"
        ):
            prepare_dataset(_write(tmp_path / "d.csv", cols, broken), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_pipeline_version_is_checked_against_its_features_far_into_the_file(tmp_path, small_blocks):
    cols = _table(3000, seed=4)
    cols["b"] = np.char.mod("%.6e", np.random.default_rng(6).normal(size=3000) * 1e-6)
    prepare_version(_write(tmp_path / "v1.csv", cols), str(tmp_path / "incoming/p/v1"), shards=2)
    later = {k: v.astype(object) for k, v in _table(3000, seed=5).items()}
    later["b"][2800] = "3e38"  # a finite number, beyond float32 once standardised with v1's scale
    val, train = _split(3000)
    which, rows = ("validation", len(val)) if 2800 in val else ("train", len(train))
    message = rf"v2.csv \({which} split, standardised\): 1 row of {rows} hold NaN or Inf features: column 'b' \(1 row, first line 2802\)"
    with pytest.raises(InvalidDataset, match=message):
        prepare_version(_write(tmp_path / "v2.csv", later), str(tmp_path / "incoming/p/v2"), shards=2)
    assert not any((tmp_path / "incoming/p/v2").glob("*.safetensors"))
    later["b"][2800] = "tall"
    with pytest.raises(InvalidDataset) as e:
        prepare_version(_write(tmp_path / "v2.csv", later), str(tmp_path / "incoming/p/v2"), shards=2)
    # what to do: the column is numbers in the pipeline's features, a stray word in it is refused
    assert str(e.value).endswith(
        "v2.csv: column 'b', line 2802: 'tall' is not a number, and the pipeline's features read column 'b' as "
        "numbers: empty the cell (or write NA, read as empty) and upload the version again"
    ), e.value


def test_shards_stay_under_their_size_cap_and_progress_is_said(tmp_path, small_blocks, monkeypatch, caplog):
    from smlt.runtime.data import prepare

    monkeypatch.setattr(spool, "MAX_SHARD_BYTES", 20_000)
    monkeypatch.setattr(prepare, "PROGRESS_S", 0.0)
    with caplog.at_level(logging.INFO, logger="smlt.runtime.progress"):
        m = prepare_dataset(_write(tmp_path / "d.csv", _table()), str(tmp_path / "out"), shards=2)
    row = 4 * m.features + 8
    assert len(m.train.shards) == -(-m.train.rows * row // 20_000) > 2
    assert all(s.rows * row <= 20_000 for s in m.train.shards + m.validation.shards)
    said = [r.getMessage() for r in caplog.records]
    assert any("statistics (pass 1 of 2)" in s and " MB (" in s for s in said)
    assert any("shards (pass 2 of 2)" in s for s in said)


def test_a_small_source_is_split_by_one_permutation_of_its_rows():
    val, train = split.Split(0.2, 7).take(100)
    order = np.random.default_rng(7).permutation(100)
    np.testing.assert_array_equal(val, order[:20])
    np.testing.assert_array_equal(train, order[20:])


@pytest.mark.parametrize("keep, exact", [(10**6, True), (20_000, True), (4, False)])
def test_the_median_in_two_passes_is_numpys_or_within_its_bound(keep, exact):
    """Kept whole (first pass), kept in the middle's bins (second pass), or counted finer."""
    from smlt.runtime.data.stats import Median

    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(10, 3, 30_001), rng.lognormal(0, 2, 9_000), np.full(5_000, 9.5)])
    rng.shuffle(values)
    median = Median(keep)
    blocks = np.array_split(values, 37)
    for block in blocks:
        median.add(block)
    if median.needs_second_pass:
        median.start_second_pass()
        for block in blocks[::-1]:  # any blocks, any order
            median.again(block)
    expected = float(np.median(values))
    assert median.needs_second_pass == (keep < len(values))
    if exact:
        assert median.value() == expected
    assert median.value() == pytest.approx(expected, rel=2**-21)


def test_moments_merged_block_by_block_skip_nan_and_match_numpy():
    from smlt.runtime.data.stats import Moments

    rng = np.random.default_rng(1)
    x = (rng.normal(size=(10_000, 3)) * [1, 1e3, 1e-3] + [0, 1e6, 5]).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    m = Moments(3)
    for part in np.array_split(x, 13):
        m.add(part)
    m.add_constant(0, 2.5, 7)
    filled = np.concatenate([x[:, 0][~np.isnan(x[:, 0])], np.full(7, 2.5)])
    assert m.mean[0] == pytest.approx(filled.mean(dtype=np.float64), rel=1e-12)
    assert m.std[0] == pytest.approx(filled.std(dtype=np.float64), rel=1e-12)
    np.testing.assert_allclose(m.mean[1:], np.nanmean(x[:, 1:], axis=0, dtype=np.float64), rtol=1e-12)
    np.testing.assert_allclose(m.std[1:], np.nanstd(x[:, 1:].astype(np.float64), axis=0), rtol=1e-9)
    assert m.low[1] == np.nanmin(x[:, 1]) and m.high[2] == np.nanmax(x[:, 2])


def test_a_dataset_the_disk_cannot_hold_is_refused_before_any_row_is_spooled(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    src = tmp_path / "wide.csv"
    src.write_text("a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(1000)))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(
        InvalidDataset,
        match=r"wide.csv: its 1,000 rows of .* need about 0.1 GB of disk to shard, and .* has 0.0 GB free",
    ):
        prepare_dataset(str(src), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
