"""Date columns written with 12-hour times (`3/15/2024 2:05 PM`) or month names (`15-Mar-2024`,
`15 March 2024`, `Mar 15, 2024`): the same rule as the numeric spreadsheet dates of
test_data_dates.py (rewritten as the ISO dates they mean, the format recorded in
ColumnTransform.date_format and kept by predict, a pipeline's later versions and the parts path)."""

from __future__ import annotations

import datetime
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from smlt.inference import read_inputs
from smlt.runtime.data import fit_state
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import fit_parts, prepare_dataset, prepare_parts
from smlt.runtime.data.table_reader import DATE_FORMS, date_shape, parse_dates
from smlt.runtime.data.tabular import apply_columns, read_table
from smlt.runtime.errors import InvalidDataset
from tests.unit.test_data_dates import _csv as dates_csv
from tests.unit.test_data_dates import _one_pass, _shards, _stored, _when

MONTHS = ("January February March April May June July August September October November December").split()


def _named(month: int, i: int) -> str:
    """A month's name as spreadsheets and people write it: abbreviated or full, `Sept`, any case."""
    name = MONTHS[month - 1]
    name = name if i % 3 == 0 else ("Sept" if month == 9 and i % 2 else name[:3])
    return name.upper() if i % 5 == 0 else name.lower() if i % 7 == 0 else name


def _written(d: datetime.datetime | None, form: str, i: int = 0) -> str:
    """A date as `form` writes it: `iso`, or a DATE_FORMS entry."""
    if d is None:
        return ""
    timed = (d.hour, d.minute) != (0, 0)
    if form == "iso":
        return d.strftime("%Y-%m-%d") + (d.strftime(" %H:%M") if timed else "")
    style, twelve = form.removesuffix(" h:mm AM/PM"), form.endswith(" h:mm AM/PM")
    if twelve:
        half = "AM" if d.hour < 12 else "PM"
        clock = f" {d.hour % 12 or 12}:{d.minute:02d}{' ' if i % 4 else ''}{half.lower() if i % 6 == 1 else half}"
    else:
        clock = f" {d.hour}:{d.minute:02d}"
    clock = clock if timed else ""
    if style == "d-mon-yyyy":
        return f"{d.day}-{_named(d.month, i)}-{d.year}{clock}"
    if style == "d mon yyyy":
        return f"{d.day} {_named(d.month, i)} {d.year}{clock}"
    if style == "mon d, yyyy":
        return f'"{_named(d.month, i)} {d.day}, {d.year}{clock}"'
    if style.startswith("yyyy"):  # the year first, the month and day padded or not
        sep = style[4]
        month, day = (f"{d.month:02d}", f"{d.day:02d}") if i % 2 else (str(d.month), str(d.day))
        return f"{d.year}{sep}{month}{sep}{day}{clock}"
    sep = style[1]
    first, second = (d.month, d.day) if style[0] == "m" else (d.day, d.month)
    return f"{first}{sep}{second}{sep}{d.year}{clock}"


def _csv(path: Path, when: list[datetime.datetime | None], form: str) -> Path:
    """test_data_dates' rows, each date written by `_written` (the forms of this file too)."""
    return dates_csv(path, when, form, _written)


