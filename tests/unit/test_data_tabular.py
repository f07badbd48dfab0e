"""CSV and Parquet with named columns: the label named (in the middle), text columns one-hot or
hashed, empty cells imputed with an indicator or refused with the column and line named, every
transform recorded so that later data (through `apply_columns`) gets the same features."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import load

from smlt.cli import main
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.tabular import HASH_BUCKETS, apply_columns, read_table
from smlt.runtime.errors import InvalidDataset

HEADER = ["id", "colour", "label", "size", "city"]


def rows(n=60, seed=0) -> list[list[str]]:
    """id (number), colour (3 levels, some empty), label (in the middle), size (number, some
    empty), city (40 levels: hashed)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        colour = ["red", "green", "blue"][i % 3] if i % 7 else ""
        size = "" if i % 5 == 0 else f"{rng.normal(10, 3):.3f}"
        out.append([str(i), colour, ["yes", "no"][i % 2], size, f"city{rng.integers(0, 40)}"])
    return out


def write_csv(path, body, header=HEADER):
    path.write_text("\n".join(",".join(r) for r in [header, *body]) + "\n")
    return path


def stored(folder, split) -> np.ndarray:
    return np.concatenate([load((folder / s.key).read_bytes())["x"] for s in split.shards])


def test_csv_with_text_columns_empty_cells_and_the_label_in_the_middle(tmp_path):
    csv = write_csv(tmp_path / "d.csv", rows())
    m = prepare_dataset(str(csv), str(tmp_path / "out"), shards=3, options=SourceOptions(label="label"))
    assert m.label == "label" and m.task == "classification" and m.outputs == 2
    kinds = {c.name: c for c in m.columns or []}
    assert list(kinds) == ["id", "colour", "size", "city"]  # the label is not a feature
    assert kinds["id"].kind == "numeric" and not kinds["id"].indicator
    assert kinds["colour"].kind == "onehot" and kinds["colour"].levels == ["blue", "green", "red"]
    assert kinds["colour"].indicator and kinds["colour"].fill in ("blue", "green", "red")
    assert kinds["size"].kind == "numeric" and kinds["size"].indicator and isinstance(kinds["size"].fill, float)
    assert kinds["city"].kind == "hash" and kinds["city"].buckets == HASH_BUCKETS
    assert m.x.shape == [1 + (3 + 1) + (1 + 1) + HASH_BUCKETS] and m.x.dtype == "float32"
    x = stored(tmp_path / "out", m.train)
    assert np.isfinite(x).all() and abs(float(x.mean())) < 0.05
    # The fill is the train split's median of the present sizes.
    train_ids = np.round(x[:, 0] * m.normalization.std[0] + m.normalization.mean[0]).astype(int)
    sizes = [float(rows()[i][3]) for i in train_ids if rows()[i][3]]
    assert kinds["size"].fill == pytest.approx(float(np.median(sizes)))


def test_later_data_transformed_with_the_manifest_gives_the_same_features(tmp_path):
    body = rows()
    m = prepare_dataset(str(write_csv(tmp_path / "d.csv", body)), str(tmp_path / "out"), shards=2)
    xv = stored(tmp_path / "out", m.validation)
    ids = np.round(xv[:, 0] * m.normalization.std[0] + m.normalization.mean[0]).astype(int)
    # A second file: the validation rows again, reordered, columns shuffled, without the label.
    header = ["city", "size", "id", "colour"]
    again = [[body[i][4], body[i][3], body[i][0], body[i][1]] for i in ids[::-1]]
    x2 = apply_columns(m, read_table(write_csv(tmp_path / "later.csv", again, header)))
    np.testing.assert_allclose(x2, xv[::-1], rtol=1e-6, atol=1e-6)
    # An unseen level is no level at all.
    new = [["cityX", "1.0", "3", "purple"]]
    x3 = apply_columns(m, read_table(write_csv(tmp_path / "new.csv", new, header)))
    colour = slice(1, 4)
    np.testing.assert_allclose(
        x3[0, colour], (0 - np.asarray(m.normalization.mean[colour])) / m.normalization.std[colour], rtol=1e-5
    )
    with pytest.raises(InvalidDataset, match=r"new.csv: column 'size', line 2: 'big' is not a number"):
        apply_columns(m, read_table(write_csv(tmp_path / "new.csv", [["c", "big", "3", "red"]], header)))


