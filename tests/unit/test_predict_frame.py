"""A pandas DataFrame is predicted on as the file `df.to_csv(index=False)` writes: the same
predictions, notes and accuracy (one reader, smlt.inference._frame_table), whatever its dtypes
(bool, nullable Int64/Float64/boolean/string with pd.NA, categorical, datetime64), its index or its
column names' types; its rows are named by position, `row 0` first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smlt.inference import LoadedModel
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.modelcard import read_card
from tests.unit.untrained import loaded, untrained

pd = pytest.importorskip("pandas")

CITIES = ["Paris", "Rome", "Oslo"]


def _model(tmp_path: Path, header: list[str], rows: list[list[str]], name: str) -> LoadedModel:
    """An untrained mlp (seeded) of a CSV's rows, as `load_model` would give it."""
    src = tmp_path / f"{name}.csv"
    src.write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n")
    m = prepare_dataset(str(src), str(tmp_path / f"{name}-prepared"), shards=2)
    card, blob = untrained(m, "mlp", tmp_path / f"{name}-prepared")
    read = read_card(blob, "m")
    assert read is not None
    return loaded(read, blob)


@pytest.fixture
def shop(tmp_path: Path) -> LoadedModel:
    """member True/False (one-hot), rooms (numbers, some empty), city and grade (one-hot), signup
    (a date), income (numbers), label buy/skip."""
    rng = np.random.default_rng(1)
    rows = [
        [
            ["True", "False"][i % 2],
            "" if i % 7 == 0 else str(int(rng.integers(1, 6))),
            CITIES[i % 3],
            "abc"[i % 3],
            f"2025-{1 + i % 12:02d}-{1 + i % 28:02d}",
            f"{rng.normal(50, 15):.2f}",
            ["buy", "skip"][(i // 2) % 2],
        ]
        for i in range(120)
    ]
    model = _model(tmp_path, ["member", "rooms", "city", "grade", "signup", "income", "label"], rows, "shop")
    kinds = [(t.name, t.kind) for t in model.manifest.columns or []]
    assert kinds == [
        ("member", "onehot"),
        ("rooms", "numeric"),
        ("city", "onehot"),
        ("grade", "onehot"),
        ("signup", "date"),
        ("income", "numeric"),
    ]
    return model


def _nullable() -> Any:
    """Six rows in pandas' nullable dtypes, a missing value in each column, an index of row ids."""
    return pd.DataFrame(
        {
            "member": pd.array([True, False, None, True, False, True], dtype="boolean"),
            "rooms": pd.array([3, None, 2, 5, 1, 4], dtype="Int64"),
            "city": pd.array(["Paris", "Rome", None, " Oslo", "Berlin", "Paris"], dtype="string"),
            "grade": pd.Categorical(["a", "b", "c", None, "a", "b"]),
            "signup": pd.to_datetime(
                ["2025-01-06", None, "2025-03-01 10:30", "2025-04-04", "2025-05-05", "2025-06-06"], format="ISO8601"
            ),
            "income": pd.array([50.5, None, 40.0, 61.25, 45.0, 52.0], dtype="Float64"),
            "label": pd.Categorical(["buy", "skip", "buy", "skip", "buy", "skip"]),
            7: [0.5] * 6,  # a column the model does not read, named by a number
        },
        index=[101, 102, 103, 104, 105, 106],
    )


def _plain() -> Any:
    """The same rows in numpy dtypes: bool, int64, object text and numbers (a missing marker, a
    formatted number), datetime64 with a zone, float32."""
    return pd.DataFrame(
        {
            "member": [True, False, False, True, False, True],
            "rooms": np.array([3, "NA", 2, 5, None, "4"], dtype=object),
            "city": np.array(["Paris", "Rome", None, "Oslo ", "Berlin", "Paris"], dtype=object),
            "grade": ["a", "b", "c", "a", "a", "b"],
            "signup": pd.to_datetime(["2025-01-06"] * 3 + ["2025-04-04"] * 3).tz_localize("Europe/Paris"),
            "income": np.array(["$1,050.50", "48", "40", "61.25", "45", "52"], dtype=object),
            "label": ["buy", "skip", "buy", "skip", "buy", "skip"],
        }
    )


@pytest.mark.parametrize("frame", [_nullable, _plain])
def test_a_dataframe_predicts_as_its_csv_file(shop: LoadedModel, frame, tmp_path: Path) -> None:
    df = frame()
    csv = tmp_path / "new.csv"
    df.to_csv(csv, index=False)
    from_frame, from_csv = shop.predict(df), shop.predict(str(csv))
    assert from_frame.labels == from_csv.labels
    np.testing.assert_array_equal(from_frame.probability, from_csv.probability)
    assert from_frame.accuracy == from_csv.accuracy and from_frame.accuracy is not None
    assert from_frame.notes == [n.replace(str(csv), "DataFrame") for n in from_csv.notes]
    assert from_frame.notes[0].startswith("DataFrame: column 'city': 1 of 6 rows hold values the model never saw")
    assert "member" not in " ".join(from_frame.notes)  # True/False are its levels, not 1.0/0.0
    assert from_frame.ids == [f"row {i}" for i in range(6)]  # by position, whatever the index
    np.testing.assert_array_equal(shop.transform(df).numpy(), shop.transform(str(csv)).numpy())
    np.testing.assert_array_equal(shop.serving_input(df), shop.serving_input(str(csv)))


def test_a_dataframes_rows_are_named_by_position_and_its_index_by_a_column(shop: LoadedModel) -> None:
    df = _nullable()
    assert shop.predict(df).ids == ["row 0", "row 1", "row 2", "row 3", "row 4", "row 5"]
    named = shop.predict(df.rename_axis("cust").reset_index(), id_column="cust")
    assert named.ids == ["101", "102", "103", "104", "105", "106"] and named.notes == shop.predict(df).notes
    with pytest.raises(InvalidDataset, match=r"DataFrame: column 'rooms', row 2: 'x' is not a number"):
        shop.predict(df.astype({"rooms": object}).assign(rooms=[1, 2, "x", 4, 5, 6]))


def test_a_dataframe_the_csv_reader_refuses_is_refused_as_a_dataframe(shop: LoadedModel) -> None:
    df = _plain()
    with pytest.raises(
        InvalidDataset,
        match=r"^DataFrame: column 'city' appears twice in the header \(columns \d and \d, counting from 1\): rename one of them$",
    ):
        shop.predict(pd.concat([df, df[["city"]]], axis=1))
    with pytest.raises(InvalidDataset, match=r"^DataFrame: a CSV dataset needs a header and at least one row$"):
        shop.predict(df.iloc[:0])


def test_the_served_columns_of_a_dataframe_are_its_csvs(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    rows = [
        ["" if i % 5 == 0 else str(i % 4), f"{rng.normal(80, 20):.1f}", f"{rng.normal(3e5, 5e4):.2f}"]
        for i in range(80)
    ]
    houses = _model(tmp_path, ["rooms", "area", "price"], rows, "houses")
    df = pd.DataFrame(
        {"area": pd.array([70.5, None, 90.0], dtype="Float64"), "rooms": pd.array([2, 3, None], dtype="Int64")}
    )
    csv = tmp_path / "h.csv"
    df.to_csv(csv, index=False)
    x = houses.serving_input(df)
    np.testing.assert_array_equal(x, houses.serving_input(str(csv)))
    np.testing.assert_array_equal(np.isnan(x), [[False, False], [False, True], [True, False]])
    np.testing.assert_array_equal(houses.predict(df).values, houses.predict(str(csv)).values)