def test_twelve_hour_times_and_month_names_are_the_iso_dates_they_mean() -> None:
    cases = {
        "m/d/yyyy h:mm AM/PM": (
            ["3/7/2024 12:05 AM", "3/7/2024 12:05 PM", "3/7/2024 1:05:30.5 pm", None, "03/07/2024", "3/7/2024 11:59PM"],
            ["2024-03-07 00:05", "2024-03-07 12:05", "2024-03-07 13:05:30.5", None, "2024-03-07", "2024-03-07 23:59"],
        ),
        "d.m.yyyy h:mm AM/PM": (["7.3.2024 9:05 am"], ["2024-03-07 09:05"]),
        "d-mon-yyyy": (
            ["15-Mar-2024", "1-sept-2024", "2-DEC-2024 14:05"],
            ["2024-03-15", "2024-09-01", "2024-12-02 14:05"],
        ),
        "d mon yyyy": (["15 March 2024", "01 Sep 2024", "9 may 2024"], ["2024-03-15", "2024-09-01", "2024-05-09"]),
        "mon d, yyyy": (
            ["Mar 15, 2024", "September 1, 2024", "JUNE 30, 2024"],
            ["2024-03-15", "2024-09-01", "2024-06-30"],
        ),
        "mon d, yyyy h:mm AM/PM": (
            ["Mar 15, 2024 12:00 PM", "Jul 4, 2024 8:30 pm"],
            ["2024-03-15 12:00", "2024-07-04 20:30"],
        ),
        # the year first, as Excel in Japan, China and Taiwan writes dates
        "yyyy/m/d": (
            ["2024/3/7", "2024/03/17 14:05", "2024/12/1 9:05:30"],
            ["2024-03-07", "2024-03-17 14:05", "2024-12-01 09:05:30"],
        ),
        "yyyy.m.d h:mm AM/PM": (["2024.3.7 2:05 PM", "2024.12.01"], ["2024-03-07 14:05", "2024-12-01"]),
    }
    for form, (cells, iso) in cases.items():
        assert form in DATE_FORMS
        got, want = parse_dates(pa.array(cells, pa.string()), form), parse_dates(pa.array(iso, pa.string()))
        assert got is not None and want is not None, form
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    shapes = {
        ("3/17/2024 2:05 PM", "12/1/2024"): ("/", "12"),
        ("17-Mar-2024", "1-Feb-2024 9:05"): ("d-mon-yyyy", "24"),
        ("Mar 17, 2024", "sept 1, 2024"): ("mon d, yyyy", ""),
        ("17 March 2024 2:05 am",): ("d mon yyyy", "12"),
        ("2024/3/17", "2024/12/1 9:05"): ("yyyy/m/d", "24"),
    }
    for cells, (sep, clock) in shapes.items():
        shape = date_shape(pa.array(list(cells)))
        assert shape is not None and (shape.sep, shape.clock) == (sep, clock), cells
    not_dates = [
        ["3/17/2024 13:05 PM"],  # an hour above 12 with AM/PM
        ["3/17/2024 0:05 AM"],  # a 12-hour clock has no hour 0
        ["3/17/2024 2:05 PM", "3/17/2024 14:05"],  # 12-hour and 24-hour times
        ["15-Mar-24"],  # a two-digit year
        ["15 Marc 2024"],
        ["Mar 15 2024"],  # no comma
        ["Mar 15, 2024", "15 Mar 2024"],  # two styles
        ["15-Mar-2024", "15-3-2024"],
        ["Mar 15, 2024", "2024-03-15"],
        ["2024/3/17", "3/17/2024"],  # the year first and last
        ["2024/3/17", "2024.3.17"],
        ["24/3/17"],  # a two-digit year
    ]
    for cells in not_dates:
        assert date_shape(pa.array(cells)) is None, cells
    assert parse_dates(pa.array(["Feb 30, 2024"]), "mon d, yyyy") is None
    assert (
        parse_dates(pa.array(["2024/2/30"]), "yyyy/m/d") is None
        and parse_dates(pa.array(["2024/13/1"]), "yyyy/m/d") is None
    )
    assert parse_dates(pa.array(["3/17/2024 14:05"]), "m/d/yyyy h:mm AM/PM") is None
    assert parse_dates(pa.array(["3/17/2024 2:05 PM"]), "m/d/yyyy") is None


NEW_FORMS = (
    "m/d/yyyy h:mm AM/PM",
    "d/m/yyyy h:mm AM/PM",
    "d.m.yyyy h:mm AM/PM",
    "d-mon-yyyy",
    "d mon yyyy",
    "mon d, yyyy",
    "mon d, yyyy h:mm AM/PM",
    "yyyy/m/d",
    "yyyy.m.d h:mm AM/PM",
)


