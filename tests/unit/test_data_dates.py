"""Date columns: a text column every present cell of which is an ISO-8601 date or date-time (or a
Parquet date or timestamp column) becomes features (days since 1970-01-01, month, day of the
week, the hour when it has times), imputed with the train split's median date or refused, by the
one rule prepare, the parts path, a pipeline's later versions and predict share."""

from __future__ import annotations

import datetime
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import load_file

from smlt.inference import read_inputs
from smlt.runtime.data import fit_state
from smlt.runtime.data.manifest import Manifest
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.parts import fit_parts, prepare_parts
from smlt.runtime.data.prepare import TableTransforms, prepare_dataset
from smlt.runtime.data.split import Split
from smlt.runtime.data.table_fit import TableFit
from smlt.runtime.data.table_reader import parse_dates
from smlt.runtime.data.tables import open_table
from smlt.runtime.data.tabular import apply_columns, date_features, encode_columns, feature_names, read_table
from smlt.runtime.errors import InvalidDataset


def _days(d: str) -> float:
    t = datetime.datetime.fromisoformat(d)
    return (t - datetime.datetime(1970, 1, 1)).total_seconds() / 86400


def _table(path: Path, n: int, seed: int = 0, times: bool = False, gaps: bool = True) -> list[str]:
    """`signup,amount,city,label` rows: signup a date (with times when `times`; every 11th empty,
    every 17th `NA`, when `gaps`)."""
    rng = np.random.default_rng(seed)
    lines = ["signup,amount,city,label"]
    for i in range(n):
        d = datetime.datetime(2020, 1, 1) + datetime.timedelta(days=int(rng.integers(0, 1500)))
        cell = d.strftime("%Y-%m-%d")
        if times:
            cell += (" " if i % 2 else "T") + f"{int(rng.integers(0, 24)):02d}:{int(rng.integers(0, 60)):02d}:00"
        if gaps and i % 11 == 3:
            cell = ""
        elif gaps and i % 17 == 5:
            cell = "NA"
        lines.append(f"{cell},{rng.normal():.4f},{'abc'[i % 3]},{i % 2}")
    path.write_text("\n".join(lines) + "\n")
    return lines[1:]


def _stored(m: Manifest, out: Path) -> np.ndarray:
    """Every stored row (train and validation shards), in a canonical order."""
    xs = [load_file(out / s.key)["x"] for s in m.train.shards + m.validation.shards]
    x = np.concatenate(xs)
    return x[np.lexsort(x.T[::-1])]


def test_iso_dates_and_date_times_parse_other_formats_do_not() -> None:
    parsed = parse_dates(pa.array(["2024-03-17", None, "2024-03-17T10:05:00", "2024-03-17 10:05:00.5"]))
    assert parsed is not None
    days, gaps = parsed
    assert gaps.tolist() == [False, True, False, False]
    np.testing.assert_allclose(
        days[[0, 2, 3]], [_days("2024-03-17"), _days("2024-03-17T10:05"), _days("2024-03-17T10:05:00.5")]
    )
    zoned = parse_dates(pa.array(["2024-03-17T10:05:00Z", "2024-03-17T12:05:00+02:00"]))
    assert zoned is not None and zoned[0][0] == zoned[0][1] == _days("2024-03-17T10:05")  # instants in UTC
    for other in (
        ["03/17/2024"],
        ["2024-3-7"],
        ["2024-03-17", "2024-03-17T10:05:00Z"],
        ["2024"],
        ["1.5"],
        ["2024-02-30"],
    ):
        assert parse_dates(pa.array(other)) is None, other
    # days, month, weekday (Monday 0), hour; NaN stays NaN
    f = date_features(np.array([_days("2024-03-17T10:00"), np.nan, -0.25]), ["days", "month", "weekday", "hour"])
    np.testing.assert_allclose(f[0], [_days("2024-03-17T10:00"), 3, 6, 10])
    assert np.isnan(f[1]).all()
    np.testing.assert_allclose(f[2], [-0.25, 12, 2, 18])  # 1969-12-31 18:00, a Wednesday


