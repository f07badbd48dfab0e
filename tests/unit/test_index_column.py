"""A data frame's index or row names written as the first column (pandas' `to_csv`, R's
`write.csv`: an unnamed header cell) is left out of the features, with a word: whole file,
in parts and at predict, which reads the model's columns by name."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import fit_parts, prepare_dataset


def _frame(n: int = 600) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2)).round(4)
    return x, (x[:, 0] > 0).astype(int)


def _write(path: Path, header: str, lines: list[str]) -> Path:
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def _prepare(src: Path, out: Path, caplog, **options):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(src), str(out), options=SourceOptions(**options))
    return m, caplog.text


def test_pandas_and_r_row_names_are_left_out_with_a_word(tmp_path, caplog):
    x, y = _frame()
    plain = _write(tmp_path / "plain.csv", "a,b,label", [f"{a},{b},{c}" for (a, b), c in zip(x, y)])
    pandas = _write(
        tmp_path / "pandas.csv", ",a,b,label", [f"{i},{a},{b},{c}" for i, ((a, b), c) in enumerate(zip(x, y))]
    )
    r = _write(
        tmp_path / "r.csv", '"","a","b","label"', [f'"{i + 1}",{a},{b},{c}' for i, ((a, b), c) in enumerate(zip(x, y))]
    )
    again = _write(
        tmp_path / "again.csv", "Unnamed: 0,a,b,label", [f"{i},{a},{b},{c}" for i, ((a, b), c) in enumerate(zip(x, y))]
    )
    base, told = _prepare(plain, tmp_path / "p0", caplog)
    assert "first column" not in told
    shards = [s.sha256 for s in base.train.shards + base.validation.shards]
    for src, said in ((pandas, "has no name"), (r, "has no name"), (again, "is named 'Unnamed: 0'")):
        m, told = _prepare(src, tmp_path / src.stem, caplog)
        assert [c.name for c in m.columns or []] == ["a", "b"]
        assert [s.sha256 for s in m.train.shards + m.validation.shards] == shards
        assert f"{src.name}: the first column {said}: an index or row names" in told
        assert "rises with every row" not in told


def test_in_parts_and_when_named_or_dropped(tmp_path, caplog):
    x, y = _frame()
    lines = [f"{i},{a},{b},{c}" for i, ((a, b), c) in enumerate(zip(x, y))]
    paths = [str(_write(tmp_path / f"part-{k}.csv", ",a,b,label", lines[k * 300 : (k + 1) * 300])) for k in range(2)]
    fit, _ = fit_parts(paths, options=SourceOptions())
    assert [c.name for c in fit.columns] == ["a", "b"]
    # a first column with a name is a feature as before
    named = _write(tmp_path / "named.csv", "row,a,b,label", lines)
    m, _ = _prepare(named, tmp_path / "n", caplog)
    assert [c.name for c in m.columns or []] == ["row", "a", "b"]
    # dropping it by name says nothing more
    m, told = _prepare(_write(tmp_path / "d.csv", ",a,b,label", lines), tmp_path / "d", caplog, drop=[""])
    assert [c.name for c in m.columns or []] == ["a", "b"] and "first column" not in told


def test_columns_without_a_name_after_the_first_are_left_out_with_a_word(tmp_path, caplog):
    """A delimiter at the end of each line (spreadsheets write one) made a feature named '' of
    empty cells (two of them: refused as "column '' appears twice"), which predict then required."""
    x, y = _frame()
    plain = _write(tmp_path / "plain.csv", "a,b,label", [f"{a},{b},{c}" for (a, b), c in zip(x, y)])
    one = _write(tmp_path / "one.csv", "a,b,label,", [f"{a},{b},{c}," for (a, b), c in zip(x, y)])
    two = _write(tmp_path / "two.csv", "a,b,label,,", [f"{a},{b},{c},," for (a, b), c in zip(x, y)])
    inner = _write(
        tmp_path / "inner.csv", "a,,b,label", [f"{a},{i % 3},{b},{c}" for i, ((a, b), c) in enumerate(zip(x, y))]
    )
    base, _ = _prepare(plain, tmp_path / "p0", caplog)
    shards = [s.sha256 for s in base.train.shards + base.validation.shards]
    for src, said in (
        (
            one,
            "column 4 (counting from 1) has no name in the header (a delimiter at the end of each line, as "
            "spreadsheets write one): left out (name it in the header to use it)",
        ),
        (two, "columns 4, 5 (counting from 1) have no name in the header (a delimiter at the end of each line"),
        (inner, "column 2 (counting from 1) has no name in the header: left out (name it in the header to use it)"),
    ):
        m, told = _prepare(src, tmp_path / src.stem, caplog)
        assert [c.name for c in m.columns or []] == ["a", "b"], src
        assert [s.sha256 for s in m.train.shards + m.validation.shards] == shards, src
        assert f"{src.name}: {said}" in told, told
    fit, _ = fit_parts([str(two)], options=SourceOptions())
    assert [c.name for c in fit.columns] == ["a", "b"]