def test_refused_missing_values_name_the_column_and_line(tmp_path, capsys):
    csv = write_csv(tmp_path / "d.csv", rows())
    with pytest.raises(InvalidDataset, match=r"d.csv: column 'colour', line 2 is empty: missing values are refused"):
        prepare_dataset(str(csv), str(tmp_path / "out"), options=SourceOptions(label="label", missing="refuse"))
    # The first empty cell in file order: here line 3's size, before any empty colour.
    body = rows()
    body[0][1], body[0][3], body[1][3] = "red", "1.0", ""
    write_csv(csv, body)
    assert (
        main(["data", "prepare", str(csv), "--label", "label", "--missing", "refuse", "--out", str(tmp_path / "p")])
        == 2
    )
    assert "column 'size', line 3 is empty" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
    # Data without gaps prepares, and its recorded transforms refuse gaps in later data too.
    full = [r for r in rows() if r[1] and r[3]]
    m = prepare_dataset(str(write_csv(csv, full)), str(tmp_path / "ok"), options=SourceOptions(missing="refuse"))
    assert all(c.fill is None and not c.indicator for c in m.columns or [])
    with pytest.raises(InvalidDataset, match=r"later.csv: column 'size', line 3 is empty"):
        apply_columns(m, read_table(write_csv(tmp_path / "later.csv", [full[0], [*full[1][:3], "", full[1][4]]])))


def test_a_row_with_an_empty_label_is_left_out_not_imputed(tmp_path, caplog):
    body = rows()
    body[3][2] = ""
    csv = write_csv(tmp_path / "d.csv", body)
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(csv), str(tmp_path / "out"))
    assert m.train.rows + m.validation.rows == len(body) - 1
    assert f"{csv}: 1 of {len(body)} rows have no label in column 'label' (line 5): left out" in caplog.text


def test_the_label_defaults_to_a_column_called_label_target_or_y_else_the_last(tmp_path, caplog):
    body = [[str(i), str(i % 2), str(i * 2.5)] for i in range(30)]
    m = prepare_dataset(str(write_csv(tmp_path / "a.csv", body, ["a", "target", "b"])), str(tmp_path / "a"))
    assert m.label == "target" and m.task == "classification" and [c.name for c in m.columns or []] == ["a", "b"]
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(write_csv(tmp_path / "b.csv", body, ["a", "flag", "b"])), str(tmp_path / "b"))
    assert m.label == "b" and m.task == "regression"
    assert "b.csv: no label column named (--label or the job's dataset.label): using the last, 'b'" in caplog.text


def test_regression_targets_are_standardised_with_train_statistics(tmp_path):
    m = prepare_dataset("sklearn:diabetes", str(tmp_path), shards=2)
    assert m.task == "regression" and m.y.shape == [1] and m.y.dtype == "float32" and m.target is not None
    y = {
        s: np.concatenate([load((tmp_path / i.key).read_bytes())["y"] for i in split.shards])
        for s, split in (("train", m.train), ("validation", m.validation))
    }
    assert abs(float(y["train"].mean())) < 1e-5 and float(y["train"].std()) == pytest.approx(1, abs=1e-5)
    # In the user's units the train mean is diabetes' (about 152), and val_var is the validation variance.
    assert m.target.mean[0] == pytest.approx(152, abs=5)
    user = y["validation"][:, 0].astype(np.float64) * m.target.std[0] + m.target.mean[0]
    assert m.target.val_var[0] == pytest.approx(float(user.var()), rel=1e-5)


def test_parquet_prepares_like_the_same_csv(tmp_path):
    body = rows()
    csv = write_csv(tmp_path / "d.csv", body)
    cols = {
        "id": pa.array([int(r[0]) for r in body]),
        "colour": pa.array([r[1] or None for r in body]),
        "label": pa.array([r[2] for r in body]),
        "size": pa.array([float(r[3]) if r[3] else None for r in body]),
        "city": pa.array([r[4] for r in body]),
    }
    pq.write_table(pa.table(cols), tmp_path / "d.parquet")
    a = prepare_dataset(str(csv), str(tmp_path / "a"), shards=2)
    b = prepare_dataset(str(tmp_path / "d.parquet"), str(tmp_path / "b"), shards=2)
    assert a.columns == b.columns and a.x == b.x and a.label == b.label == "label"
    np.testing.assert_allclose(stored(tmp_path / "a", a.train), stored(tmp_path / "b", b.train), rtol=1e-6, atol=1e-6)
    with pytest.raises(InvalidDataset, match=r"d.parquet: column 'colour', row 1 is empty"):
        prepare_dataset(str(tmp_path / "d.parquet"), str(tmp_path / "c"), options=SourceOptions(missing="refuse"))


