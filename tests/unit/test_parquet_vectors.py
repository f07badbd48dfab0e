"""A Parquet column of number lists (an embedding from a pretrained model) is a feature per
element, `emb[0]`, `emb[1]`, ...: prepared to the shards of the same numbers in columns of their
own, read the same way to predict; lists of another length, and other nested columns, are
refused by name."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.tabular import read_table
from smlt.runtime.errors import InvalidDataset


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
