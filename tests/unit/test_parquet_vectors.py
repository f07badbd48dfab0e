"""A Parquet column of number lists (an embedding from a pretrained model) is a feature per
element, `emb[0]`, `emb[1]`, ...: prepared to the shards of the same numbers in columns of their
own, read the same way to predict; lists of another length, and other nested columns, are
refused by name. A JSON Lines key of number lists (`{"emb": [0.1, 0.2], ...}`, as embedding dumps
are written) follows the same rule: the same shards as the Parquet list column and as a CSV with
`emb[0]`, ... written out, the same predictions, its refusals naming the line."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smlt.runtime.data import split, table_reader
from smlt.runtime.data.prepare import prepare_dataset, prepare_parts
from smlt.runtime.data.tabular import read_table
from smlt.runtime.errors import InvalidDataset
from tests.unit.untrained import loaded, untrained


def _data(n: int = 500) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(n, 6)).astype(np.float32)
    size = rng.normal(size=n)
    return emb, size, (emb[:, 0] + size > 0).astype(np.int64)


@pytest.mark.parametrize("fixed", [False, True])
def test_an_embedding_column_prepares_as_its_elements_in_columns(tmp_path, fixed):
    emb, size, y = _data()
    kind = pa.list_(pa.float32(), 6) if fixed else pa.list_(pa.float32())
    pq.write_table(pa.table({"emb": pa.array(list(emb), kind), "size": size, "label": y}), tmp_path / "lists.parquet")
    spread = {f"emb[{i}]": emb[:, i] for i in range(6)} | {"size": size, "label": y}
    (tmp_path / "s").mkdir()
    pq.write_table(pa.table(spread), tmp_path / "s" / "lists.parquet")
    a = prepare_dataset(str(tmp_path / "lists.parquet"), str(tmp_path / "a"), shards=2)
    b = prepare_dataset(str(tmp_path / "s" / "lists.parquet"), str(tmp_path / "b"), shards=2)
    assert [c.name for c in a.columns or []] == [f"emb[{i}]" for i in range(6)] + ["size"]
    assert [s.sha256 for s in a.train.shards + a.validation.shards] == [
        s.sha256 for s in b.train.shards + b.validation.shards
    ]
    rows = read_table(tmp_path / "lists.parquet")
    assert np.allclose(rows.columns["emb[3]"].astype(float), emb[:, 3])


def test_a_null_list_is_empty_cells_and_a_wrong_length_is_named(tmp_path):
    emb, _, y = _data()
    lists: list = [list(map(float, e)) for e in emb]
    lists[4] = None
    pq.write_table(pa.table({"v": pa.array(lists, pa.list_(pa.float64())), "y": y}), tmp_path / "n.parquet")
    m = prepare_dataset(str(tmp_path / "n.parquet"), str(tmp_path / "n"))
    assert [c.name for c in m.columns or []] == [f"v[{i}]" for i in range(6)]
    assert all(c.indicator for c in m.columns or [])  # imputed, with the 0/1 feature
    lists[9] = lists[9][:5]
    pq.write_table(pa.table({"v": pa.array(lists, pa.list_(pa.float64())), "y": y}), tmp_path / "r.parquet")
    with pytest.raises(
        InvalidDataset, match=r"r.parquet: column 'v', row 10 holds 5 numbers, the column's first list 6"
    ):
        prepare_dataset(str(tmp_path / "r.parquet"), str(tmp_path / "r"))


def test_other_nested_columns_are_refused_by_name(tmp_path):
    n = 100
    for name, col in (
        ("struct", pa.array([{"a": i} for i in range(n)])),
        ("words", pa.array([["a", "b"]] * n)),
    ):
        pq.write_table(pa.table({name: col, "y": np.arange(n) % 2}), tmp_path / f"{name}.parquet")
        with pytest.raises(InvalidDataset, match=rf"column '{name}' holds .*flatten it into columns of their own"):
            prepare_dataset(str(tmp_path / f"{name}.parquet"), str(tmp_path / name))


# --- JSON Lines ------------------------------------------------------------------------------


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of about 2 KB (a 600-row file of 6-number lists is ~40 of them) and split blocks of 128 rows."""
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(split, "SPLIT_ROWS", 128)


