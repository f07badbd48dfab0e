"""A pipeline's features are fixed by its first version (smlt.runtime.pipeline.prepare_version),
and the gate's verdict (smlt.runtime.pipeline._verdict)."""

import json
import logging

import numpy as np
import pytest

from smlt.runtime.data.prepare import read_local_manifest
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.pipeline import VersionRecord, _verdict, prepare_version


def _csv(path, header, rows):
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return str(path)


def _rows(n, colors, seed, extra=0, label=lambda i: i % 2):
    rng = np.random.default_rng(seed)
    return [[f"{rng.normal():.3f}", colors[i % len(colors)], *[i] * extra, label(i)] for i in range(n)]


def test_later_versions_are_transformed_with_the_first_versions_features(tmp_path, caplog):
    pipe = tmp_path / "incoming/houses"
    v1 = _csv(tmp_path / "v1.csv", ["size", "color", "label"], _rows(40, ["red", "green"], 1))
    m1, said = prepare_version(v1, str(pipe / "v1"), shards=2)
    spec = json.loads((pipe / "features.json").read_text())
    assert spec["generation"] == 1 and m1.generation == 1 and "first version" in said
    assert m1.x.shape == [3] and m1.classes == ["0", "1"]

    # A new colour and two new columns: the same 3 features, v1's statistics, the new columns said.
    caplog.set_level(logging.WARNING, logger="smlt.notice")
    v2 = _csv(
        tmp_path / "v2.csv",
        ["size", "color", "garden", "floor", "label"],
        _rows(40, ["red", "green", "blue"], 2, extra=2),
    )
    m2, said = prepare_version(v2, str(pipe / "v2"), shards=2)
    assert m2.x.shape == [3] and m2.columns == m1.columns and m2.normalization == m1.normalization
    assert m2.generation == 1 and "generation 1" in said
    assert any("'garden', 'floor'" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
    from safetensors.numpy import load_file

    shards = m2.train.shards + m2.validation.shards
    x = np.concatenate([load_file(str(pipe / "v2" / s.key))["x"] for s in shards])
    mean, std = np.asarray(m1.normalization.mean), np.asarray(m1.normalization.std)
    onehot = (x[:, 1:] * std[1:] + mean[1:]).round(4)  # back to 0/1: a blue row has no level
    assert set(np.unique(onehot)) == {0.0, 1.0}
    assert (onehot.sum(axis=1) == 0).sum() == sum(1 for i in range(40) if i % 3 == 2)  # the blue rows


def test_a_missing_column_or_an_unknown_class_is_named(tmp_path):
    pipe = tmp_path / "incoming/p"
    prepare_version(_csv(tmp_path / "v1.csv", ["size", "color", "label"], _rows(30, ["a", "b"], 1)), str(pipe / "v1"))
    no_color = _csv(tmp_path / "v2.csv", ["size", "label"], [[r[0], r[2]] for r in _rows(30, ["a"], 2)])
    with pytest.raises(InvalidDataset, match=r"no column 'color', which the pipeline's features \(generation 1\) use"):
        prepare_version(no_color, str(pipe / "v2"))
    # a renamed column: the missing one named with the new one
    renamed = _csv(tmp_path / "v2r.csv", ["size", "colour", "label"], _rows(30, ["a", "b"], 2))
    with pytest.raises(InvalidDataset) as e:
        prepare_version(renamed, str(pipe / "v2"))
    assert str(e.value).endswith(
        "v2r.csv: no column 'color', which the pipeline's features (generation 1) use (its columns new to them: "
        "'colour': renamed?); add it (or give it back its name), or prepare with --new-features to start a "
        "generation without it"
    ), e.value
    three = _csv(tmp_path / "v3.csv", ["size", "color", "label"], _rows(30, ["a"], 3, label=lambda i: i % 3))
    with pytest.raises(
        InvalidDataset, match=r"label '2' is not one of the pipeline's classes \(0, 1\).*--new-features"
    ):
        prepare_version(three, str(pipe / "v3"))
    assert not (pipe / "v2" / "manifest.json").exists() and not (pipe / "v3" / "manifest.json").exists()


def test_a_header_or_class_written_in_another_case_is_named_with_what_to_write(tmp_path, caplog):
    """A later version's header (`Color`, `color `) or class label (`Yes` for `yes`) written in
    another letter case or spacing: refused before training, naming the pipeline's spelling (not
    taken as one column missing and one new, or as a new class)."""
    pipe = tmp_path / "incoming/p"
    yes_no = lambda i: ("yes", "no")[i % 2]  # noqa: E731
    prepare_version(
        _csv(tmp_path / "v1.csv", ["size", "color", "label"], _rows(30, ["a", "b"], 1, label=yes_no)), str(pipe / "v1")
    )
    for header in ("Color", "color ", " COLOR"):
        v2 = _csv(tmp_path / "v2.csv", ["size", header, "label"], _rows(30, ["a", "b"], 2, label=yes_no))
        with pytest.raises(InvalidDataset) as e:
            prepare_version(v2, str(pipe / "v2"))
        assert str(e.value).endswith(
            f"v2.csv: no column 'color', which the pipeline's features (generation 1) use; its column {header!r} "
            "differs from it only in letter case or spacing: rename that header 'color' and upload the version "
            "again (or prepare with --new-features to start a generation that reads it as a column of its own)"
        ), e.value
    shouted = _csv(
        tmp_path / "v3.csv", ["size", "color", "label"], _rows(30, ["a", "b"], 3, label=lambda i: ("yes", "No")[i % 2])
    )
    with pytest.raises(InvalidDataset) as e:
        prepare_version(shouted, str(pipe / "v3"))
    assert str(e.value).endswith(
        "v3.csv: label 'No' is not one of the pipeline's classes (no, yes), but differs from its class 'no' only "
        "in letter case or spacing: write it 'no' in column 'label' and upload the version again (a class of its "
        "own changes the model's outputs: prepare with --new-features)"
    ), e.value
    assert sorted(p.name for p in pipe.iterdir()) == ["features.json", "v1"]  # nothing of v2, v3 written

    # a one-hot level written another way: prepared as a value new to the features, and said so
    caplog.set_level(logging.WARNING, logger="smlt.notice")
    prepare_version(
        _csv(tmp_path / "v4.csv", ["size", "color", "label"], _rows(30, ["A", "b"], 4, label=yes_no)), str(pipe / "v4")
    )
    said = [r.getMessage() for r in caplog.records if "column 'color'" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(
        "(a new generation; its run starts cold); 'A' differs from its level 'a' only in letter case or spacing: "
        "if they mean the same, write them so and upload the version again"
    ), said


def test_new_features_start_the_next_generation(tmp_path):
    pipe = tmp_path / "incoming/p"
    prepare_version(_csv(tmp_path / "v1.csv", ["size", "color", "label"], _rows(30, ["a", "b"], 1)), str(pipe / "v1"))
    v2 = _csv(tmp_path / "v2.csv", ["size", "color", "rooms", "label"], _rows(30, ["a", "b", "c"], 2, extra=1))
    m2, said = prepare_version(v2, str(pipe / "v2"), new_features=True)
    assert m2.generation == 2 and m2.x.shape == [5] and "generation 2" in said and "--new-features" in said
    assert json.loads((pipe / "features.json").read_text())["generation"] == 2
    assert read_local_manifest(pipe / "v2").generation == 2


def test_regression_targets_keep_the_first_versions_scaling(tmp_path):
    pipe = tmp_path / "incoming/r"

    def rows(seed, shift):
        return [[f"{x:.3f}", f"{2 * x + shift:.3f}"] for x in np.random.default_rng(seed).normal(size=50)]

    m1, _ = prepare_version(_csv(tmp_path / "a.csv", ["x", "target"], rows(1, 0.0)), str(pipe / "v1"), options=None)
    m2, _ = prepare_version(_csv(tmp_path / "b.csv", ["x", "target"], rows(2, 5.0)), str(pipe / "v2"))
    assert m1.task == m2.task == "regression"
    assert m2.target.mean == m1.target.mean and m2.target.std == m1.target.std
    assert m2.target.val_var != m1.target.val_var  # the R² denominator is the version's own


def _record(**kw):
    base = dict(pipeline="p", version="v2", data="s3://d/incoming/p/v2/", run_id="r2", features="f", generation=1)
    return VersionRecord(**{**base, **kw})


def test_the_gate_promotes_only_a_challenger_not_worse_than_the_champion_by_the_margin():
    from smlt.runtime.pipeline import Champion

    champ = Champion(run_id="r1", model="s3://a/m", version="v1")
    warm = _record(champion_run="r1", champion_version="v1")
    assert _verdict(warm, champ, "val_accuracy", 0.0, 0.90, 0.90)[0]
    ok, why = _verdict(warm, champ, "val_accuracy", 0.0, 0.89, 0.90)
    assert not ok and "worse by 0.01" in why and "v1" in why
    assert _verdict(warm, champ, "val_accuracy", 0.02, 0.89, 0.90)[0]
    assert not _verdict(warm, champ, "val_rmse", 0.0, 1.2, 1.1)[0]  # lower is better
    assert _verdict(warm, champ, "val_loss", 0.0, 0.3, 0.4)[0]
    assert not _verdict(warm, champ, "val_balanced_accuracy", 0.0, 0.52, 0.88)[0]  # higher is better
    assert _verdict(warm, champ, "val_balanced_accuracy", 0.0, 0.90, 0.88)[0]
    assert _verdict(_record(start="cold: the pipeline's first version"), None, "val_accuracy", 0, 0.5, None)[0]
    assert not _verdict(warm, champ, "val_accuracy", 0, 0.9, None)[0]  # champion not re-scored
    moved = Champion(run_id="r9", model="s3://a/m9", version="v9")
    ok, why = _verdict(warm, moved, "val_accuracy", 0, 0.99, 0.5)
    assert not ok and "changed during the run" in why
