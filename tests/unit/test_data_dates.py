"""Date columns: a text column every present cell of which is an ISO-8601 date or date-time, or a
date as spreadsheets write one (`3/17/2024`, `17.03.2024 10:05`: the day-month order decided over
the whole column), or a Parquet date or timestamp column, becomes features (days since 1970-01-01, month, day of the
week, the hour when it has times), imputed with the train split's median date or refused, by the
one rule prepare, the parts path, a pipeline's later versions and predict share."""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import load_file

from smlt.inference import read_inputs
from smlt.runtime.data import fit_state
from smlt.runtime.data.manifest import Manifest
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import TableTransforms, fit_parts, prepare_dataset, prepare_parts
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
    us = tmp_path / "us.csv"  # a two-digit year is no date
    us.write_text("signup,label\n" + "".join(f"03/{i % 28 + 1:02d}/24,{i % 2}\n" for i in range(100)))
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


# --- dates as spreadsheets write them -----------------------------------------------------------


def _when(n: int, seed: int, days: int = 1500, times: bool = True, low: bool = False) -> list[datetime.datetime | None]:
    """Dates (with times of day when `times`; days of the month at most 12 when `low`), every 13th missing."""
    rng = np.random.default_rng(seed)
    out: list[datetime.datetime | None] = []
    for i in range(n):
        d = datetime.datetime(2020, 1, 1) + datetime.timedelta(days=int(rng.integers(0, days)))
        if low:
            d = d.replace(day=d.day % 12 + 1)
        if times and i % 3 == 0:
            d += datetime.timedelta(hours=int(rng.integers(0, 24)), minutes=int(rng.integers(0, 60)))
        out.append(None if i % 13 == 5 else d)
    return out


def _written(d: datetime.datetime | None, form: str) -> str:
    """A date as `form` writes it (`iso`, or a DATE_FORMS entry: one-digit days and months as Excel writes them)."""
    if d is None:
        return ""
    clock = f" {d.hour}:{d.minute:02d}" if (d.hour, d.minute) != (0, 0) else ""
    if form == "iso":
        return d.strftime("%Y-%m-%d") + (d.strftime(" %H:%M") if clock else "")
    sep = form[1]
    first, second = (d.month, d.day) if form[0] == "m" else (d.day, d.month)
    return f"{first}{sep}{second}{sep}{d.year}{clock}"


def _csv(path: Path, when: list[datetime.datetime | None], form: str, written: Any = None) -> Path:
    """`when,a,label` rows: a label that depends on the month (summer or not); `written(d, form, i)`
    writes the i-th date (default `_written`)."""
    lines = ["when,a,label"]
    for i, d in enumerate(when):
        cell = written(d, form, i) if written is not None else _written(d, form)
        lines.append(f"{cell},{(i * 7919) % 101 / 100:.2f},{int(d is not None and d.month in (6, 7, 8))}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _shards(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(out.iterdir()) if f.name != "manifest.json"}


FORMS = ("m/d/yyyy", "d/m/yyyy", "d.m.yyyy", "d-m-yyyy", "m.d.yyyy")


@pytest.mark.parametrize("block_bytes", [None, 1500])
def test_spreadsheet_dates_prepare_to_the_iso_columns_shards(tmp_path, monkeypatch, caplog, block_bytes) -> None:
    from smlt.runtime.data import table_reader

    if block_bytes:  # many blocks: the first ones leave the order open (days and months up to 12)
        monkeypatch.setattr(table_reader, "BLOCK_BYTES", block_bytes)
    when = sorted(_when(600, 1), key=lambda d: (d is None, d and (d.day > 12, d)))
    assert when[0] is not None and when[150] is not None and when[150].day <= 12  # the deciding days come late
    iso = prepare_dataset(str(_csv(tmp_path / "iso.csv", when, "iso")), str(tmp_path / "iso"))
    assert iso.columns is not None and iso.columns[0].kind == "date" and iso.columns[0].date_format is None
    for form in FORMS:
        with caplog.at_level(logging.INFO, logger="smlt.notice"):
            m = prepare_dataset(str(_csv(tmp_path / "f.csv", when, form)), str(tmp_path / form.replace("/", "_")))
        assert m.columns is not None
        assert m.columns[0].date_format == form
        assert [t.model_copy(update={"date_format": None}) for t in m.columns] == iso.columns
        assert m.normalization == iso.normalization
        assert _shards(tmp_path / form.replace("/", "_")) == _shards(tmp_path / "iso"), form
        assert f"day of the week (Monday 0), hour 0-23, written {form}: a " in caplog.text
    # a manifest of ISO dates says nothing of a date format (as before smlt read others)
    assert "date_format" not in (tmp_path / "iso/manifest.json").read_text()
    assert '"date_format": "m/d/yyyy"' in (tmp_path / "m_d_yyyy/manifest.json").read_text()


def test_the_day_month_order_of_spreadsheet_dates(tmp_path, caplog) -> None:
    from smlt.runtime.data.table_reader import date_shape

    assert date_shape(pa.array(["3/17/2024", None, "12/1/2024 9:05"])) == date_shape(pa.array(["12/17/2024 0:00"]))
    for cells in (["3/17/24"], ["3/17/2024", "2024-03-17"], ["3/17/2024", "3.17.2024"], ["3/17/2024 14:05 PM"]):
        assert date_shape(pa.array(cells)) is None, cells
    assert parse_dates(pa.array(["2/30/2024"]), "m/d/yyyy") is None
    assert parse_dates(pa.array(["3/17/2024 24:05"]), "m/d/yyyy") is None
    parsed = parse_dates(pa.array(["3/7/2024", None, "03/07/2024 10:05:30.5"]), "m/d/yyyy")
    iso = parse_dates(pa.array(["2024-03-07", None, "2024-03-07 10:05:30.5"]))
    assert parsed is not None and iso is not None
    np.testing.assert_array_equal(parsed[0], iso[0])
    np.testing.assert_array_equal(parsed[1], iso[1])
    # no day above 12: `/` month first (Excel's US default), `.` and `-` day first, and the notice says so
    when = _when(300, 2, times=False, low=True)  # every field at most 12
    for form, written in (("m/d/yyyy", "m/d/yyyy"), ("d.m.yyyy", "d.m.yyyy"), ("d-m-yyyy", "d-m-yyyy")):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="smlt.notice"):
            m = prepare_dataset(str(_csv(tmp_path / "a.csv", when, form)), str(tmp_path / "a"), replace=True)
        assert (m.columns or [])[0].date_format == written
        other = "day_first" if form[0] == "m" else "month_first"
        assert (
            f"written {written} as " in caplog.text
            and "no day or month above 12 tells which comes first" in caplog.text
        )
        assert f'--date-order {other} (a job\'s dataset: "date_order": "{other}")' in caplog.text
    # --date-order reads them the other way: the same shards as the ISO dates so read
    when_swapped = [None if d is None else d.replace(month=d.day, day=d.month) for d in when]
    told = prepare_dataset(
        str(_csv(tmp_path / "a.csv", when, "m/d/yyyy")),
        str(tmp_path / "told"),
        options=SourceOptions(date_order="day_first"),
    )
    assert (told.columns or [])[0].date_format == "d/m/yyyy"
    lines = (tmp_path / "a.csv").read_text().splitlines()
    swapped = [lines[0]] + [_written(d, "iso") + r[r.index(",") :] for d, r in zip(when_swapped, lines[1:])]
    (tmp_path / "s.csv").write_text("\n".join(swapped) + "\n")
    prepare_dataset(str(tmp_path / "s.csv"), str(tmp_path / "swapped"))
    assert _shards(tmp_path / "told") == _shards(tmp_path / "swapped")


