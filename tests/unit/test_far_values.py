"""A number column far from what the model was trained on (another unit: grams for kilograms,
cents for dollars; a broken column: all zeros) is told, never silent, and changes nothing: by a
pipeline's later version prepared with its FeatureSpec, whole or in parts (prepare's notices,
which a pipeline answers as `prepared.notes`), and by `smlt predict` (stderr, and
`Predictions.notes`). One rule, drift.far_notice, for both; ordinary noise is never told."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from smlt import api
from smlt.cli import main
from smlt.inference import LoadedModel
from smlt.runtime.data import drift, fit_state
from smlt.runtime.data.parts import merge_fits
from smlt.runtime.data.prepare import TableTransforms, fit_part, prepare_dataset, prepare_parts
from smlt.runtime.pipeline import feature_spec, prepare_version
from smlt.runtime.progress import collected_notices
from tests.unit.untrained import load_folder, run_folder, untrained

HEADER = ["weight", "price", "city", "label"]
UNITS = "are its units the same (grams for kilograms, cents for dollars, a percentage as 0-100 for 0-1)?"
TODO = (
    "prepared as it is, with the recorded mean and sd: fix the file and upload the version again (or, to change "
    "the column for good, prepare with --new-features: a new generation, its run starts cold)"
)


def _rows(n: int, seed: int, weight: float = 1.0, price: float = 1.0, regression: bool = False) -> list[list[object]]:
    """Shop rows: a weight in kg (70 ± 12) and a price (20 ± 5), times `weight` and `price` (another
    unit), and a label from the values in their first units: buy/skip, or a regression's number."""
    rng = np.random.default_rng(seed)
    rows: list[list[object]] = []
    for i in range(n):
        w, p = rng.normal(70, 12), rng.normal(20, 5)
        score = w / 70 + p / 20 + rng.normal(0, 0.3)
        label = f"{10 * score:.3f}" if regression else ("buy" if score > 2 else "skip")
        rows.append([f"{w * weight:.3f}", f"{p * price:.3f}", ["Paris", "Rome", "Oslo"][i % 3], label])
    return rows


def _write(path: Path, rows: list[list[object]], header: list[str] = HEADER) -> str:
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return str(path)


def _far(notes: list[str]) -> list[str]:
    return [n for n in notes if "sd from that mean" in n or "nearly constant" in n]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_later_version_in_grams_is_told_and_prepared_as_before(tmp_path: Path, caplog, monkeypatch) -> None:
    pipe = tmp_path / "incoming/shop"
    prepare_version(_write(tmp_path / "v1.csv", _rows(400, 1)), str(pipe / "v1"), shards=2)
    v2 = _write(tmp_path / "v2.csv", _rows(400, 2, weight=1000))
    caplog.set_level(logging.INFO, logger="smlt.notice")
    with collected_notices() as notes:  # what a pipeline's Prepare step answers as `prepared.notes`
        prepare_version(v2, str(pipe / "v2"), shards=2)
    told = _far(notes)
    assert told == [
        f"{v2}: column 'weight': mean 69,454, sd 12,459 over 400 rows; the pipeline's features (generation 1): "
        "mean 70.226, sd 11.917: 400 of the 400 rows lie more than 10 sd from that mean (the mean 5,822 sd away): "
        f"{UNITS} {TODO}"
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.getMessage() in told)

    # A warning only: the same shards and manifest as without it, byte for byte.
    monkeypatch.setattr(drift, "far_notice", lambda *a, **k: None)
    with collected_notices() as notes:
        prepare_version(v2, str(pipe / "v2b"), shards=2)
    assert _far(notes) == []
    assert _files(pipe / "v2") == _files(pipe / "v2b")


def test_a_later_version_of_the_same_distribution_tells_nothing(tmp_path: Path) -> None:
    pipe = tmp_path / "incoming/shop"
    prepare_version(_write(tmp_path / "v1.csv", _rows(400, 1)), str(pipe / "v1"), shards=2)
    for seed in range(2, 7):  # other samples, larger and smaller (a few rows: only a very large shift is told)
        with collected_notices() as notes:
            prepare_version(_write(tmp_path / f"v{seed}.csv", _rows(20 * seed, seed)), str(pipe / f"v{seed}"))
        assert _far(notes) == [], notes


