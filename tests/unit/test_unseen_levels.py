"""Values a one-hot column never saw (encoded as none of its levels) and columns a model ignores
are told, never silent: by `smlt predict` (stderr, and `Predictions.notes`) and by a pipeline's
later version prepared with its FeatureSpec, whole or in parts (prepare's notices, which a
pipeline answers as `prepared.notes`). One rule, tabular.unseen_values, for both."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from smlt import api
from smlt.cli import main
from smlt.runtime.data import fit_state
from smlt.runtime.data.manifest import ColumnTransform
from smlt.runtime.data.parts import merge_fits
from smlt.runtime.data.prepare import TableTransforms, fit_part, prepare_dataset, prepare_parts
from smlt.runtime.pipeline import prepare_version, read_features
from tests.unit.untrained import load_folder, run_folder, untrained

CITIES = ["Paris", "Rome", "Oslo"]
HINT = "prepare with --new-features to learn them (a new generation; its run starts cold)"


def _write(path: Path, header: list[str], rows: list[list[object]]) -> str:
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return str(path)


def _shop(n: int, seed: int, cities=CITIES) -> list[list[object]]:
    rng = np.random.default_rng(seed)
    return [
        [int(rng.integers(18, 80)), f"{rng.normal(50, 15):.2f}", cities[i % len(cities)], ["buy", "skip"][i % 2]]
        for i in range(n)
    ]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model of shop.csv (age, income, city one-hot, label buy/skip) in a run's output folder."""
    src = _write(tmp_path / "shop.csv", ["age", "income", "city", "label"], _shop(120, 1))
    m = prepare_dataset(src, str(tmp_path / "prepared"), shards=2)
    assert [(t.name, t.kind) for t in m.columns or []] == [
        ("age", "numeric"),
        ("income", "numeric"),
        ("city", "onehot"),
    ]
    card, blob = untrained(m, "logreg", tmp_path / "prepared")
    return run_folder(tmp_path / "out_shop", card, blob, with_json=False)


def _new(tmp_path: Path, label: bool = False, ids: bool = False) -> str:
    """20 rows, columns reordered, 'Berlin' in 7 of them (every third), an extra column."""
    rows = []
    for i in range(20):
        city = "Berlin" if i % 3 == 0 else CITIES[i % 3]
        rows.append([city, f"{40 + i}.5", "x", 20 + i] + (["buy"] if label else []) + ([f"c{i}"] if ids else []))
    header = ["city", "income", "extra", "age"] + (["label"] if label else []) + (["cust"] if ids else [])
    return _write(tmp_path / "new.csv", header, rows)


def test_predict_tells_unseen_values_and_unused_columns_to_the_api(model: Path, tmp_path: Path, caplog) -> None:
    new = _new(tmp_path, label=True)
    with caplog.at_level(logging.WARNING, logger="smlt.notice"):
        preds = api.predict(load_folder(model), new)
    assert len(preds) == 20
    assert preds.notes == [
        f"{new}: column 'city': 7 of 20 rows hold values the model never saw in training ('Berlin'): "
        "encoded as none of its levels",
        f"{new}: columns not used by the model: extra",  # not the label
    ]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == preds.notes


def test_predict_names_at_most_three_unseen_values_most_frequent_first(model: Path, tmp_path: Path) -> None:
    cities = ["Berlin"] * 3 + ["Lima", "Kyiv", "Lima", "Bern", "Oslo", "Rome"]
    new = _write(tmp_path / "more.csv", ["age", "income", "city"], [[30, "50.0", c] for c in cities])
    preds = load_folder(model).predict(new)
    assert preds.notes == [
        f"{new}: column 'city': 7 of 9 rows hold values the model never saw in training "
        "('Berlin', 'Lima', 'Bern' and 1 more): encoded as none of its levels"
    ]


def test_predict_on_the_cli_prints_the_notices_on_stderr(model: Path, tmp_path: Path, capsys) -> None:
    new = _new(tmp_path, ids=True)
    out = tmp_path / "p.csv"
    assert main(["predict", str(model), new, "--out", str(out), "--id", "cust"]) == 0
    captured = capsys.readouterr()
    assert f"{new}: column 'city': 7 of 20 rows hold values the model never saw in training ('Berlin')" in captured.err
    assert f"{new}: columns not used by the model: extra\n" in captured.err  # not the --id column
    assert "never saw" not in captured.out and "wrote 20 predictions" in captured.out
    assert len(out.read_text().splitlines()) == 21


def test_predict_tells_nothing_when_every_value_and_column_is_the_models(model: Path, tmp_path: Path) -> None:
    known = _write(
        tmp_path / "known.csv", ["label", "city", "age", "income"], [[r[3], r[2], r[0], r[1]] for r in _shop(30, 2)]
    )
    assert load_folder(model).predict(known).notes == []
    # Nor of a data frame's index written as its first column (pandas' to_csv): no feature, no word.
    indexed = _write(
        tmp_path / "indexed.csv",
        ["", "city", "age", "income"],
        [[i, r[2], r[0], r[1]] for i, r in enumerate(_shop(5, 3))],
    )
    assert load_folder(model).predict(indexed).notes == []
    # An empty cell of a one-hot column is missing (imputed or refused), never an unseen value.
    t = ColumnTransform(name="city", kind="onehot", levels=CITIES, fill="Oslo", indicator=True)
    from smlt.runtime.data.tabular import unseen_values

    assert unseen_values(t, pa.array(["Paris", None, "Rome"], pa.string())) == {}
    assert unseen_values(t, pa.array(["Paris", None, "Rio", "Rio"], pa.string())) == {"Rio": 2}
    hashed = ColumnTransform(name="city", kind="hash", buckets=32, fill=None, indicator=False)
    assert unseen_values(hashed, pa.array(["Rio"], pa.string())) == {}