def test_spreadsheet_dates_that_disagree_are_text(tmp_path) -> None:
    when = _when(300, 3, times=False)
    cases = {
        # a first field above 12 in one row, a second above 12 in another: no order reads both
        "both": [_written(d, "d/m/yyyy" if i == 10 else "m/d/yyyy") for i, d in enumerate(when)],
        "mixed": [_written(d, "iso" if i == 10 else "m/d/yyyy") for i, d in enumerate(when)],
        "separators": [_written(d, "m.d.yyyy" if i == 10 else "m/d/yyyy") for i, d in enumerate(when)],
        "no day": [_written(d, "m/d/yyyy") if i != 10 else "2/30/2024" for i, d in enumerate(when)],
    }
    for name, cells in cases.items():
        src = tmp_path / "x.csv"
        src.write_text("when,label\n" + "".join(f"{c},{i % 2}\n" for i, c in enumerate(cells)))
        assert cells[10] != "" and any(c.split("/")[1:2] and int(c.split("/")[1]) > 12 for c in cells if "/" in c)
        m = prepare_dataset(str(src), str(tmp_path / "p"), replace=True)
        assert (m.columns or [])[0].kind == "hash", name
    # an order told that the days refute: text
    src = _csv(tmp_path / "y.csv", when, "m/d/yyyy")
    m = prepare_dataset(str(src), str(tmp_path / "p"), replace=True, options=SourceOptions(date_order="day_first"))
    assert (m.columns or [])[0].kind == "hash"