def test_a_broken_column_of_zeros_is_told(tmp_path: Path) -> None:
    v1 = prepare_dataset(_write(tmp_path / "v1.csv", _rows(300, 1)), str(tmp_path / "v1"), shards=2)
    rows = _rows(300, 2)
    for r in rows:
        r[1] = "0"
    v2 = _write(tmp_path / "v2.csv", rows)
    with collected_notices() as notes:
        prepare_dataset(v2, str(tmp_path / "v2"), shards=2, features=feature_spec(v1, 1))
    told = _far(notes)
    assert len(told) == 1 and told[0].startswith(f"{v2}: column 'price': mean 0, sd 0 over 300 rows; ")
    assert "nearly constant where it varied (4.0 sd away): is the column broken (all zeros, a default value " in told[0]


def test_a_regression_versions_target_in_other_units_is_told(tmp_path: Path) -> None:
    header = ["weight", "price", "city", "score"]
    first = _write(tmp_path / "v1.csv", _rows(300, 1, regression=True), header)
    v1 = prepare_dataset(first, str(tmp_path / "v1"), shards=2)
    assert v1.task == "regression"
    spec = feature_spec(v1, 1)
    rows = _rows(300, 2, regression=True)
    for r in rows:
        r[3] = f"{float(str(r[3])) * 100:.1f}"
    v2 = _write(tmp_path / "v2.csv", rows, header)
    with collected_notices() as notes:
        prepare_dataset(v2, str(tmp_path / "v2"), shards=2, features=spec)
    told = _far(notes)
    assert told == [
        f"{v2}: target column 'score': mean 1,971.4, sd 410.91 over 300 rows; the pipeline's features (generation 1): "
        "mean 19.354, sd 4.1942: 300 of the 300 rows lie more than 10 sd from that mean (the mean 465 sd away): "
        f"{UNITS} {TODO}"
    ]
    with collected_notices() as notes:
        prepare_dataset(
            _write(tmp_path / "v3.csv", _rows(300, 3, regression=True), header), str(tmp_path / "v3"), features=spec
        )
    assert _far(notes) == []


def test_a_later_version_in_parts_tells_the_whole_tables_far_column(tmp_path: Path, caplog) -> None:
    v1 = prepare_dataset(_write(tmp_path / "v1.csv", _rows(300, 1)), str(tmp_path / "v1"), shards=2)
    spec = feature_spec(v1, 1)
    parts = [
        _write(tmp_path / "part-00000.csv", _rows(40, 2, price=100)),
        _write(tmp_path / "part-00001.csv", _rows(40, 3, price=100)),
        _write(tmp_path / "part-00002.csv", _rows(40, 4)),  # in dollars: 80 of 120 rows in cents
    ]
    caplog.set_level(logging.INFO, logger="smlt.notice")
    with collected_notices() as notes:
        prepare_parts(parts, str(tmp_path / "v2"), features=spec)
    told = _far(notes)
    # the whole table's column, named as the whole table (no folder given: the first part and their count)
    assert len(told) == 1 and told[0].startswith(f"{parts[0]} and 2 more parts: column 'price': mean ")
    assert "80 of the 120 rows lie more than 10 sd from that mean" in told[0]

    # As the Distributed Map's children and the step after it do: each part's pass 1 stored and
    # read back, then merged (smlt.runtime.steps.prepare_parts).
    fits = [fit_state.loads(fit_state.dumps(fit_part(p, i, features=spec))) for i, p in enumerate(parts)]
    with collected_notices() as notes:
        TableTransforms.of(merge_fits(fits))
    assert _far(notes) == told

    with collected_notices() as notes:
        prepare_parts(parts[2:], str(tmp_path / "v3"), features=spec)
    assert _far(notes) == []


# --- predict ----------------------------------------------------------------------------------