def test_a_date_column_prepares_as_features_imputed_with_the_median_and_predict_agrees(tmp_path, caplog) -> None:
    src = tmp_path / "signups.csv"
    lines = _table(src, 500)
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(src), str(tmp_path / "p"), options=SourceOptions(missing="impute"))
    signup = (m.columns or [])[0]
    assert signup.kind == "date" and signup.levels == ["days", "month", "weekday"] and signup.indicator
    assert m.x.shape == [3 + 1 + 1 + 3]
    assert feature_names(m.columns or [])[:4] == ["signup"] * 4
    told = caplog.text
    assert (
        "date column read as features ('signup': days since 1970-01-01, month 1-12, day of the week (Monday 0))" in told
    )
    assert "distinct values" not in told  # not hashed
    # the fill is the train split's median date
    _, train = Split(0.2, 0).take(len(lines))
    cells = [lines[i].split(",")[0] for i in train]
    expected = np.median([_days(c) for c in cells if c not in ("", "NA")])
    assert signup.fill == expected
    # predict on the same file stores what the shards store (row order aside)
    x = apply_columns(m, read_table(src, {"signup", "amount"}))
    np.testing.assert_allclose(x[np.lexsort(x.T[::-1])], _stored(m, tmp_path / "p"), atol=1e-5)
    raw = encode_columns(m.columns or [], read_table(src, {"signup", "amount"}))
    assert raw[3, 3] == 1 and raw[5, 3] == 1 and raw[0, 3] == 0  # empty and NA: the indicator
    np.testing.assert_allclose(raw[3, :3], date_features(np.array([expected]), signup.levels)[0])
    np.testing.assert_allclose(raw[0, :3], date_features(np.array([_days(lines[0].split(",")[0])]), signup.levels)[0])
    # through predict's reader, and a cell that is not a date named
    new = tmp_path / "new.csv"
    new.write_text("signup,amount,city\n2025-01-06,0.5,a\nNA,0.1,b\n")
    got = read_inputs(m, new).x * np.asarray(m.normalization.std) + np.asarray(m.normalization.mean)
    np.testing.assert_allclose(got[0, :4], [_days("2025-01-06"), 1, 0, 0], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got[1, :4], [*date_features(np.array([expected]), signup.levels)[0], 1], rtol=1e-5)
    new.write_text("signup,amount,city\n2025-01-06,0.5,a\n06/01/2025,0.1,b\n")
    with pytest.raises(InvalidDataset, match=r"new.csv: column 'signup', line 3: '06/01/2025' is not a date"):
        read_inputs(m, new)


def test_date_times_add_the_hour_and_other_formats_stay_text(tmp_path) -> None:
    src = tmp_path / "t.csv"
    _table(src, 200, times=True, gaps=False)
    m = prepare_dataset(str(src), str(tmp_path / "p"))
    (signup, *_) = m.columns or []
    assert signup.kind == "date" and signup.levels == ["days", "month", "weekday", "hour"] and not signup.indicator
    x = apply_columns(m, read_table(src, {"signup", "amount"}))
    np.testing.assert_allclose(x[np.lexsort(x.T[::-1])], _stored(m, tmp_path / "p"), atol=1e-5)
    us = tmp_path / "us.csv"
    us.write_text("signup,label\n" + "".join(f"03/{i % 28 + 1:02d}/2024,{i % 2}\n" for i in range(100)))
    m = prepare_dataset(str(us), str(tmp_path / "q"))
    assert (m.columns or [])[0].kind == "hash"
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("signup,label\n" + "".join(f"2024-03-{i % 28 + 1:02d},{i % 2}\n" for i in range(100)) + "soon,0\n")
    assert (prepare_dataset(str(mixed), str(tmp_path / "r")).columns or [])[0].kind == "hash"


def test_missing_refuse_names_an_empty_date(tmp_path) -> None:
    src = tmp_path / "g.csv"
    _table(src, 50)
    with pytest.raises(InvalidDataset, match=r"g.csv: column 'signup', line 5 is empty: missing values are refused"):
        prepare_dataset(str(src), str(tmp_path / "p"), options=SourceOptions(missing="refuse"))
    # a missing marker is an empty cell of a date column, refused as one
    src.write_text("\n".join(line for line in src.read_text().splitlines() if not line.startswith(",")) + "\n")
    with pytest.raises(InvalidDataset, match=r"g.csv: column 'signup', line 6 is empty: missing values are refused"):
        prepare_dataset(str(src), str(tmp_path / "p"), options=SourceOptions(missing="refuse"))


