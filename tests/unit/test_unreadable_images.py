"""An image Pillow cannot read (a truncated JPEG, a 0-byte file, an HTML page saved as .jpg) is
left out, as fastai's verify_images leaves it, with one warning counting them and naming the first
few with Pillow's reason, as rows without a label are: prepare (whole folder or split already)
stores exactly what the folder without those files gives, and refuses a class folder left with no
readable image or a folder more than half unreadable; predict on a folder leaves them out of the
predictions and tells it (stderr, `Predictions.notes`); one unreadable file given alone is an error."""

from __future__ import annotations

import io
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from smlt import api
from smlt.cli import main
from smlt.inference import read_inputs
from smlt.runtime.data.images import read_image_folder
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset
from tests.unit.untrained import load_folder, run_folder, untrained

COLOURS = {"cat": (200, 50, 50), "dog": (50, 50, 200), "owl": (50, 200, 50)}
BROKEN = ("cat/03b.jpg", "dog/00a.jpg", "dog/05b.jpg")
HTML = b"<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head><body>Access denied</body></html>\n"


def _photo(seed: int, colour: tuple[int, int, int], size: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(colour) + rng.normal(0, 25, (size, size, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _folder(root: Path, counts: dict[str, int], seed: int = 0) -> None:
    for cls, n in counts.items():
        (root / cls).mkdir(parents=True)
        for i in range(n):
            (root / cls / f"{i:02d}.jpg").write_bytes(_photo(seed * 1000 + i, COLOURS[cls]))


def _break(root: Path) -> dict[str, bytes]:
    """Three broken files among the good ones (their names sort between them): a truncated JPEG,
    a 0-byte file and an HTML page saved as .jpg; what each holds."""
    big = _photo(7, COLOURS["cat"], size=64)
    broken = dict(zip(BROKEN, (big[: len(big) // 2], b"", HTML)))
    for name, data in broken.items():
        (root / name).write_bytes(data)
    return broken


def _n(message: str) -> str:
    """A message with the bytes a truncated JPEG leaves unread (libjpeg's count) as N."""
    return re.sub(r"\(\d+ bytes not processed\)", "(N bytes not processed)", message)


def _prepare(src: Path, out: Path, caplog, **options):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(src), str(out), shards=2, options=SourceOptions(**options))
    # these folders are small on purpose: the small validation split's own warning is not the one tested
    small = "the validation split holds"
    return m, [r for r in caplog.records if r.levelno >= logging.WARNING and small not in r.getMessage()]


def _same_files(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and any(n.endswith(".safetensors") for n in names)
    for name in names:
        if name.endswith(".safetensors"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("options", [{}, {"image_size": 8, "channels": 1}])
def test_unreadable_images_are_left_out_with_one_warning_and_the_shards_are_the_folder_without_them(
    tmp_path, caplog, options
):
    _folder(tmp_path / "broken" / "pets", {"cat": 12, "dog": 12})
    _folder(tmp_path / "clean" / "pets", {"cat": 12, "dog": 12})
    _break(tmp_path / "broken" / "pets")
    m, warned = _prepare(tmp_path / "broken" / "pets", tmp_path / "out_broken", caplog, **options)
    src = tmp_path / "broken" / "pets"
    assert [_n(r.getMessage()) for r in warned] == [
        f"{src}: 3 of 27 images are unreadable (cat/03b.jpg: image file is truncated (N bytes not processed); "
        "dog/00a.jpg: 0 bytes; dog/05b.jpg: cannot identify image file, an HTML page): left out of training "
        "and validation"
    ]
    clean, warned_clean = _prepare(tmp_path / "clean" / "pets", tmp_path / "out_clean", caplog, **options)
    assert warned_clean == []
    assert (m.train.rows, m.validation.rows) == (clean.train.rows, clean.validation.rows)
    assert m.train.rows + m.validation.rows == 24 and m.x.shape == clean.x.shape
    _same_files(tmp_path / "out_broken", tmp_path / "out_clean")


def test_a_folder_split_already_leaves_them_out_of_its_own_split(tmp_path, caplog):
    for root in ("broken", "clean"):
        _folder(tmp_path / root / "kaggle" / "train", {"cat": 10, "dog": 10, "owl": 10}, seed=1)
        _folder(tmp_path / root / "kaggle" / "val", {"cat": 4, "dog": 4, "owl": 4}, seed=2)
    src = tmp_path / "broken" / "kaggle"
    (src / "train" / "owl" / "00a.jpg").write_bytes(b"")
    (src / "val" / "cat" / "01a.jpg").write_bytes(HTML)
    m, warned = _prepare(src, tmp_path / "out_broken", caplog)
    assert [r.getMessage() for r in warned] == [
        f"{src}: 2 of 44 images are unreadable (train/owl/00a.jpg: 0 bytes; val/cat/01a.jpg: cannot identify "
        "image file, an HTML page): left out of training and validation"
    ]
    assert "train/ (30 images) is the train split and val/ (12) the validation split" in caplog.text  # readable
    clean, _ = _prepare(tmp_path / "clean" / "kaggle", tmp_path / "out_clean", caplog)
    assert (m.train.rows, m.validation.rows) == (clean.train.rows, clean.validation.rows) == (30, 12)
    _same_files(tmp_path / "out_broken", tmp_path / "out_clean")


def test_the_warning_lists_at_most_three(tmp_path, caplog):
    _folder(tmp_path / "pets", {"cat": 10, "dog": 10})
    for i in range(5):
        (tmp_path / "pets" / "dog" / f"zz{i}.jpg").write_bytes(b"")
    _, warned = _prepare(tmp_path / "pets", tmp_path / "out", caplog)
    assert [r.getMessage() for r in warned] == [
        f"{tmp_path / 'pets'}: 5 of 25 images are unreadable (dog/zz0.jpg: 0 bytes; dog/zz1.jpg: 0 bytes; "
        "dog/zz2.jpg: 0 bytes; ...): left out of training and validation"
    ]
    x, y, _, validation = read_image_folder(tmp_path / "pets", None, None)
    assert x.shape == (20, 3, 16, 16) and np.bincount(y).tolist() == [10, 10] and validation is None


def test_a_class_with_no_readable_image_is_refused_naming_its_folder(tmp_path, caplog):
    _folder(tmp_path / "pets", {"cat": 10, "dog": 10})
    (tmp_path / "pets" / "owl").mkdir()
    (tmp_path / "pets" / "owl" / "a.jpg").write_bytes(HTML)
    (tmp_path / "pets" / "owl" / "b.png").write_bytes(b"")
    with pytest.raises(InvalidDataset) as e:
        _prepare(tmp_path / "pets", tmp_path / "out", caplog)
    assert str(e.value) == (
        f"{tmp_path / 'pets' / 'owl'}: class folder holds no readable image: all 2 are unreadable (a.jpg: cannot "
        "identify image file, an HTML page; b.png: 0 bytes); replace them with readable PNG, JPEG, GIF, WebP, AVIF, BMP or "
        "TIFF images, or remove the class folder"
    )
    # A split's class folder too (val/owl beside a train/owl that reads).
    _folder(tmp_path / "split" / "train", {"cat": 5, "owl": 5})
    _folder(tmp_path / "split" / "val", {"cat": 2})
    (tmp_path / "split" / "val" / "owl").mkdir()
    (tmp_path / "split" / "val" / "owl" / "a.jpg").write_bytes(b"")
    with pytest.raises(InvalidDataset, match=r"split/val/owl: class folder holds no readable image: all 1 is"):
        _prepare(tmp_path / "split", tmp_path / "out2", caplog)


def test_more_than_half_unreadable_is_refused_as_the_wrong_folder(tmp_path, caplog):
    _folder(tmp_path / "pets", {"cat": 3, "dog": 3})
    for cls in ("cat", "dog"):
        for i in range(4):
            (tmp_path / "pets" / cls / f"page{i}.jpg").write_bytes(HTML)
    with pytest.raises(InvalidDataset) as e:
        _prepare(tmp_path / "pets", tmp_path / "out", caplog)
    assert str(e.value).startswith(
        f"{tmp_path / 'pets'}: 8 of 14 images are unreadable (cat/page0.jpg: cannot identify image file, an HTML "
        "page; cat/page1.jpg: "
    )
    assert str(e.value).endswith(
        "; ...): more than half, so this is likely the wrong folder or files that are not PNG, JPEG, GIF, WebP, AVIF, BMP or "
        "TIFF images under an image's name; check the folder (when at most half are unreadable, they are left out "
        "with a warning)"
    )
    # Exactly half is left out, with the warning.
    for cls in ("cat", "dog"):
        (tmp_path / "pets" / cls / "page3.jpg").unlink()
    _, warned = _prepare(tmp_path / "pets", tmp_path / "out", caplog)
    assert len(warned) == 1 and "6 of 12 images are unreadable" in warned[0].getMessage()


# --------------------------------------------------------------------------------------------
# predict


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A small CNN on 3-class 16x16 photos (seeded weights), in a run's output folder."""
    _folder(tmp_path / "train", {"cat": 6, "dog": 6, "owl": 6})
    m = prepare_dataset(str(tmp_path / "train"), str(tmp_path / "prepared"), shards=1)
    card, blob = untrained(m, "lenet", tmp_path / "prepared")
    return run_folder(tmp_path / "run", card, blob)


def test_predict_on_a_folder_leaves_unreadable_images_out_and_tells_it(model, tmp_path, caplog):
    new = tmp_path / "new"
    _folder(new, {"cat": 3, "dog": 3}, seed=5)
    _break(new)
    loaded = load_folder(model)
    with caplog.at_level(logging.WARNING, logger="smlt.notice"):
        preds = api.predict(loaded, str(new))
    told = (
        f"{new}: 3 of 9 images are unreadable (cat/03b.jpg: image file is truncated (N bytes not processed); "
        "dog/00a.jpg: 0 bytes; dog/05b.jpg: cannot identify image file, an HTML page): left out of the predictions"
    )
    assert [_n(note) for note in preds.notes] == [told]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == preds.notes
    assert preds.ids == [f"{c}/{i:02d}.jpg" for c in ("cat", "dog") for i in range(3)]
    assert preds.truth is not None and preds.truth.tolist() == [0, 0, 0, 1, 1, 1]
    # The same predictions as on the folder without them.
    clean = tmp_path / "clean"
    shutil.copytree(new, clean)
    for name in BROKEN:
        (clean / name).unlink()
    again = loaded.predict(str(clean))
    assert again.notes == [] and again.ids == preds.ids
    assert np.array_equal(again.probabilities, preds.probabilities)


def test_predict_on_the_cli_prints_it_on_stderr_and_writes_the_rest(model, tmp_path, capsys):
    new = tmp_path / "new"
    _folder(new, {"cat": 2, "owl": 2}, seed=6)
    (new / "owl" / "x.jpg").write_bytes(b"")
    out = tmp_path / "p.csv"
    assert main(["predict", str(model), str(new), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"{new}: 1 of 5 images is unreadable (owl/x.jpg: 0 bytes): left out of the predictions" in captured.err
    assert "wrote 4 predictions" in captured.out and len(out.read_text().splitlines()) == 5


def test_predict_on_one_unreadable_file_or_a_folder_of_them_is_an_error(model, tmp_path):
    manifest = load_folder(model).manifest
    (tmp_path / "page.jpg").write_bytes(HTML)
    with pytest.raises(InvalidDataset) as e:
        read_inputs(manifest, str(tmp_path / "page.jpg"))
    assert str(e.value) == (
        f"{tmp_path / 'page.jpg'}: not a readable PNG, JPEG, GIF, WebP, AVIF, BMP or TIFF image (cannot identify image file, "
        "an HTML page)"
    )
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "a.png").write_bytes(b"")
    shutil.copy(tmp_path / "page.jpg", tmp_path / "none" / "b.jpg")
    with pytest.raises(InvalidDataset) as e:
        read_inputs(manifest, str(tmp_path / "none"))
    assert str(e.value) == (
        f"{tmp_path / 'none'}: 2 of 2 images are unreadable (a.png: 0 bytes; b.jpg: cannot identify image file, an "
        "HTML page): no image left to predict on; predict on PNG, JPEG, GIF, WebP, AVIF, BMP or TIFF images Pillow reads"
    )
