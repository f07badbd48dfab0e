"""An image folder split already (`train/` and `val/`, `valid/`, `validation/` or `test/`, each of
class subfolders: torchvision's and Kaggle's layouts) keeps its split; any other folder's
subfolders are its classes, split by --validation-fraction as before."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load

from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset

COLOURS = {"cat": (200, 50, 50), "dog": (50, 50, 200), "owl": (50, 200, 50)}


def _images(folder: Path, counts: dict[str, int], shade: int) -> None:
    """`counts[c]` images of class c; every pixel of a split's images holds its `shade` in green."""
    rng = np.random.default_rng(shade)
    for cls, n in counts.items():
        (folder / cls).mkdir(parents=True)
        for i in range(n):
            pixels = np.clip(np.array(COLOURS[cls]) + rng.normal(0, 20, (16, 16, 3)), 0, 255).astype(np.uint8)
            pixels[..., 1] = shade
            Image.fromarray(pixels).save(folder / cls / f"{i}.png")


def _prepare(src: Path, out: Path, caplog):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(src), str(out), shards=2)
    return m, caplog.text


@pytest.mark.parametrize("val_name", ["val", "valid", "validation", "test"])
def test_train_and_val_folders_are_the_splits(tmp_path, caplog, val_name):
    _images(tmp_path / "pets" / "train", {"cat": 12, "dog": 9}, shade=1)
    _images(tmp_path / "pets" / val_name, {"cat": 3, "dog": 4}, shade=2)
    m, told = _prepare(tmp_path / "pets", tmp_path / "p", caplog)
    assert (m.train.rows, m.validation.rows, m.classes) == (21, 7, ["cat", "dog"])
    assert (
        f"pets: split already: train/ (21 images) is the train split and {val_name}/ (7) the validation split" in told
    )
    train, val = (
        [load((tmp_path / "p" / s.key).read_bytes()) for s in split.shards] for split in (m.train, m.validation)
    )
    assert {int(v) for part in train for v in np.unique(part["x"][:, 1])} == {1}
    assert {int(v) for part in val for v in np.unique(part["x"][:, 1])} == {2}
    assert sorted(int(c) for part in val for c in part["y"]) == [0, 0, 0, 1, 1, 1, 1]


def test_a_test_folder_beside_val_is_left_out_and_a_class_only_in_val_is_refused(tmp_path, caplog):
    _images(tmp_path / "pets" / "train", {"cat": 6, "dog": 6}, shade=1)
    _images(tmp_path / "pets" / "val", {"cat": 2, "dog": 2}, shade=2)
    _images(tmp_path / "pets" / "test", {"cat": 2, "dog": 2}, shade=3)
    m, told = _prepare(tmp_path / "pets", tmp_path / "p", caplog)
    assert (m.train.rows, m.validation.rows) == (12, 4) and "; test/ left out" in told
    _images(tmp_path / "more" / "train", {"cat": 6, "dog": 6}, shade=1)
    _images(tmp_path / "more" / "val", {"cat": 2, "owl": 2}, shade=2)
    with pytest.raises(
        InvalidDataset, match=r"more/val: class folder 'owl' is not among train/'s classes \(cat, dog\)"
    ):
        prepare_dataset(str(tmp_path / "more"), str(tmp_path / "q"))


def test_classes_named_like_splits_stay_classes(tmp_path, caplog):
    # no class subfolders inside: train/ and test/ are two classes
    for cls, shade in (("train", 1), ("test", 2)):
        (tmp_path / "odd" / cls).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(np.full((8, 8, 3), shade * 60, np.uint8)).save(tmp_path / "odd" / cls / f"{i}.png")
    m, told = _prepare(tmp_path / "odd", tmp_path / "p", caplog)
    assert m.classes == ["test", "train"] and "split already" not in told
    # another subfolder beside train/ and val/: classes, as before
    _images(tmp_path / "mixed" / "train", {"cat": 4}, shade=1)
    _images(tmp_path / "mixed" / "val", {"cat": 4}, shade=1)
    _images(tmp_path / "mixed" / "dog", {"dog": 4}, shade=1)
    with pytest.raises(InvalidDataset, match=r"mixed/train: holds class folders as a split .* beside dog/"):
        prepare_dataset(str(tmp_path / "mixed"), str(tmp_path / "q"))