@pytest.fixture
def model(tmp_path: Path) -> LoadedModel:
    """A model of 300 shop rows (weight, price, city one-hot, label buy/skip)."""
    m = prepare_dataset(_write(tmp_path / "shop.csv", _rows(300, 1)), str(tmp_path / "prepared"), shards=2)
    card, blob = untrained(m, "logreg", tmp_path / "prepared")
    return load_folder(run_folder(tmp_path / "out_shop", card, blob, with_json=False))


def test_predict_on_rows_in_grams_warns_and_predicts_as_before(model: LoadedModel, tmp_path: Path, caplog) -> None:
    new = _write(tmp_path / "grams.csv", _rows(20, 9, weight=1000))
    with caplog.at_level(logging.WARNING, logger="smlt.notice"):
        preds = api.predict(model, new)
    assert len(preds) == 20 and len(preds.notes) == 1
    note = preds.notes[0]
    assert note.startswith(f"{new}: column 'weight': mean ") and "over 20 rows; in training: mean " in note
    assert "20 of the 20 rows lie more than 100 sd from that mean (the mean 5," in note
    assert note.endswith(f"sd away): {UNITS} predictions on these rows are unreliable: fix the data and predict again")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == preds.notes
    # One row is enough when it is that far; the predictions are those without the warning.
    one = model.predict(_write(tmp_path / "one.csv", _rows(1, 9, weight=1000)))
    assert len(one.notes) == 1 and "the row lies more than 100 sd from that mean" in one.notes[0]
    assert one.probabilities is not None and preds.probabilities is not None
    assert (one.probabilities[0] == preds.probabilities[0]).all()


def test_predict_on_ordinary_rows_tells_nothing(model: LoadedModel, tmp_path: Path) -> None:
    for seed, n in ((9, 1), (10, 5), (11, 30), (12, 500)):
        assert model.predict(_write(tmp_path / f"ok{seed}.csv", _rows(n, seed))).notes == []


def test_predict_on_the_cli_prints_the_warning_on_stderr(model: LoadedModel, tmp_path: Path, capsys) -> None:
    new = _write(tmp_path / "cents.csv", _rows(40, 9, price=100))
    out = tmp_path / "p.csv"
    assert main(["predict", str(tmp_path / "out_shop"), new, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"{new}: column 'price': mean " in captured.err and "40 of the 40 rows lie more than 10 sd" in captured.err
    assert "sd from that mean" not in captured.out and "wrote 40 predictions" in captured.out


def test_the_rule_tells_another_unit_and_a_constant_but_not_a_heavy_tail() -> None:
    rng = np.random.default_rng(0)

    def told(train: np.ndarray, new: np.ndarray) -> str | None:
        mu, sd = float(train.mean()), float(train.std())
        far = drift.beyond(new, mu, sd)
        return drift.far_notice("f.csv", "column 'x'", len(new), new.mean(), new.std(), far, mu, sd, "t", "do")

    centred = rng.normal(0, 1, 5000)
    assert told(centred, rng.normal(0, 1, 5000) * 100)  # the mean alone barely moves: its rows do
    assert told(centred, rng.normal(0, 1, 400) + 3) is None  # a shift of 3 sd is drift, not another unit
    assert told(centred, rng.normal(0, 3, 400)) is None
    heavy = rng.pareto(1.5, 20000)  # a sample's sd 10-100 times training's, for one huge value
    assert all(told(heavy, rng.pareto(1.5, n)) is None for n in (1, 5, 30, 1000, 10000) for _ in range(20))
    sparse = np.where(rng.random(20000) < 0.01, 100.0, 0.0)  # 1 % refunds; a version without any
    assert told(sparse, np.zeros(400)) is None
    weights = rng.normal(70, 12, 5000)
    assert told(weights, np.zeros(30)) == (
        "f.csv: column 'x': mean 0, sd 0 over 30 rows; t: mean 70.064, sd 12.168: nearly constant where it varied "
        "(5.8 sd away): is the column broken (all zeros, a default value filled in)? do"
    )
    assert told(weights, np.zeros(29)) is None  # too few rows for a spread
