"""A class with almost no rows (a typo in the label column: a `2` among 0s and 1s) is said when
the dataset is prepared, whole or in parts; the data and the classes stay as they are."""

from __future__ import annotations

import logging

import numpy as np

from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset, prepare_parts


def _csv(path, labels):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(len(labels), 2)).round(3)
    path.write_text("label,a,b\n" + "".join(f"{c},{a},{b}\n" for c, (a, b) in zip(labels, x)))
    return str(path)


def _told(caplog, fn):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        result = fn()
    return result, caplog.text


def test_a_class_with_almost_no_rows_is_said_and_kept(tmp_path, caplog):
    labels = [i % 2 for i in range(1000)]
    labels[500], labels[700] = 2, 11
    src = _csv(tmp_path / "typo.csv", labels)
    m, told = _told(caplog, lambda: prepare_dataset(src, str(tmp_path / "p"), options=SourceOptions(label="label")))
    assert m.classes == ["0", "1", "2", "11"]  # kept: the user decides
    assert (
        f"{src}: 2 classes have almost no rows ('2' 1 row, '11' 1 row, of 1,000): too few to learn or to measure; "
        "a typo in the label column? They stay classes of the model: fix or drop those rows to leave them out"
    ) in told, told


def test_small_or_balanced_datasets_say_nothing(tmp_path, caplog):
    for name, labels in (("small", [i % 3 for i in range(30)]), ("few", [0] * 60 + [1] * 4)):
        src = _csv(tmp_path / f"{name}.csv", labels)
        _, told = _told(caplog, lambda: prepare_dataset(src, str(tmp_path / name)))
        assert "almost no rows" not in told, (name, told)  # 4 rows of 64: rare, not 20x below the largest


def test_in_parts_too(tmp_path, caplog):
    labels = [i % 2 for i in range(600)]
    labels[123] = 7
    parts = [_csv(tmp_path / f"part-{k}.csv", labels[k * 300 : (k + 1) * 300]) for k in range(2)]
    m, told = _told(caplog, lambda: prepare_parts(parts, str(tmp_path / "p")))
    assert m.classes == ["0", "1", "7"]
    assert "a class has almost no rows ('7' 1 row, of 600)" in told, told


def test_a_validation_split_too_small_to_measure_on_is_said(tmp_path, caplog):
    src = _csv(tmp_path / "small.csv", [i % 2 for i in range(60)])  # 12 validation rows
    m, told = _told(caplog, lambda: prepare_dataset(src, str(tmp_path / "p"), shards=2))
    assert m.validation.rows == 12 and m.train.rows == 48
    assert (
        f"{src}: the validation split holds 12 rows: the metric a run stops on and a pipeline's gate compares is "
        "measured on them (its accuracy moves in steps of 8%); more rows, or `smlt data prepare` with a larger "
        "--validation-fraction, measure better"
    ) in told, told
    parts = [_csv(tmp_path / f"part-{i}.csv", [j % 2 for j in range(30)]) for i in range(2)]
    _, told = _told(caplog, lambda: prepare_parts(parts, str(tmp_path / "q")))
    assert "the validation split holds" in told  # in parts too
    big = _csv(tmp_path / "big.csv", [i % 2 for i in range(200)])
    _, told = _told(caplog, lambda: prepare_dataset(big, str(tmp_path / "r")))
    assert "validation split holds" not in told