def _unseen(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "new to the pipeline's features" in r.getMessage()]


def test_a_pipelines_later_version_tells_its_new_levels(tmp_path: Path, caplog) -> None:
    pipe = tmp_path / "incoming/shop"
    header = ["age", "income", "city", "code", "label"]
    codes = [f"k{i}" for i in range(20)]  # more than MAX_ONEHOT_LEVELS: hashed

    def rows(n: int, seed: int, cities: list[str], code: list[str]) -> list[list[object]]:
        return [[*r[:3], code[i % len(code)], r[3]] for i, r in enumerate(_shop(n, seed, cities))]

    prepare_version(_write(tmp_path / "v1.csv", header, rows(60, 1, CITIES, codes)), str(pipe / "v1"), shards=2)
    spec = read_features(str(pipe / "features.json"))
    assert spec is not None and [t.kind for t in spec.columns or []] == ["numeric", "numeric", "onehot", "hash"]

    caplog.set_level(logging.INFO, logger="smlt.notice")
    v2 = _write(tmp_path / "v2.csv", header, rows(60, 2, [*CITIES, "Berlin", "Lima"], ["k99", *codes]))
    prepare_version(v2, str(pipe / "v2"), shards=2)
    assert _unseen(caplog) == [
        f"{v2}: column 'city': 24 of 60 rows hold values new to the pipeline's features ('Berlin', 'Lima'): "
        f"encoded as none of its levels, which the model cannot learn: {HINT}"
    ]  # and none for the hashed column's new code
    assert all(r.levelno == logging.WARNING for r in caplog.records if "new to the pipeline" in r.getMessage())

    caplog.clear()
    prepare_version(_write(tmp_path / "v3.csv", header, rows(60, 3, CITIES, codes)), str(pipe / "v3"), shards=2)
    assert _unseen(caplog) == []
    # Its new generation learns them: nothing to tell.
    prepare_version(v2, str(pipe / "v4"), shards=2, new_features=True)
    assert _unseen(caplog) == []


def test_a_later_version_in_parts_tells_the_whole_tables_new_levels(tmp_path: Path, caplog) -> None:
    header = ["age", "income", "city", "label"]
    v1 = prepare_dataset(_write(tmp_path / "v1.csv", header, _shop(60, 1)), str(tmp_path / "v1"), shards=2)
    from smlt.runtime.pipeline import feature_spec

    spec = feature_spec(v1, 1)
    parts = [
        _write(tmp_path / "part-00000.csv", header, _shop(30, 2, [*CITIES, "Berlin"])),  # 7 Berlin
        _write(tmp_path / "part-00001.csv", header, _shop(30, 3, [*CITIES, "Lima", "Berlin"])),  # 6 Lima, 6 Berlin
        _write(tmp_path / "part-00002.csv", header, _shop(30, 4)),
    ]
    caplog.set_level(logging.INFO, logger="smlt.notice")
    m = prepare_parts(parts, str(tmp_path / "v2"), features=spec)
    assert m.columns == v1.columns
    told = (
        f"{parts[0]} and 2 more parts: column 'city': 19 of 90 rows hold values new to the pipeline's features ('Berlin', 'Lima'): "
        f"encoded as none of its levels, which the model cannot learn: {HINT}"
    )
    assert _unseen(caplog) == [told]

    # As the Distributed Map's children and the step after it do: each part's pass 1 stored and
    # read back, then merged (smlt.runtime.steps.prepare_parts).
    caplog.clear()
    fits = [fit_state.loads(fit_state.dumps(fit_part(p, i, features=spec))) for i, p in enumerate(parts)]
    TableTransforms.of(merge_fits(fits))
    assert _unseen(caplog) == [told]

    caplog.clear()
    prepare_parts(parts[2:], str(tmp_path / "v3"), features=spec)
    assert _unseen(caplog) == []


def test_a_versions_unseen_values_past_those_kept_are_still_counted(tmp_path: Path, caplog, monkeypatch) -> None:
    from smlt.runtime.data import table_fit

    monkeypatch.setattr(table_fit, "UNSEEN_KEPT", 2)
    header = ["age", "income", "city", "label"]
    v1 = prepare_dataset(_write(tmp_path / "v1.csv", header, _shop(60, 1)), str(tmp_path / "v1"), shards=2)
    from smlt.runtime.pipeline import feature_spec

    new = ["Oslo", "Ayr", "Bath", "Cork", "Cork"]
    caplog.set_level(logging.INFO, logger="smlt.notice")
    v2 = _write(tmp_path / "v2.csv", header, _shop(50, 2, new))
    prepare_dataset(v2, str(tmp_path / "v2"), features=feature_spec(v1, 1))
    assert _unseen(caplog) == [
        f"{v2}: column 'city': 40 of 50 rows hold values new to the pipeline's features ('Cork', 'Ayr' and more): "
        f"encoded as none of its levels, which the model cannot learn: {HINT}"
    ]