def test_many_blocks_read_a_date_column_as_one_block_does(tmp_path, monkeypatch) -> None:
    from smlt.runtime.data import table_reader

    src = tmp_path / "many.csv"
    _table(src, 3000, times=True)
    one = prepare_dataset(str(src), str(tmp_path / "one"))
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", 2048)
    many = prepare_dataset(str(src), str(tmp_path / "many"))
    assert many.columns == one.columns and (many.columns or [])[0].kind == "date"
    np.testing.assert_allclose(many.normalization.mean, one.normalization.mean, rtol=1e-9)
    # a cell that is not a date in a late block: text, its levels counted from the first block
    lines = src.read_text().splitlines()
    lines[2900] = "soon" + lines[2900][lines[2900].index(",") :]
    src.write_text("\n".join(lines) + "\n")
    text = prepare_dataset(str(src), str(tmp_path / "text"))
    assert (text.columns or [])[0].kind == "hash"


def test_parquet_date_and_timestamp_columns_are_date_columns(tmp_path) -> None:
    src = tmp_path / "d.csv"
    lines = _table(src, 300, times=True, gaps=False)
    from_csv = prepare_dataset(str(src), str(tmp_path / "c"))
    stamps = [datetime.datetime.fromisoformat(r.split(",")[0]) for r in lines]
    rest = [r.split(",") for r in lines]
    table = pa.table(
        {
            "signup": pa.array(stamps, pa.timestamp("ms")),
            "amount": [float(r[1]) for r in rest],
            "city": [r[2] for r in rest],
            "label": [int(r[3]) for r in rest],
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    from_parquet = prepare_dataset(str(tmp_path / "d.parquet"), str(tmp_path / "q"))
    assert from_parquet.columns == from_csv.columns
    np.testing.assert_allclose(from_parquet.normalization.mean, from_csv.normalization.mean, rtol=1e-9)
    x = apply_columns(from_parquet, read_table(tmp_path / "d.parquet", {"signup", "amount"}))
    np.testing.assert_allclose(x[np.lexsort(x.T[::-1])], _stored(from_parquet, tmp_path / "q"), atol=1e-5)
    # a timestamp with a zone: its instant in UTC, whether read typed (prepare) or as text (predict)
    zoned = table.set_column(0, "signup", table["signup"].cast(pa.timestamp("us", "Europe/Paris")))
    pq.write_table(zoned, tmp_path / "z.parquet")
    m = prepare_dataset(str(tmp_path / "z.parquet"), str(tmp_path / "z"))
    assert (m.columns or [])[0].kind == "date"
    x = apply_columns(m, read_table(tmp_path / "z.parquet", {"signup", "amount"}))
    np.testing.assert_allclose(x[np.lexsort(x.T[::-1])], _stored(m, tmp_path / "z"), atol=1e-5)
    days = pa.table({"signup": pa.array([s.date() for s in stamps], pa.date32()), "label": table["label"]})
    pq.write_table(days, tmp_path / "e.parquet")
    m = prepare_dataset(str(tmp_path / "e.parquet"), str(tmp_path / "e"))
    assert (m.columns or [])[0].kind == "date" and (m.columns or [])[0].levels == ["days", "month", "weekday"]


def _one_pass(whole: Path, sizes: list[int], opts: SourceOptions) -> TableFit:
    table = open_table(whole)
    (block,) = list(table.blocks())
    fit = TableFit(str(whole), "label", [c for c in table.columns if c != "label"], opts)
    start = 0
    for i, n in enumerate(sizes):
        val, train = Split(0.2, (0, i)).take(n)
        fit.add(block.slice(start, start + n), val, train)
        start += n
    return fit


def test_parts_fit_and_prepare_a_date_column_as_the_whole_file(tmp_path) -> None:
    sizes = [300, 1, 700]
    paths, lines = [], []
    for i, n in enumerate(sizes):
        p = tmp_path / f"part-{i}.csv"
        lines += _table(p, n, seed=i, times=i == 2)  # only the last part has times: the hour is the whole's
        paths.append(str(p))
    whole = tmp_path / "whole.csv"
    whole.write_text("\n".join(["signup,amount,city,label", *lines]) + "\n")
    opts = SourceOptions(missing="impute")
    merged, _ = fit_parts(paths, options=opts)
    merged = fit_state.loads(fit_state.dumps(merged))
    one = _one_pass(whole, sizes, opts)
    assert merged.transforms("classification") == one.transforms("classification")
    t, o = TableTransforms.of(merged), TableTransforms.of(one)
    assert t.columns[0].kind == "date" and t.columns[0].levels == ["days", "month", "weekday", "hour"]
    assert merged.columns[0].median.value() == one.columns[0].median.value()
    assert o.names == t.names
    # prepared in parts, the stored rows are those predict makes of the whole file
    m = prepare_parts(paths, str(tmp_path / "out"), options=opts)
    assert m.columns is not None and m.columns[0].fill == one.columns[0].median.value()
    x = apply_columns(m, read_table(whole, {"signup", "amount"}))
    np.testing.assert_allclose(x[np.lexsort(x.T[::-1])], _stored(m, tmp_path / "out"), atol=1e-5)
    # one part with a cell that is not a date: text in every part, as in one file
    Path(paths[1]).write_text("signup,amount,city,label\nlater,1.0,a,0\n")
    merged, _ = fit_parts(paths, options=opts)
    assert merged.transforms("classification")[0].kind == "hash"


def test_a_pipeline_version_uses_its_first_versions_date_transform(tmp_path) -> None:
    from smlt.runtime.pipeline import prepare_version

    v1 = tmp_path / "v1.csv"
    _table(v1, 200)
    first, _ = prepare_version(str(v1), str(tmp_path / "incoming/p/v1"), shards=2)
    v2 = tmp_path / "v2.csv"
    _table(v2, 150, seed=3, times=True)  # times now: still the first version's three features
    second, _ = prepare_version(str(v2), str(tmp_path / "incoming/p/v2"), shards=2)
    assert second.columns == first.columns and second.x == first.x
    x = apply_columns(second, read_table(v2, {"signup", "amount"}))
    np.testing.assert_allclose(x[np.lexsort(x.T[::-1])], _stored(second, tmp_path / "incoming/p/v2"), atol=1e-5)
    text = v2.read_text().splitlines()
    text[7] = "17.03.2024" + text[7][text[7].index(",") :]
    v2.write_text("\n".join(text) + "\n")
    with pytest.raises(InvalidDataset, match=r"v2.csv: column 'signup', line 8: '17.03.2024' is not a date \(ISO"):
        prepare_version(str(v2), str(tmp_path / "incoming/p/v3"), shards=2)


def test_the_served_input_of_a_table_with_a_date_column_is_encoded_features(tmp_path) -> None:
    from smlt.serving import input_kind

    src = tmp_path / "s.csv"
    _table(src, 120)
    m = prepare_dataset(str(src), str(tmp_path / "p"))
    assert input_kind(m) == "encoded_features"


def test_a_dataframe_with_datetimes_predicts_as_its_csv(tmp_path) -> None:
    pd = pytest.importorskip("pandas")
    from smlt.inference import read_table_rows

    src = tmp_path / "s.csv"
    _table(src, 120)
    m = prepare_dataset(str(src), str(tmp_path / "p"))
    frame = pd.DataFrame({"signup": pd.to_datetime(["2025-01-06", None]), "amount": [0.5, 0.1], "city": ["a", "b"]})
    x = apply_columns(m, read_table_rows(m, frame))
    csv = tmp_path / "n.csv"
    csv.write_text("signup,amount,city\n2025-01-06,0.5,a\n,0.1,b\n")
    np.testing.assert_allclose(x, apply_columns(m, read_table_rows(m, csv)), rtol=1e-6)
