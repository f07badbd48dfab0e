"""A CSV, TSV or JSON Lines file compressed whole (gzip, bzip2, xz: `part-00000.csv.gz`, as Spark,
Firehose and pandas write them) is prepared, uploaded in parts and predicted on as the file itself,
streamed, never unpacked to disk; a damaged one, or a compressed Parquet file, is named."""

from __future__ import annotations

import bz2
import gzip
import lzma
from pathlib import Path

import numpy as np
import pytest

from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.tabular import read_table
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.steps.upload_parts import table_parts

PACK = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def _csv(rows: int = 3000) -> bytes:
    rng = np.random.default_rng(0)
    lines = ["size,colour,label"] + [
        f"{rng.normal():.4f},{rng.choice(['red', 'blue', ''])},{int(rng.integers(0, 2))}" for _ in range(rows)
    ]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("suffix", sorted(PACK))
def test_a_compressed_csv_prepares_to_the_same_shards_as_the_csv(tmp_path, suffix, monkeypatch):
    monkeypatch.setattr("smlt.runtime.data.table_reader.BLOCK_BYTES", 8 << 10)  # many blocks
    plain = tmp_path / "houses.csv"
    plain.write_bytes(_csv())
    packed = tmp_path / f"houses.csv{suffix}"
    packed.write_bytes(PACK[suffix](_csv()))
    a = prepare_dataset(str(plain), str(tmp_path / "a"), shards=2)
    b = prepare_dataset(str(packed), str(tmp_path / "b"), shards=2)
    assert b.name == "houses"
    assert [s.sha256 for s in a.train.shards + a.validation.shards] == [
        s.sha256 for s in b.train.shards + b.validation.shards
    ]
    assert read_table(packed).columns["size"].tolist() == read_table(plain).columns["size"].tolist()


def test_compressed_json_lines_and_tsv(tmp_path):
    (tmp_path / "d.jsonl.gz").write_bytes(
        gzip.compress(b"".join(b'{"a": %d, "label": %d}\n' % (i, i % 2) for i in range(50)))
    )
    assert prepare_dataset(str(tmp_path / "d.jsonl.gz"), str(tmp_path / "j")).train.rows == 40
    (tmp_path / "d.tsv.xz").write_bytes(
        lzma.compress(b"a\tlabel\n" + b"".join(b"%d\t%d\n" % (i, i % 2) for i in range(50)))
    )
    assert prepare_dataset(str(tmp_path / "d.tsv.xz"), str(tmp_path / "t")).train.rows == 40


def test_a_damaged_archive_and_a_compressed_parquet_are_named(tmp_path):
    (tmp_path / "cut.csv.gz").write_bytes(gzip.compress(_csv())[:2000])
    with pytest.raises(InvalidDataset, match=r"cut.csv.gz: not a readable .gz file \(Compressed file ended"):
        prepare_dataset(str(tmp_path / "cut.csv.gz"), str(tmp_path / "c"))
    (tmp_path / "t.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(InvalidDataset, match=r"t.parquet.gz: a Parquet file compresses its own pages"):
        prepare_dataset(str(tmp_path / "t.parquet.gz"), str(tmp_path / "p"), options=SourceOptions())


def test_spark_style_compressed_parts_are_one_table():
    parts = table_parts({"part-00000.csv.gz": 10, "part-00001.csv.gz": 12, "_SUCCESS": 0}, "s3://b/v1/")
    assert parts is not None and parts.format == "csv" and parts.names == ("part-00000.csv.gz", "part-00001.csv.gz")
    assert table_parts({"a.csv.gz": 1, "b.jsonl.gz": 1}, "s3://b/v1/") is None  # two formats


def test_an_upload_of_one_compressed_table_is_a_file(tmp_path: Path):
    from smlt.runtime.steps.prepare import find_source

    found = find_source({"houses.csv.gz": 100}, "s3://b/incoming/p/v1/")
    assert found.kind == "file" and found.root == "houses.csv.gz"


def test_a_compressed_table_is_held_to_a_tenth_of_the_table_limit():
    from smlt.runtime.steps.prepare import find_source
    from smlt.runtime.steps.prepare_limits import MAX_COMPRESSED_TABLE_BYTES, MAX_TABLE_BYTES, TooLargeForLambda

    assert MAX_COMPRESSED_TABLE_BYTES == MAX_TABLE_BYTES // 10
    big = MAX_COMPRESSED_TABLE_BYTES + 1
    find_source({"houses.csv": big}, "s3://b/v1/")  # uncompressed: within the table limit
    with pytest.raises(
        TooLargeForLambda,
        match=r"houses.csv.gz is 0.42 GB, more than one Prepare function takes of a compressed CSV or JSON Lines file: .*it may unpack to 10 times",
    ):
        find_source({"houses.csv.gz": big}, "s3://b/v1/")
    with pytest.raises(TooLargeForLambda, match=r"part-00001.csv.gz is .*: a compressed part of a table"):
        table_parts({"part-00000.csv.gz": 10, "part-00001.csv.gz": big}, "s3://b/v1/")
