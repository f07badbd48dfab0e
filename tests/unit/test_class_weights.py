"""training.class_weights "balanced": the train split's rows per class are recorded at prepare
(whole or in parts), each class's loss weight is rows / (classes x its rows), and a job that asks for
weights its dataset cannot give is refused naming the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset, prepare_parts
from smlt.runtime.errors import InvalidJob
from smlt.runtime.job import check_dataset, parse_job
from smlt.runtime.steps.train import _train_loss_fn, balanced_weights


def _csv(path: Path, labels: list[str]) -> Path:
    rng = np.random.default_rng(0)
    rows = [f"{rng.normal():.4f},{label}" for label in labels]
    path.write_text("a,label\n" + "\n".join(rows) + "\n")
    return path


def test_the_splits_record_their_rows_per_class_whole_and_in_parts(tmp_path):
    labels = ["ok"] * 950 + ["fraud"] * 50
    m = prepare_dataset(str(_csv(tmp_path / "t.csv", labels)), str(tmp_path / "p"), shards=4)
    assert m.classes == ["fraud", "ok"]
    train, val = m.train.class_counts, m.validation.class_counts
    assert train is not None and val is not None and sum(train) == m.train.rows and sum(val) == m.validation.rows
    assert [t + v for t, v in zip(train, val)] == [50, 950]
    parts = [str(_csv(tmp_path / f"part-{i}.csv", labels[i::2])) for i in range(2)]
    whole = prepare_parts(parts, str(tmp_path / "q"), options=SourceOptions())
    assert whole.train.class_counts is not None and whole.validation.class_counts is not None
    assert [t + v for t, v in zip(whole.train.class_counts, whole.validation.class_counts)] == [50, 950]
    npz = tmp_path / "d.npz"
    np.savez(npz, x=np.random.default_rng(1).normal(size=(100, 3)), y=np.repeat([0, 2], [30, 70]))
    m = prepare_dataset(str(npz), str(tmp_path / "n"), shards=2)
    assert m.classes == ["0", "2"] and m.train.class_counts is not None and m.validation.class_counts is not None
    assert [t + v for t, v in zip(m.train.class_counts, m.validation.class_counts)] == [30, 70]


def test_balanced_weights_make_each_class_weigh_as_much_in_all():
    w = balanced_weights([50, 950, 0], outputs=4)
    assert w.tolist() == pytest.approx([10.0, 1000 / 1900, 0.0, 0.0])
    counts = torch.tensor([50.0, 950.0])
    assert (w[:2] * counts).tolist() == pytest.approx([500.0, 500.0])  # each class: half the loss
    assert float((w[:2] * counts).sum()) == pytest.approx(1000.0)  # weights average 1 over the rows


def test_the_training_loss_weighs_the_classes_only_when_asked(tmp_path):
    m = prepare_dataset(str(_csv(tmp_path / "t.csv", ["ok"] * 90 + ["fraud"] * 10)), str(tmp_path / "p"), shards=2)
    balanced = parse_job({"dataset": {"uri": "s3://b/p/"}, "training": {"class_weights": "balanced"}})
    plain = parse_job({"dataset": {"uri": "s3://b/p/"}})
    loss = _train_loss_fn(balanced, m)
    assert isinstance(loss, torch.nn.CrossEntropyLoss) and loss.weight is not None and loss.weight[0] > loss.weight[1]
    assert getattr(_train_loss_fn(plain, m), "weight", None) is None
    check_dataset(balanced, m)
    old = m.model_copy(update={"train": m.train.model_copy(update={"class_counts": None})})
    with pytest.raises(InvalidJob, match="training.class_weights: .* prepared before its class counts were recorded"):
        check_dataset(balanced, old)
    r = prepare_dataset("sklearn:diabetes", str(tmp_path / "r"), shards=2)
    with pytest.raises(InvalidJob, match="training.class_weights: balanced weighs classes, and .* is a regression"):
        check_dataset(balanced, r)