def _records(n: int = 600, seed: int = 0) -> list[dict[str, Any]]:
    """emb (6 float64s; a null list at row 4, a null element at row 7), size, colour, label
    (learnable from emb[0] + size)."""
    rng = np.random.default_rng(seed)
    emb, size = rng.normal(size=(n, 6)), rng.normal(size=n)
    records: list[dict[str, Any]] = [
        {"emb": list(map(float, e)), "size": float(s), "colour": ["red", "blue"][i % 2], "label": int(e[0] + s > 0)}
        for i, (e, s) in enumerate(zip(emb, size))
    ]
    records[4]["emb"] = None
    records[7]["emb"][2] = None
    return records


def _jsonl(path, records, lines=None):
    path.write_text("\n".join(lines or [json.dumps(r) for r in records]) + "\n")
    return str(path)


def _parquet(path, records):
    cols = {k: [r[k] for r in records] for k in records[0]}
    cols["emb"] = pa.array(cols["emb"], pa.list_(pa.float64()))
    pq.write_table(pa.table(cols), path)
    return str(path)


def _csv(path, records):
    names = [f"emb[{i}]" for i in range(6)] + ["size", "colour", "label"]

    def cells(r):
        emb = r["emb"] or [None] * 6
        return ["" if v is None else repr(v) for v in emb] + [repr(r["size"]), r["colour"], str(r["label"])]

    path.write_text("\n".join([",".join(names)] + [",".join(cells(r)) for r in records]) + "\n")
    return str(path)


def _shards(tmp_path, m, folder):
    return [(s.key, s.sha256, (tmp_path / folder / s.key).read_bytes()) for s in m.train.shards + m.validation.shards]


def test_a_jsonl_list_column_prepares_to_the_shards_of_a_parquet_list_column_and_of_a_csv(tmp_path, small_blocks):
    records = _records()
    lines = [json.dumps(r) for r in records]
    lines[300] = lines[300].replace('"size": ', '"size": "', 1).replace(', "colour"', '", "colour"', 1)
    assert json.loads(lines[300])["size"] == repr(records[300]["size"])  # its block read line by line
    made = {
        kind: prepare_dataset(write(tmp_path / f"d.{kind}", records), str(tmp_path / kind), shards=3)
        for kind, write in (("parquet", _parquet), ("csv", _csv))
    }
    made["jsonl"] = prepare_dataset(_jsonl(tmp_path / "d.jsonl", records, lines), str(tmp_path / "jsonl"), shards=3)
    m = made["jsonl"]
    assert [(c.name, c.kind, c.indicator) for c in m.columns or []] == [
        *[(f"emb[{i}]", "numeric", True) for i in range(6)],  # row 4's null list: empty cells, imputed
        ("size", "numeric", False),
        ("colour", "onehot", False),
    ]
    assert m.train.rows + m.validation.rows == 600
    for kind in ("parquet", "csv"):
        assert made[kind].model_copy(update={"source": m.source}) == m, kind
        assert _shards(tmp_path, made[kind], kind) == _shards(tmp_path, m, "jsonl"), kind


def test_a_model_of_a_jsonl_with_lists_predicts_the_same_on_a_jsonl_and_a_parquet_of_the_lists(tmp_path):
    m = prepare_dataset(_jsonl(tmp_path / "d.jsonl", _records()), str(tmp_path / "p"))
    model = loaded(*untrained(m, "logreg", tmp_path / "p"))
    new = _records(40, seed=1)
    a = model.predict(_jsonl(tmp_path / "new.jsonl", new))
    b = model.predict(_parquet(tmp_path / "new.parquet", new))
    c = model.predict(_csv(tmp_path / "new.csv", new))
    assert len(a) == 40 and a.probabilities is not None
    for other in (b, c):
        assert other.labels == a.labels
        np.testing.assert_array_equal(other.probabilities, a.probabilities)
    assert read_table(tmp_path / "new.jsonl").columns["emb[3]"][:3].tolist() == [repr(r["emb"][3]) for r in new[:3]]


