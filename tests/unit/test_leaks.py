"""A feature column that gives the label away (a copy of it, or a value known only after it) is told
by `smlt data prepare`, whole or in parts; an ordinary column, an id or a merely strong feature is not."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from smlt.runtime.data import fit_state
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import fit_parts, prepare_dataset

AWAY = "gives the label away"


def _write(path: Path, header: list[str], columns: list[np.ndarray]) -> Path:
    rows = [",".join(str(c[i]) for c in columns) for i in range(len(columns[0]))]
    path.write_text(",".join(header) + "\n" + "\n".join(rows) + "\n")
    return path


def _churn(rng: np.random.Generator, n: int) -> tuple[list[str], list[np.ndarray]]:
    a, b = rng.normal(size=n).round(4), rng.normal(size=n).round(4)
    y = (a + 0.5 * b + rng.normal(size=n) > 0).astype(int)
    status = np.where(y == 1, "churned", "active")  # known only once the label is
    plan = rng.choice(["basic", "plus", "pro"], n)  # an ordinary category
    ids = np.array([f"c{i:05d}" for i in range(n)])  # one row per value: an id, not a leak
    return ["id", "a", "b", "plan", "status", "label"], [ids, a, b, plan, status, y]


def _prepare(src: Path, out: Path, caplog, **options) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        prepare_dataset(str(src), str(out), options=SourceOptions(**options))
    return caplog.text


def test_a_column_each_of_whose_values_goes_with_one_class_is_told(tmp_path, caplog):
    header, cols = _churn(np.random.default_rng(0), 1000)
    told = _prepare(_write(tmp_path / "churn.csv", header, cols), tmp_path / "p", caplog)
    assert (
        f"churn.csv: column 'status' {AWAY}: each of its 2 values goes with one class of 'label' in all 800 train rows. "
        "If it is a copy of the label or known only after it" in told
    )
    assert told.count(AWAY) == 1  # not the id, the features or the plan


def test_without_the_leak_nothing_is_told(tmp_path, caplog):
    header, cols = _churn(np.random.default_rng(1), 1000)
    src = _write(tmp_path / "fine.csv", header[:4] + header[5:], cols[:4] + cols[5:])
    assert AWAY not in _prepare(src, tmp_path / "p", caplog)


def test_a_regression_target_copied_in_other_units_is_told_and_a_strong_feature_is_not(tmp_path, caplog):
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=900), rng.normal(size=900)
    price = (30 * a + 10 * b + rng.normal(size=900)).round(3)
    cols = [a.round(4), (price / 1000).round(6), (price + 20 * rng.normal(size=900)).round(3), price]
    src = _write(tmp_path / "houses.csv", ["a", "price_k", "appraisal", "price"], cols)
    told = _prepare(src, tmp_path / "p", caplog, task="regression")
    assert f"houses.csv: column 'price_k' {AWAY}: its correlation with 'price' is +1.0000 over 720 train rows" in told
    assert told.count(AWAY) == 1  # 'appraisal' follows the price closely (r ~0.85), not exactly


@pytest.mark.parametrize("sizes", [[400, 9000, 600]])
def test_a_table_in_parts_is_told_as_the_whole_table(tmp_path, caplog, sizes):
    rng = np.random.default_rng(3)
    header, cols = _churn(rng, sum(sizes))
    whole = _write(tmp_path / "whole.csv", header, cols)
    paths, start = [], 0
    for i, n in enumerate(sizes):
        paths.append(str(_write(tmp_path / f"part-{i}.csv", header, [c[start : start + n] for c in cols])))
        start += n
    fit, _ = fit_parts(paths, options=SourceOptions())
    fit = fit_state.loads(fit_state.dumps(fit))  # as the step after the Maps reads it
    assert fit.leaks is not None
    merged = fit.leaks.notices("t.csv", "classification")
    assert len(merged) == 1 and f"column 'status' {AWAY}" in merged[0]
    assert fit.leaks.classes["status"] == {"active": "0", "churned": "1"}
    assert fit.leaks.classes["plan"] is None and fit.leaks.classes["id"] is None
    assert f"column 'status' {AWAY}" in _prepare(whole, tmp_path / "p", caplog)


def test_a_column_rising_with_every_row_is_named_a_row_number_whole_or_in_parts(tmp_path, caplog):
    rng = np.random.default_rng(5)
    n = 900
    a = rng.normal(size=n).round(4)
    label = (a > 0).astype(int)
    order = np.argsort(label, kind="stable")  # a file sorted by its label: the id gives it away
    ids = np.arange(1, n + 1)
    year = np.sort(rng.integers(1990, 2020, n))  # rises, but not with every row: a feature
    header, cols = ["PassengerId", "year", "a", "label"], [ids, year, a[order], label[order]]
    told = _prepare(_write(tmp_path / "t.csv", header, cols), tmp_path / "p", caplog)
    assert "t.csv: column 'PassengerId' rises with every row (1 to 900): a row number, an id or a time" in told
    assert told.count("rises with every row") == 1
    paths = [
        str(_write(tmp_path / f"part-{i}.csv", header, [c[i * 300 : (i + 1) * 300] for c in cols])) for i in range(3)
    ]
    fit, _ = fit_parts(paths, options=SourceOptions())
    fit = fit_state.loads(fit_state.dumps(fit))
    (pid,) = [c for c in fit.columns if c.name == "PassengerId"]
    assert pid.rising == [1.0, 900.0] and pid.row_number("t", fit.rows) is not None
    shuffled = [
        str(_write(tmp_path / f"s-{i}.csv", header, [c[i * 300 : (i + 1) * 300] for c in cols])) for i in (2, 0, 1)
    ]
    fit, _ = fit_parts(shuffled, options=SourceOptions())  # parts out of order: not one rising column
    assert [c.rising for c in fit.columns if c.name == "PassengerId"] == [None]


def test_a_folder_of_parts_is_named_by_the_folder_the_user_gave(tmp_path, caplog):
    """The leak found over the whole table names the folder `smlt data prepare` was given (and
    `fit_parts` without one: the first part and their count), never the first part alone."""
    header, cols = _churn(np.random.default_rng(6), 900)
    folder = tmp_path / "exports"
    folder.mkdir()
    for i in range(3):
        _write(folder / f"part-{i:05d}.csv", header, [c[i * 300 : (i + 1) * 300] for c in cols])
    told = _prepare(folder, tmp_path / "p", caplog)
    leak = [line for line in told.splitlines() if AWAY in line]
    assert len(leak) == 1 and f"{folder}: column 'status' {AWAY}: each of its 2 values" in leak[0], told
    assert "part-00000.csv" not in leak[0]
    paths = sorted(str(p) for p in folder.glob("part-*.csv"))
    fit, _ = fit_parts(paths, options=SourceOptions())
    assert fit.path == f"{paths[0]} and 2 more parts"
    fit, _ = fit_parts(paths, options=SourceOptions(), source=str(folder))
    assert fit.path == str(folder) and fit.labels.path == str(folder)
