"""`smlt data prepare` reads JSON Lines (issue #31): a JSONL file streams in blocks as a CSV does,
prepares to what the same rows as a CSV prepare to, and its refusals name the line."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from smlt.runtime.data import split, table_reader
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset

ROWS = 3000


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of about 2 KB (a 3,000-row file is ~100 of them) and split blocks of 512 rows."""
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(split, "SPLIT_ROWS", 512)


def _rows(n=ROWS, seed=0):
    """id, a (some missing), b, colour (3 levels, some missing), label (0/1, learnable)."""
    rng = np.random.default_rng(seed)
    a = np.round(rng.normal(3, 2, n), 6)
    b = np.round(rng.normal(5e3, 1e3, n), 3)
    colour = rng.choice(["red", "green", "blue"], n)
    label = (a + (colour == "red") + rng.normal(0, 0.5, n) > 3.5).astype(int)
    no_a, no_colour = rng.random(n) < 0.1, rng.random(n) < 0.05
    return [
        {
            "id": i,
            "a": None if no_a[i] else float(a[i]),
            "b": float(b[i]),
            "colour": None if no_colour[i] else str(colour[i]),
            "label": int(label[i]),
        }
        for i in range(n)
    ]


def _csv(path, rows):
    names = list(rows[0])
    lines = [",".join(names)] + [",".join("" if r[k] is None else str(r[k]) for k in names) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _jsonl(path, rows, lines=None):
    """Missing values as a key left out (for `a`) or null (for `colour`)."""
    out = [json.dumps({k: v for k, v in r.items() if not (k == "a" and v is None)}) for r in rows]
    path.write_text("\n".join(lines or out) + "\n")
    return str(path)


def _same(tmp_path, a, b):
    assert a.model_copy(update={"source": b.source}) == b  # all but the file's name
    for s in a.train.shards + a.validation.shards:
        assert (tmp_path / "csv" / s.key).read_bytes() == (tmp_path / "jsonl" / s.key).read_bytes()


def test_a_jsonl_prepares_to_the_manifest_and_shards_of_the_same_rows_as_a_csv(tmp_path, small_blocks):
    rows = _rows()
    a = prepare_dataset(_csv(tmp_path / "d.csv", rows), str(tmp_path / "csv"), shards=3)
    b = prepare_dataset(_jsonl(tmp_path / "d.jsonl", rows), str(tmp_path / "jsonl"), shards=3)
    assert a.train.rows + a.validation.rows == ROWS and a.classes == ["0", "1"]
    by_name = {c.name: c for c in b.columns or []}
    assert by_name["a"].kind == "numeric" and by_name["a"].indicator and by_name["colour"].kind == "onehot"
    _same(tmp_path, a, b)


def test_mixed_kinds_blank_lines_crlf_and_a_bom_read_as_a_csv_does(tmp_path, small_blocks):
    """A column of numbers and strings (read line by line), dates, booleans, blank lines: the same
    as the CSV of the same cells."""
    rows = _rows(1500, seed=1)
    for i, r in enumerate(rows):
        r["when"] = f"2024-01-{1 + i % 28:02d}"
        r["flag"] = i % 3 == 0
        if i % 700 == 5:
            r["b"] = str(r["b"])  # a number as a string: still a number, as in a CSV
    a = prepare_dataset(
        _csv(tmp_path / "d.csv", [{**r, "flag": str(r["flag"]).lower()} for r in rows]), str(tmp_path / "csv")
    )
    lines = [json.dumps(r) for r in rows]
    body = "\r\n".join(line + ("\n   " if i % 400 == 0 else "") for i, line in enumerate(lines))
    (tmp_path / "d.ndjson").write_bytes(b"\xef\xbb\xbf" + body.encode())
    b = prepare_dataset(str(tmp_path / "d.ndjson"), str(tmp_path / "jsonl"))
    kinds = {c.name: c.kind for c in b.columns or []}
    assert kinds["when"] == "date" and kinds["flag"] == "onehot" and kinds["b"] == "numeric"
    _same(tmp_path, a, b)


@pytest.mark.parametrize(
    ("line", "options", "message"),
    [
        (
            '{"id": 1, "a": {"x": 1}, "b": 2, "colour": "red", "label": 0}',
            {},
            r"column 'a', line 2345 holds a JSON object",
        ),
        ('[1, 2, 3, "red", 0]', {}, r"line 2345 is a JSON array, not an object"),
        ('{"id": 1, "a": 1, "b": 2', {}, r"line 2345 is not JSON"),
        ('{"id": 1, "a": 1, "b": 2, "colour": "red", "label": 0, "new": 1}', {}, r"line 2345 has key 'new'"),
        (
            '{"id": 1, "a": NaN, "b": 2, "colour": "red", "label": 0}',
            {},
            r"column 'a', line 2345: 'nan' is not a finite number",
        ),
        (
            '{"id": 1, "a": 1, "b": 1e39, "colour": "red", "label": 0}',
            {},
            r"column 'b', line 2345: '1e\+39' is not a finite",
        ),
        (
            '{"id": 1, "a": 1, "colour": "red", "label": 0}',
            {"missing": "refuse"},
            r"column 'b', line 2345 is empty: missing values are refused",
        ),
        (
            '{"id": 1, "a": 1, "b": "x", "colour": "red", "label": 0}',
            {"task": "regression", "label": "b"},
            r"column 'b', line 2345: 'x' is not a number",
        ),
    ],
)
def test_a_bad_line_far_past_the_first_block_is_named(tmp_path, small_blocks, line, options, message):
    rows = _rows()
    if options.get("missing") == "refuse":
        rows = [{**r, "a": r["a"] or 1.0, "colour": r["colour"] or "red"} for r in rows]
    lines = [json.dumps(r) for r in rows]
    lines[2344] = line
    with pytest.raises(InvalidDataset, match=message):
        prepare_dataset(
            _jsonl(tmp_path / "d.jsonl", rows, lines), str(tmp_path / "out"), options=SourceOptions(**options)
        )
    assert not (tmp_path / "out").exists()


def test_a_line_without_a_label_far_past_the_first_block_is_named_and_left_out(tmp_path, small_blocks, caplog):
    rows = _rows()
    lines = [json.dumps(r) for r in rows]
    lines[2344] = '{"id": 1, "a": 1, "b": 2, "colour": "red"}'
    path = _jsonl(tmp_path / "d.jsonl", rows, lines)
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(path, str(tmp_path / "out"))
    assert m.train.rows + m.validation.rows == ROWS - 1
    assert f"{path}: 1 of {ROWS:,} rows have no label in column 'label' (line 2345): left out" in caplog.text


def test_an_empty_file_or_one_of_blank_lines_is_named(tmp_path):
    for body in ("", "\n  \n"):
        (tmp_path / "e.jsonl").write_text(body)
        with pytest.raises(InvalidDataset, match=r"e.jsonl: a JSON Lines dataset needs at least one record"):
            prepare_dataset(str(tmp_path / "e.jsonl"), str(tmp_path / "out"))
