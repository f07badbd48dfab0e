"""Which uploads are the parts of one table (smlt.runtime.steps.upload_parts), from the listing."""

from __future__ import annotations

import pytest

from smlt.runtime.steps.prepare import find_source
from smlt.runtime.steps.prepare_limits import MAX_TABLE_BYTES, MixedUpload, TooLargeForLambda
from smlt.runtime.steps.upload_parts import MAX_PARTS, check_headers, same_table, table_parts

WHERE = "s3://data/incoming/houses/v2/"


def test_one_object_is_the_single_function_path() -> None:
    listing = {"houses.csv": 1_000, "_SUCCESS": 0}
    assert table_parts(listing, WHERE) is None
    assert find_source(listing, WHERE).root == "houses.csv"


def test_many_csv_parts_are_one_table_in_name_order() -> None:
    listing = {f"part-{i:05d}.csv": 100 + i for i in reversed(range(200))} | {"_SUCCESS": 0, "_committed_1": 9}
    parts = table_parts(listing, WHERE)
    assert parts is not None and parts.format == "csv"
    assert parts.names == tuple(f"part-{i:05d}.csv" for i in range(200))
    assert parts.bytes == sum(100 + i for i in range(200))


def test_parquet_parts_with_either_suffix() -> None:
    parts = table_parts({"a.parquet": 5, "b.pq": 6, ".crc": 1}, WHERE)
    assert parts is not None and parts.format == "parquet" and parts.names == ("a.parquet", "b.pq")


def test_json_lines_parts_are_their_own_format() -> None:
    parts = table_parts({"a.jsonl": 5, "b.ndjson": 6}, WHERE)
    assert parts is not None and parts.format == "jsonl"


@pytest.mark.parametrize(
    "listing",
    [
        {"a.csv": 1, "b.parquet": 1},  # two formats
        {"a.csv": 1, "b.jsonl": 1},
        {"a.csv": 1, "b.zip": 1},  # a table beside an archive
        {"a.csv": 1, "b.npz": 1},
        {"a.csv": 1, "cat/1.png": 1},  # beside an image folder
    ],
)
def test_different_kinds_stay_a_mixed_upload(listing: dict[str, int]) -> None:
    assert table_parts(listing, WHERE) is None
    with pytest.raises(MixedUpload, match="data sources"):
        find_source(listing, WHERE)


def test_a_part_over_one_function_is_named() -> None:
    listing = {"part-0.csv": 10, "part-1.csv": MAX_TABLE_BYTES + 1}
    with pytest.raises(TooLargeForLambda, match=r"incoming/houses/v2/part-1\.csv is .*one function"):
        table_parts(listing, WHERE)


def test_more_parts_than_the_map_takes_are_refused() -> None:
    with pytest.raises(MixedUpload, match="1,001 parts"):
        table_parts({f"p{i}.csv": 1 for i in range(MAX_PARTS + 1)}, WHERE)


def test_the_rule_has_no_limits_of_its_own() -> None:
    """`same_table` is the rule (a machine's folder uses it); the functions' limits are table_parts'."""
    many = {f"p{i:04d}.csv": 1 for i in range(MAX_PARTS + 1)} | {"_SUCCESS": 0, ".p0000.csv.crc": 1}
    parts = same_table(many)
    assert parts is not None and len(parts.names) == MAX_PARTS + 1 and parts.bytes == MAX_PARTS + 1
    big = same_table({"part-0.csv": 10, "part-1.csv": MAX_TABLE_BYTES + 1})
    assert big is not None and big.names == ("part-0.csv", "part-1.csv")


def test_headers_must_be_one_table() -> None:
    check_headers({"a.csv": ["x", "y"], "b.csv": ["x", "y"]}, WHERE)
    with pytest.raises(MixedUpload, match=r"v2/c\.csv has no column 'y'"):
        check_headers({"a.csv": ["x", "y"], "b.csv": ["x", "y"], "c.csv": ["x"]}, WHERE)
    with pytest.raises(MixedUpload, match="column 'z' that a.csv has not"):
        check_headers({"a.csv": ["x", "y"], "b.csv": ["x", "y", "z"]}, WHERE)
    with pytest.raises(MixedUpload, match="another order"):
        check_headers({"a.csv": ["x", "y"], "b.csv": ["y", "x"]}, WHERE)