def test_predict_reads_spreadsheet_dates_as_the_model_recorded_them(tmp_path) -> None:
    from smlt.inference import read_table_rows

    when = _when(400, 4)
    iso = prepare_dataset(str(_csv(tmp_path / "iso.csv", when, "iso")), str(tmp_path / "iso"))
    us = prepare_dataset(str(_csv(tmp_path / "us.csv", when, "m/d/yyyy")), str(tmp_path / "us"))
    new = _when(50, 5)
    got = read_inputs(us, _csv(tmp_path / "new_us.csv", new, "m/d/yyyy")).x
    np.testing.assert_array_equal(got, read_inputs(iso, _csv(tmp_path / "new_iso.csv", new, "iso")).x)
    frame_rows = read_table_rows(us, tmp_path / "new_us.csv")
    np.testing.assert_array_equal(apply_columns(us, frame_rows), got)
    # a cell written otherwise than the model's dates is named, with the format
    lines = (tmp_path / "new_us.csv").read_text().splitlines()
    lines[3] = "2025-01-06" + lines[3][lines[3].index(",") :]
    (tmp_path / "new_us.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        InvalidDataset,
        match=r"new_us.csv: column 'when', line 4: '2025-01-06' is not a date \(written m/d/yyyy as the column's",
    ):
        read_inputs(us, tmp_path / "new_us.csv")
    with pytest.raises(InvalidDataset, match=r"new_iso.csv: column 'when', line 2: '.*' is not a date \(ISO 8601"):
        read_inputs(iso, _csv(tmp_path / "new_iso.csv", [datetime.datetime(2025, 1, 6)], "d.m.yyyy"))
    from smlt.cli.model import column_lines

    assert column_lines(us.columns)[0].startswith("  'when': date written m/d/yyyy: days, month, weekday, hour;")
    assert column_lines(iso.columns)[0].startswith("  'when': date: days, month, weekday, hour;")
    # a manifest written before date formats (no date_format) reads as ISO dates
    raw = (tmp_path / "iso/manifest.json").read_text()
    assert Manifest.model_validate_json(raw).columns == iso.columns


def test_a_pipeline_version_reads_dates_in_its_first_versions_order(tmp_path) -> None:
    from smlt.runtime.pipeline import prepare_version

    first, _ = prepare_version(
        str(_csv(tmp_path / "v1.csv", _when(200, 6), "d.m.yyyy")), str(tmp_path / "incoming/p/v1"), shards=2
    )
    assert (first.columns or [])[0].date_format == "d.m.yyyy"
    # every day at most 12 now: still day first, as the first version's
    early = _when(150, 7, low=True)
    second, _ = prepare_version(
        str(_csv(tmp_path / "v2.csv", early, "d.m.yyyy")), str(tmp_path / "incoming/p/v2"), shards=2
    )
    assert second.columns == first.columns
    x = apply_columns(second, read_table(tmp_path / "v2.csv", {"when", "a"}))
    np.testing.assert_allclose(x[np.lexsort(x.T[::-1])], _stored(second, tmp_path / "incoming/p/v2"), atol=1e-5)
    stored = _stored(second, tmp_path / "incoming/p/v2")
    mean, std = np.asarray(second.normalization.mean), np.asarray(second.normalization.std)
    months = np.round(stored[:, 1] * std[1] + mean[1])
    days = [d for d in early if d is not None]
    assert sorted(set(months[~np.isnan(months)])) == sorted({d.month for d in days})  # read day first
    lines = (tmp_path / "v2.csv").read_text().splitlines()
    lines[7] = "1/3/2024" + lines[7][lines[7].index(",") :]
    (tmp_path / "v2.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        InvalidDataset, match=r"v2.csv: column 'when', line 8: '1/3/2024' is not a date \(written d.m.yyyy"
    ):
        prepare_version(str(tmp_path / "v2.csv"), str(tmp_path / "incoming/p/v3"), shards=2)


def test_parts_decide_the_day_month_order_over_all_parts(tmp_path) -> None:
    when = sorted(_when(900, 8, times=False), key=lambda d: (d is None, d and (d.day > 12, d)))
    sizes = [250, 1, 649]  # the first parts' days at most 12: the last part decides
    assert all(d is None or d.day <= 12 for d in when[:251]) and any(d and d.day > 12 for d in when[251:])
    for form in ("d/m/yyyy", "m/d/yyyy"):
        paths = []
        start = 0
        for i, n in enumerate(sizes):
            paths.append(str(_csv(tmp_path / f"part-{i}.csv", when[start : start + n], form)))
            start += n
        whole = _csv(tmp_path / "whole.csv", when, form)
        opts = SourceOptions()
        merged, _ = fit_parts(paths, options=opts)
        merged = fit_state.loads(fit_state.dumps(merged))
        one = _one_pass(whole, sizes, opts)
        assert merged.transforms("classification") == one.transforms("classification")
        assert merged.transforms("classification")[0].date_format == form
        assert merged.columns[0].median.value() == one.columns[0].median.value()
        m = prepare_parts(paths, str(tmp_path / "out"), options=opts)
        iso = prepare_parts(
            [str(_csv(tmp_path / f"iso-{i}.csv", when[sum(sizes[:i]) : sum(sizes[: i + 1])], "iso")) for i in range(3)],
            str(tmp_path / "iso"),
            options=opts,
        )
        assert m.columns is not None and m.columns[0].date_format == form
        assert [t.model_copy(update={"date_format": None}) for t in m.columns] == iso.columns
        assert _shards(tmp_path / "out") == _shards(tmp_path / "iso")
        for d in (tmp_path / "out", tmp_path / "iso"):
            for f in d.iterdir():
                f.unlink()
    # one part day first, another month first: text in every part
    Path(paths[1]).write_text("when,a,label\n13/1/2024,1.0,0\n")
    Path(paths[2]).write_text("when,a,label\n1/13/2024,1.0,0\n")
    merged, _ = fit_parts(paths, options=SourceOptions())
    assert merged.transforms("classification")[0].kind != "date"