@pytest.mark.parametrize("block_bytes", [None, 1500])
def test_new_forms_prepare_to_the_iso_columns_shards(tmp_path, monkeypatch, caplog, block_bytes) -> None:
    from smlt.runtime.data import table_reader

    if block_bytes:  # many blocks: the first ones without times, the day-month order open
        monkeypatch.setattr(table_reader, "BLOCK_BYTES", block_bytes)
    when = sorted(_when(600, 1), key=lambda d: (d is None, d and (d.day > 12, (d.hour, d.minute) != (0, 0), d)))
    hours = {d.hour for d in when if d is not None}
    assert {0, 12} <= hours and max(hours) > 12  # 12 AM, 12 PM and afternoons
    iso = prepare_dataset(str(_csv(tmp_path / "iso.csv", when, "iso")), str(tmp_path / "iso"))
    assert iso.columns is not None and iso.columns[0].kind == "date"
    for form in NEW_FORMS:
        out = tmp_path / form.replace("/", "_").replace(" ", "_")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="smlt.notice"):
            m = prepare_dataset(str(_csv(tmp_path / "f.csv", when, form)), str(out))
        assert m.columns is not None
        assert m.columns[0].date_format == form
        assert [t.model_copy(update={"date_format": None}) for t in m.columns] == iso.columns
        assert m.normalization == iso.normalization
        assert _shards(out) == _shards(tmp_path / "iso"), form
        assert f"hour 0-23, written {form}" in caplog.text
    named = tmp_path / "d_mon_yyyy/manifest.json"
    assert '"date_format": "d mon yyyy"' in named.read_text()


def test_mixed_clocks_and_styles_are_text(tmp_path, monkeypatch) -> None:
    from smlt.runtime.data import table_reader

    monkeypatch.setattr(table_reader, "BLOCK_BYTES", 1500)  # the mix in another block than the first
    when = _when(300, 3)
    when[250] = datetime.datetime(2024, 3, 1, 14, 5)
    cases = {
        "24-hour in a later block": [
            _written(d, "m/d/yyyy" if i == 250 else "m/d/yyyy h:mm AM/PM", i) for i, d in enumerate(when)
        ],
        "hour 13 PM": [_written(d, "m/d/yyyy h:mm AM/PM", i) for i, d in enumerate(when)][:250] + ["3/1/2024 13:05 PM"],
        "names and numbers": [_written(d, "d-m-yyyy" if i == 250 else "d-mon-yyyy", i) for i, d in enumerate(when)],
        "two named styles": [_written(d, "d mon yyyy" if i == 250 else "mon d, yyyy", i) for i, d in enumerate(when)],
    }
    for name, cells in cases.items():
        src = tmp_path / "x.csv"
        src.write_text("when,label\n" + "".join(f"{c},{i % 2}\n" for i, c in enumerate(cells)))
        m = prepare_dataset(str(src), str(tmp_path / "p"), replace=True)
        assert (m.columns or [])[0].kind == "hash", name