def test_text_labels_are_classes_and_cannot_be_regression_targets(tmp_path):
    csv = write_csv(tmp_path / "d.csv", rows())
    with pytest.raises(InvalidDataset, match=r"column 'label', line 2: 'yes' is not a number \(task is regression\)"):
        prepare_dataset(str(csv), str(tmp_path / "out"), options=SourceOptions(task="regression"))


def test_semicolon_and_tab_separated_files_with_decimal_commas_prepare_like_the_comma_csv(tmp_path):
    body = [[r[0], r[1], r[2], r[3], r[4]] for r in rows()]
    a = prepare_dataset(str(write_csv(tmp_path / "d.csv", body)), str(tmp_path / "a"), shards=2)
    # A spreadsheet in a comma-decimal locale: semicolons between cells, "10,5" for 10.5.
    euro = tmp_path / "euro.csv"
    euro.write_text("\n".join(";".join(c.replace(".", ",") for c in r) for r in [HEADER, *body]) + "\n")
    tabbed = tmp_path / "tabbed.csv"
    tabbed.write_text("\n".join("\t".join(r) for r in [HEADER, *body]) + "\n")
    for src, out in ((euro, "b"), (tabbed, "c")):
        m = prepare_dataset(str(src), str(tmp_path / out), shards=2)
        assert m.columns == a.columns and m.x == a.x and m.label == "label", src
        np.testing.assert_allclose(stored(tmp_path / out, m.train), stored(tmp_path / "a", a.train), rtol=1e-6)
    # Later data is read the same way.
    np.testing.assert_allclose(
        apply_columns(m, read_table(str(euro))), apply_columns(a, read_table(str(tmp_path / "d.csv"))), rtol=1e-6
    )


def test_a_column_of_numbers_with_a_stray_word_is_text_and_prepare_says_so(tmp_path, caplog):
    body = [[str(i), f"{i * 0.5:.1f}" if i != 41 else "unknown", str(i % 2)] for i in range(60)]
    body[7][1] = "n/a"  # a missing marker: an empty cell, were the column numbers
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(write_csv(tmp_path / "d.csv", body, ["id", "weight", "label"])), str(tmp_path / "a"))
    assert {c.name: c.kind for c in m.columns or []} == {"id": "numeric", "weight": "hash"}
    assert (
        "d.csv: column 'weight', line 43: 'unknown' is not a number, so column 'weight' is read as text though 58 of "
        "its 59 cells are numbers" in caplog.text
    )
    assert "read as empty" not in caplog.text  # read as text, `n/a` is a level
    # A column of words is text without a word said.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        prepare_dataset(
            str(write_csv(tmp_path / "e.csv", rows())), str(tmp_path / "b"), options=SourceOptions(label="label")
        )
    assert "is read as text" not in caplog.text


@pytest.mark.parametrize("source", ["csv", "npz"])
def test_a_regression_target_that_never_varies_is_refused(tmp_path, source):
    if source == "csv":
        path = write_csv(tmp_path / "d.csv", [[str(i), "5.5"] for i in range(40)], ["a", "price"])
        named = "target 'price'"
    else:
        path = tmp_path / "d.npz"
        np.savez(path, x=np.arange(80, dtype=np.float32).reshape(40, 2), y=np.full(40, 5.5))
        named = "the regression target"
    with pytest.raises(InvalidDataset, match=rf"{named} is 5.5 in every row of the train split: there is nothing"):
        prepare_dataset(str(path), str(tmp_path / "out"), options=SourceOptions(task="regression"))
    assert not (tmp_path / "out").exists()