def test_jsonl_parts_with_lists_prepare_as_parquet_parts(tmp_path, small_blocks):
    records = _records()
    made = {}
    for kind, write in (("jsonl", _jsonl), ("parquet", _parquet)):
        paths = [write(tmp_path / f"part-{i}.{kind}", records[a:b]) for i, (a, b) in enumerate([(0, 250), (250, 600)])]
        made[kind] = prepare_parts(paths, str(tmp_path / kind))
    assert [c.name for c in made["jsonl"].columns or []][:6] == [f"emb[{i}]" for i in range(6)]
    assert made["parquet"].model_copy(update={"source": made["jsonl"].source}) == made["jsonl"]
    assert _shards(tmp_path, made["parquet"], "parquet") == _shards(tmp_path, made["jsonl"], "jsonl")


_GOOD = '"size": 0.5, "colour": "red", "label": 1}'


@pytest.mark.parametrize("python", [False, True], ids=["arrow", "line-by-line"])
@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"emb": [0.1, 0.2, 0.3, 0.4, 0.5], ' + _GOOD,
            r"d.jsonl: column 'emb', line 345 holds 5 numbers, the column's first list 6: every list of a column "
            r"needs the same length \(or null\)",
        ),
        (
            '{"emb": ["a", "b", "c", "d", "e", "f"], ' + _GOOD,
            r"column 'emb', line 345 holds a list of text \(\"a\"\): a list of numbers \(an embedding\) is a "
            r"column per element, emb\[0\], emb\[1\], ...; a list of anything else is not \(join it",
        ),
        ('{"emb": [[1], [2], [3], [4], [5], [6]], ' + _GOOD, r"column 'emb', line 345 holds a list of JSON arrays"),
        ('{"emb": {"x": 1}, ' + _GOOD, r"column 'emb', line 345 holds a JSON object, where the file's first records"),
        ('{"emb": 0.5, ' + _GOOD, r"column 'emb', line 345 holds a JSON number, where .* every cell of the column"),
        (
            '{"emb": [1, 2, 3, 4, 5, 6], "size": [0.5], "colour": "red", "label": 1}',
            r"column 'size', line 345 holds a JSON array, where the file's first records hold single values",
        ),
        (
            '{"emb": [1, 2, 3, 4, 5, 6], "size": 0.5, "colour": {"a": "red"}, "label": 1}',
            r"column 'colour', line 345 holds a JSON object: a cell is a number, a string, true/false or null, or "
            r"a list of numbers .*; flatten nested values into keys of their own",
        ),
    ],
)
def test_a_bad_list_far_past_the_first_block_is_named_by_column_and_line(tmp_path, small_blocks, python, line, message):
    """`python`: the line's block also holds a column of numbers and strings, which pyarrow cannot
    read, so the block is read line by line."""
    records = _records()
    lines = [json.dumps(r) for r in records]
    lines[344] = line
    if python:
        lines[343] = lines[343].replace('"colour": "red"', '"colour": 3').replace('"colour": "blue"', '"colour": 3')
    with pytest.raises(InvalidDataset, match=message):
        prepare_dataset(_jsonl(tmp_path / "d.jsonl", records, lines), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("first", "message"),
    [
        ('{"emb": [], "label": 1}', r"d.jsonl: column 'emb', line 1: its first list is empty"),
        (
            '{"emb": [1, 2], "emb[1]": 3, "label": 1}',
            r"d.jsonl: key 'emb\[1\]' is also the column of an element of the list 'emb'",
        ),
    ],
)
def test_an_empty_first_list_and_a_key_named_as_an_element_are_refused(tmp_path, first, message):
    with pytest.raises(InvalidDataset, match=message):
        prepare_dataset(_jsonl(tmp_path / "d.jsonl", [], [first, '{"emb": [1, 2], "label": 0}']), str(tmp_path / "o"))