def test_predict_and_later_versions_keep_the_recorded_form(tmp_path) -> None:
    from smlt.cli.model import column_lines
    from smlt.runtime.pipeline import prepare_version

    when, new = _when(400, 4), _when(50, 5)
    form = "mon d, yyyy h:mm AM/PM"
    iso = prepare_dataset(str(_csv(tmp_path / "iso.csv", when, "iso")), str(tmp_path / "iso"))
    us = prepare_dataset(str(_csv(tmp_path / "us.csv", when, form)), str(tmp_path / "us"))
    assert (us.columns or [])[0].date_format == form
    got = read_inputs(us, _csv(tmp_path / "new_us.csv", new, form)).x
    np.testing.assert_array_equal(got, read_inputs(iso, _csv(tmp_path / "new_iso.csv", new, "iso")).x)
    lines = (tmp_path / "new_us.csv").read_text().splitlines()
    lines[3] = '"Jan 6, 2025 14:05"' + lines[3][lines[3].index('",') + 1 :]  # a 24-hour time
    (tmp_path / "new_us.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        InvalidDataset,
        match=r"new_us.csv: column 'when', line 4: 'Jan 6, 2025 14:05' is not a date \(written mon d, yyyy h:mm AM/PM"
        r" as the column's other dates: Mar 17, 2024, Mar 17, 2024 2:05 PM or Mar 17, 2024 2:05:30 PM\)",
    ):
        read_inputs(us, tmp_path / "new_us.csv")
    assert column_lines(us.columns)[0].startswith("  'when': date written mon d, yyyy h:mm AM/PM: days, month,")

    first, _ = prepare_version(
        str(_csv(tmp_path / "v1.csv", _when(200, 6), "d-mon-yyyy")), str(tmp_path / "incoming/p/v1"), shards=2
    )
    assert (first.columns or [])[0].date_format == "d-mon-yyyy"
    second, _ = prepare_version(
        str(_csv(tmp_path / "v2.csv", _when(150, 7), "d-mon-yyyy")), str(tmp_path / "incoming/p/v2"), shards=2
    )
    assert second.columns == first.columns
    x = apply_columns(second, read_table(tmp_path / "v2.csv", {"when", "a"}))
    np.testing.assert_allclose(x[np.lexsort(x.T[::-1])], _stored(second, tmp_path / "incoming/p/v2"), atol=1e-5)
    lines = (tmp_path / "v2.csv").read_text().splitlines()
    lines[7] = "1/3/2024" + lines[7][lines[7].index(",") :]
    (tmp_path / "v2.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        InvalidDataset,
        match=r"v2.csv: column 'when', line 8: '1/3/2024' is not a date \(written d-mon-yyyy as the column's other "
        r"dates: 17-Mar-2024,",
    ):
        prepare_version(str(tmp_path / "v2.csv"), str(tmp_path / "incoming/p/v3"), shards=2)


def test_parts_agree_on_the_clock_and_the_order(tmp_path) -> None:
    # the first parts without times (and days at most 12), the last one with AM/PM times deciding both
    when = sorted(_when(900, 8), key=lambda d: (d is None, d and (d.day > 12 or (d.hour, d.minute) != (0, 0), d)))
    sizes = [150, 1, 749]
    assert all(d is None or (d.day <= 12 and (d.hour, d.minute) == (0, 0)) for d in when[:151])
    form = "d/m/yyyy h:mm AM/PM"
    paths, start = [], 0
    for i, n in enumerate(sizes):
        paths.append(str(_csv(tmp_path / f"part-{i}.csv", when[start : start + n], form)))
        start += n
    opts = SourceOptions()
    merged, _ = fit_parts(paths, options=opts)
    merged = fit_state.loads(fit_state.dumps(merged))
    one = _one_pass(_csv(tmp_path / "whole.csv", when, form), sizes, opts)
    assert merged.transforms("classification") == one.transforms("classification")
    assert merged.transforms("classification")[0].date_format == form
    assert merged.columns[0].median.value() == one.columns[0].median.value()
    m = prepare_parts(paths, str(tmp_path / "out"), options=opts)
    iso_paths = [
        str(_csv(tmp_path / f"iso-{i}.csv", when[sum(sizes[:i]) : sum(sizes[: i + 1])], "iso")) for i in range(3)
    ]
    iso = prepare_parts(iso_paths, str(tmp_path / "iso"), options=opts)
    assert m.columns is not None and m.columns[0].date_format == form
    assert [t.model_copy(update={"date_format": None}) for t in m.columns] == iso.columns
    assert _shards(tmp_path / "out") == _shards(tmp_path / "iso")
    # one part with 24-hour times, another with AM/PM: text in every part
    Path(paths[1]).write_text("when,a,label\n1/3/2024 14:05,1.0,0\n")
    merged, _ = fit_parts(paths, options=SourceOptions())
    assert merged.transforms("classification")[0].kind != "date"
    # month names in every part, some with times: one date column
    for i, p in enumerate(paths):
        _csv(Path(p), when[sum(sizes[:i]) : sum(sizes[: i + 1])], "d mon yyyy")
    merged, _ = fit_parts(paths, options=SourceOptions())
    assert merged.transforms("classification")[0].date_format == "d mon yyyy"