def test_parquet_decimals_are_numbers_and_a_column_of_all_different_values_is_named(tmp_path, caplog):
    import datetime as dt
    import decimal

    n = 200
    x = np.random.default_rng(0).normal(size=n)
    table = {
        "price": pa.array([decimal.Decimal(f"{v:.2f}") for v in x], pa.decimal128(10, 2)),
        "when": pa.array([dt.datetime(2024, 1, 1) + dt.timedelta(hours=i) for i in range(n)]),
        "ref": pa.array([f"r{i * 7919 % 10007:05d}" for i in range(n)]),
        "label": pa.array((x > 0).astype("int8")),
    }
    pq.write_table(pa.table(table), tmp_path / "d.parquet")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(tmp_path / "d.parquet"), str(tmp_path / "a"))
    # a timestamp column is a date column (tests/unit/test_data_dates.py), an id is hashed and named
    assert {c.name: c.kind for c in m.columns or []} == {"price": "numeric", "when": "date", "ref": "hash"}
    assert "d.parquet: column 'ref' has 160 distinct values in 160 train rows, hashed into 32 features" in caplog.text
    # Later rows of the same file give the same features (decimals as numbers there too).
    np.testing.assert_allclose(
        apply_columns(m, read_table(str(tmp_path / "d.parquet")))[:, 0],
        (np.round(x, 2) - m.normalization.mean[0]) / m.normalization.std[0],
        rtol=1e-5,
        atol=1e-6,
    )


def test_a_quoted_header_name_with_a_comma_does_not_make_a_semicolon_file_comma_separated(tmp_path):
    q = tmp_path / "q.csv"
    q.write_text('"price, EUR";rooms;label\n"1,5";2;0\n"2,5";3;1\n')
    t = read_table(str(q))
    assert list(t.columns) == ["price, EUR", "rooms", "label"] and t.columns["price, EUR"].tolist() == ["1.5", "2.5"]


def test_a_file_of_one_column_reads_decimal_commas_and_never_splits_on_them(tmp_path):
    one = tmp_path / "one.csv"
    one.write_text("weight\n0,5\n12\n")
    t = read_table(str(one))
    assert list(t.columns) == ["weight"] and t.columns["weight"].astype(float).tolist() == [0.5, 12.0]


def test_a_parquet_float_nan_is_empty_in_new_rows_as_it_was_in_prepare(tmp_path):
    # pandas writes a missing float as NaN: imputed by prepare, so imputed in the rows predicted on.
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=200), rng.normal(size=200)
    a[::7] = np.nan
    pq.write_table(pa.table({"a": a, "b": b, "label": (b > 0).astype(int)}), tmp_path / "t.parquet")
    m = prepare_dataset(str(tmp_path / "t.parquet"), str(tmp_path / "p"), shards=2)
    assert m.columns is not None and m.columns[0].indicator
    pq.write_table(pa.table({"a": a[:20], "b": b[:20]}), tmp_path / "new.parquet")
    x = apply_columns(m, read_table(tmp_path / "new.parquet", numeric={"a", "b"}))
    assert np.isfinite(x).all() and x[0, 1] > 0 and x[1, 1] < 0  # row 1's a is missing: its indicator
    pq.write_table(pa.table({"a": [np.inf], "b": [0.0]}), tmp_path / "inf.parquet")
    with pytest.raises(InvalidDataset, match=r"inf.parquet: column 'a', row 1: 'inf' is not a finite number"):
        apply_columns(m, read_table(tmp_path / "inf.parquet", numeric={"a", "b"}))


def test_dropped_columns_are_left_out_named_in_the_cli_and_the_job(tmp_path, capsys):
    from smlt.runtime.job import parse_job

    body = [[str(i), f"{i % 7}", "ab"[i % 2], str(i % 2)] for i in range(60)]
    src = write_csv(tmp_path / "d.csv", body, ["id", "size", "kind", "label"])
    m = prepare_dataset(str(src), str(tmp_path / "a"), options=SourceOptions(drop=["id", "kind"]))
    assert m.columns is not None and [t.name for t in m.columns] == ["size"]
    assert main(["data", "prepare", str(src), "--out", str(tmp_path / "b"), "--drop", "id", "--drop", "kind"]) == 0
    assert "1 float32 feature" in capsys.readouterr().out
    with pytest.raises(
        InvalidDataset, match=r"drop: no column 'ids' \(did you mean 'id'\?\); the columns are id, size"
    ):
        prepare_dataset(str(src), str(tmp_path / "c"), options=SourceOptions(drop=["ids"]))
    with pytest.raises(InvalidDataset, match="drop: 'label' is the label column, which cannot be left out"):
        prepare_dataset(str(src), str(tmp_path / "c"), options=SourceOptions(drop=["label"]))
    job = parse_job({"dataset": {"uri": "d.csv", "drop": ["id"]}, "model": {"name": "mlp"}})
    assert job.dataset.options().drop == ["id"]
