"""Prepared datasets keep each sample's shape and dtype: NPZ of any shape, digits as images, image
folders (PNGs made with Pillow here), token sequences; read back from the shards with
safetensors and `model_input`."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load

from smlt.cli import main
from smlt.runtime.data.images import read_image_folder
from smlt.runtime.data.inputs import model_input
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset, read_local_manifest
from smlt.runtime.errors import InvalidDataset


def stored(folder, split) -> tuple[np.ndarray, np.ndarray]:
    """A split's (x, y) as its shards hold them, in shard order."""
    parts = [load((folder / s.key).read_bytes()) for s in split.shards]
    return np.concatenate([p["x"] for p in parts]), np.concatenate([p["y"] for p in parts])


def test_uint8_images_keep_their_shape_and_dtype_and_normalise_on_load(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (120, 3, 32, 32), dtype=np.uint8)
    x[:, 1] //= 2  # channels with different statistics
    np.savez(tmp_path / "img.npz", x=x, y=rng.integers(0, 4, 120))
    m = prepare_dataset(str(tmp_path / "img.npz"), str(tmp_path / "out"), shards=4)
    assert m.x.shape == [3, 32, 32] and m.x.dtype == "uint8" and m.input_shape == (3, 32, 32)
    assert m.normalization.applied == "on_load" and m.normalization.axis == "channel"
    xt, yt = stored(tmp_path / "out", m.train)
    assert xt.dtype == np.uint8 and xt.shape == (m.train.rows, 3, 32, 32) and yt.dtype == np.int64
    # Per-channel statistics of the train split, in 0..255 units.
    np.testing.assert_allclose(m.normalization.mean, xt.astype(np.float64).mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(m.normalization.std, xt.astype(np.float64).std(axis=(0, 2, 3)), rtol=1e-6)
    assert m.normalization.mean[1] < m.normalization.mean[0] / 1.5
    inputs = model_input(m, xt)
    assert inputs.dtype == np.float32
    np.testing.assert_allclose(inputs.mean(axis=(0, 2, 3)), 0, atol=1e-4)
    np.testing.assert_allclose(inputs.std(axis=(0, 2, 3)), 1, atol=1e-3)
    assert read_local_manifest(tmp_path / "out") == m


def test_float_images_are_stored_standardised_per_channel(tmp_path):
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(80, 2, 6, 6)) * [[[[3.0]], [[0.5]]]] + [[[[10.0]], [[-2.0]]]]).astype(np.float32)
    np.savez(tmp_path / "f.npz", x=x, y=rng.integers(0, 2, 80))
    m = prepare_dataset(str(tmp_path / "f.npz"), str(tmp_path / "out"), shards=2)
    assert m.x.shape == [2, 6, 6] and m.x.dtype == "float32"
    assert m.normalization.applied == "stored" and m.normalization.axis == "channel"
    assert m.normalization.mean == pytest.approx([10.0, -2.0], abs=0.5)
    xt, _ = stored(tmp_path / "out", m.train)
    np.testing.assert_allclose(xt.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(xt.std(axis=(0, 2, 3)), 1, atol=1e-4)
    assert model_input(m, xt) is xt


def test_three_axis_images_gain_a_channel_axis(tmp_path):
    x = np.random.default_rng(2).integers(0, 256, (40, 5, 7), dtype=np.uint8)
    np.savez(tmp_path / "g.npz", x=x, y=np.arange(40) % 2)
    m = prepare_dataset(str(tmp_path / "g.npz"), str(tmp_path / "out"), shards=2)
    assert m.x.shape == [1, 5, 7] and m.x.dtype == "uint8" and len(m.normalization.mean) == 1
    xt, _ = stored(tmp_path / "out", m.train)
    assert xt.shape[1:] == (1, 5, 7)


def test_channels_last_images_are_stored_channels_first_and_prepare_says_so(tmp_path, caplog):
    import logging

    rng = np.random.default_rng(4)
    nchw = rng.integers(0, 256, (40, 3, 8, 6), dtype=np.uint8)
    np.savez(tmp_path / "nhwc.npz", x=nchw.transpose(0, 2, 3, 1), y=np.arange(40) % 2)  # (40, 8, 6, 3)
    np.savez(tmp_path / "nchw.npz", x=nchw, y=np.arange(40) % 2)
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(tmp_path / "nhwc.npz"), str(tmp_path / "a"), shards=2)
    assert "nhwc.npz: x of shape (40, 8, 6, 3) is read as (rows, H, W, C), channels last: samples 3x8x6" in caplog.text
    ref = prepare_dataset(str(tmp_path / "nchw.npz"), str(tmp_path / "b"), shards=2)
    assert m.x.shape == ref.x.shape == [3, 8, 6]
    np.testing.assert_array_equal(stored(tmp_path / "a", m.train)[0], stored(tmp_path / "b", ref.train)[0])


def test_integer_sequences_are_token_ids(tmp_path):
    x = np.random.default_rng(3).integers(0, 37, (60, 12)).astype(np.int32)
    x[0, 0] = 36
    np.savez(tmp_path / "t.npz", x=x, y=np.arange(60) % 3)
    m = prepare_dataset(str(tmp_path / "t.npz"), str(tmp_path / "out"), shards=2)
    assert m.x.shape == [12] and m.x.dtype == "int64" and m.vocab_size == 37
    assert m.normalization.applied == "none"
    xt, _ = stored(tmp_path / "out", m.train)
    assert xt.dtype == np.int64 and model_input(m, xt) is xt
    given = prepare_dataset(str(tmp_path / "t.npz"), str(tmp_path / "v"), options=SourceOptions(vocab_size=100))
    assert given.vocab_size == 100
    with pytest.raises(InvalidDataset, match="token id 36 is not below the vocabulary size 20"):
        prepare_dataset(str(tmp_path / "t.npz"), str(tmp_path / "w"), options=SourceOptions(vocab_size=20))
    x[5, 5] = -1
    np.savez(tmp_path / "neg.npz", x=x, y=np.arange(60) % 3)
    with pytest.raises(InvalidDataset, match="cannot be negative .* save tabular features as floats"):
        prepare_dataset(str(tmp_path / "neg.npz"), str(tmp_path / "n"))


def test_tabular_npz_stays_flat_float32(tmp_path):
    x = np.random.default_rng(4).normal(5, 2, (50, 4)).astype(np.float64)
    np.savez(tmp_path / "tab.npz", x=x, y=np.arange(50) % 2)
    m = prepare_dataset(str(tmp_path / "tab.npz"), str(tmp_path / "out"), shards=2)
    assert m.x.shape == [4] and m.x.dtype == "float32" and m.normalization.applied == "stored"
    assert m.normalization.axis == "feature" and len(m.normalization.mean) == 4


def test_five_axis_x_is_refused(tmp_path):
    np.savez(tmp_path / "v.npz", x=np.zeros((4, 1, 2, 2, 2), np.float32), y=np.arange(4) % 2)
    with pytest.raises(InvalidDataset, match=r"x has shape \(4, 1, 2, 2, 2\)"):
        prepare_dataset(str(tmp_path / "v.npz"), str(tmp_path / "out"))


def test_digits_as_one_by_eight_by_eight_images(tmp_path):
    m = prepare_dataset("sklearn:digits?shape=1x8x8", str(tmp_path), shards=4)
    assert m.x.shape == [1, 8, 8] and m.x.dtype == "float32" and m.features == 64 and m.outputs == 10
    assert m.normalization.applied == "stored" and m.normalization.axis == "channel"
    xt, _ = stored(tmp_path, m.train)
    assert xt.shape[1:] == (1, 8, 8) and abs(float(xt.mean())) < 1e-4
    with pytest.raises(InvalidDataset, match="shape 2x8x8 does not hold its 64 features"):
        prepare_dataset("sklearn:digits?shape=2x8x8", str(tmp_path / "bad"))


def image_folder(root, sizes=((20, 14), (9, 9), (32, 24))) -> None:
    """Three classes of PNG and JPEG files of mixed sizes and modes, each class its own colour."""
    colours = {"cat": (200, 30, 30), "dog": (30, 200, 30), "owl": (30, 30, 200)}
    for name, colour in colours.items():
        (root / name).mkdir(parents=True)
        for i in range(6):
            size = sizes[i % len(sizes)]
            img = Image.new("RGB", size, colour)
            if i == 0:
                img = img.convert("L")  # a grayscale file among colour ones
            img.save(root / name / f"{i}.{'jpg' if i == 5 else 'png'}")


def test_image_folder_prepares_with_the_shape_kept(tmp_path):
    image_folder(tmp_path / "pets")
    (tmp_path / "pets" / "cat" / "notes.txt").write_text("not an image")
    m = prepare_dataset(str(tmp_path / "pets"), str(tmp_path / "out"), shards=2, options=SourceOptions(image_size=16))
    assert m.name == "pets" and m.outputs == 3 and m.task == "classification"
    assert m.x.shape == [3, 16, 16] and m.x.dtype == "uint8" and m.normalization.applied == "on_load"
    x, y = stored(tmp_path / "out", m.train)
    xv, yv = stored(tmp_path / "out", m.validation)
    x, y = np.concatenate([x, xv]), np.concatenate([y, yv])
    assert x.shape == (18, 3, 16, 16) and sorted(np.bincount(y)) == [6, 6, 6]
    # Classes in sorted folder order; an owl image is blue in its centre (a JPEG only roughly).
    owl = x[y == 2][:, :, 8, 8].astype(int)
    assert (owl[:, 2] > owl[:, 0] + 100).sum() >= 5
    gray = prepare_dataset(str(tmp_path / "pets"), str(tmp_path / "g"), options=SourceOptions(image_size=8, channels=1))
    assert gray.x.shape == [1, 8, 8] and stored(tmp_path / "g", gray.train)[0].shape[1:] == (1, 8, 8)


def test_image_folder_of_one_size_needs_no_size_and_mixed_sizes_do(tmp_path):
    image_folder(tmp_path / "same", sizes=((12, 10),))
    m = prepare_dataset(str(tmp_path / "same"), str(tmp_path / "out"))
    assert m.x.shape == [3, 10, 12]
    image_folder(tmp_path / "mixed")
    with pytest.raises(InvalidDataset, match=r"1.png: 9x9 pixels, the first image 20x14: pass --image-size"):
        prepare_dataset(str(tmp_path / "mixed"), str(tmp_path / "m"))


def test_webp_bmp_and_tiff_images_are_read_like_png(tmp_path):
    for name, colour in (("red", (220, 20, 20)), ("blue", (20, 20, 220))):
        (tmp_path / "pics" / name).mkdir(parents=True)
        for ext in ("png", "webp", "bmp", "tif", "tiff"):
            Image.new("RGB", (8, 8), colour).save(tmp_path / "pics" / name / f"a.{ext}")
    m = prepare_dataset(str(tmp_path / "pics"), str(tmp_path / "out"), shards=2)
    x, y = (np.concatenate(a) for a in zip(stored(tmp_path / "out", m.train), stored(tmp_path / "out", m.validation)))
    assert len(x) == 10 and m.classes == ["blue", "red"]
    assert (x[y == 1][:, 0].mean(axis=(1, 2)) > 200).all() and (x[y == 0][:, 2].mean(axis=(1, 2)) > 200).all()


def test_sixteen_bit_grayscale_images_keep_their_levels_in_eight_bits(tmp_path):
    # PIL's own conversion of a 16-bit PNG clips every value above 255 to white.
    for name, level in (("dark", 8000), ("bright", 50000)):
        (tmp_path / "scans" / name).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(np.full((6, 6), level + 100 * i, np.uint16)).save(tmp_path / "scans" / name / f"{i}.png")
    assert Image.open(tmp_path / "scans" / "dark" / "0.png").mode.startswith("I")
    for channels in (1, 3):
        m = prepare_dataset(
            str(tmp_path / "scans"), str(tmp_path / f"out{channels}"), options=SourceOptions(channels=channels)
        )
        x, y = (
            np.concatenate(a)
            for a in zip(
                stored(tmp_path / f"out{channels}", m.train), stored(tmp_path / f"out{channels}", m.validation)
            )
        )
        means = {m.classes[k]: float(x[y == k].mean()) for k in (0, 1)}
        assert means["bright"] == pytest.approx((50000 + 200) / 257, abs=1) and means["dark"] == pytest.approx(
            (8000 + 200) / 257, abs=1
        )


def test_a_phone_photo_is_read_upright_as_its_exif_orientation_says(tmp_path):
    # Stored as landscape pixels, dark left half, with orientation 6 ("rotate 90 degrees clockwise
    # to show"): shown, the photo is portrait with the dark half on top.
    stored_pixels = np.full((8, 16), 240, np.uint8)
    stored_pixels[:, :8] = 10
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    for name in ("up", "other"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(stored_pixels).save(tmp_path / "photos" / name / f"{i}.jpg", exif=exif, quality=95)
    x, _, _, _ = read_image_folder(tmp_path / "photos", None, 1)
    assert x.shape[2:] == (16, 8)  # (H, W): portrait
    assert x[:, 0, :8].mean() < 40 and x[:, 0, 8:].mean() > 200


def test_a_bad_image_is_left_out_and_named(tmp_path, caplog):
    # More cases (and the refusals) in test_unreadable_images.py.
    image_folder(tmp_path / "pets")
    (tmp_path / "pets" / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with caplog.at_level(logging.WARNING, logger="smlt.notice"):
        m = prepare_dataset(str(tmp_path / "pets"), str(tmp_path / "out"), options=SourceOptions(image_size=8))
    assert m.train.rows + m.validation.rows == 18
    assert "pets: 1 of 19 images is unreadable (dog/broken.png: cannot identify image file): left out" in caplog.text


def test_a_prepared_folder_is_not_an_image_folder(tmp_path):
    prepared = tmp_path / "ds"
    prepare_dataset("sklearn:iris", str(prepared), shards=2)
    with pytest.raises(InvalidDataset, match="is a prepared dataset"):
        prepare_dataset(str(prepared), str(tmp_path / "again"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidDataset, match="images per class, or the parts of one table .*; it holds nothing"):
        prepare_dataset(str(tmp_path / "empty"), str(tmp_path / "out"))


@pytest.mark.parametrize(
    "source, shown",
    [
        ("sklearn:digits?shape=1x8x8", "1x8x8 float32"),
        ("synthetic:images?rows=60&size=32&channels=3&classes=3", "3x32x32 uint8"),
        ("synthetic:tokens?rows=60&length=64&vocab=1000&classes=4", "64 int64 tokens, vocab 1000"),
        ("sklearn:iris", "4 float32 features"),
    ],
)
def test_data_prepare_prints_the_sample_shape_and_dtype(tmp_path, capsys, source, shown):
    assert main(["data", "prepare", source, "--out", str(tmp_path / "out"), "--shards", "2"]) == 0
    assert shown in capsys.readouterr().out


def test_data_prepare_takes_the_image_options(tmp_path, capsys):
    image_folder(tmp_path / "pets")
    argv = ["data", "prepare", str(tmp_path / "pets"), "--image-size", "32", "--channels", "1", "--out"]
    assert main([*argv, str(tmp_path / "out")]) == 0
    assert "1x32x32 uint8" in capsys.readouterr().out


def test_npz_labels_as_text_are_classes(tmp_path):
    np.savez(tmp_path / "t.npz", x=np.zeros((30, 2), np.float32), y=np.array(["cat", "dog", "owl"] * 10))
    m = prepare_dataset(str(tmp_path / "t.npz"), str(tmp_path / "out"), shards=2)
    assert m.task == "classification" and m.outputs == 3 and m.y.dtype == "int64"


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_one_hot_labels_are_classes_unless_the_task_says_regression(tmp_path, dtype, caplog):
    import logging

    k = np.arange(30) % 3
    np.savez(tmp_path / "h.npz", x=np.random.default_rng(5).normal(size=(30, 2)), y=np.eye(3, dtype=dtype)[k])
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(tmp_path / "h.npz"), str(tmp_path / "out"), shards=2)
    assert m.task == "classification" and m.outputs == 3 and m.classes == ["0", "1", "2"]
    assert "h.npz: y of shape (30, 3) is one-hot: read as 3 classes (its argmax per row)" in caplog.text
    _, y = stored(tmp_path / "out", m.train)
    assert set(y.tolist()) == {0, 1, 2}
    r = prepare_dataset(
        str(tmp_path / "h.npz"), str(tmp_path / "r"), shards=2, options=SourceOptions(task="regression")
    )
    assert r.task == "regression" and r.outputs == 3


def test_a_scikit_learn_dataset_names_its_classes_as_scikit_learn_does(tmp_path):
    iris = prepare_dataset("sklearn:iris", str(tmp_path / "iris"), shards=2)
    assert iris.classes == ["setosa", "versicolor", "virginica"]
    # the class index stays scikit-learn's target: 0 is malignant
    cancer = prepare_dataset("sklearn:breast_cancer", str(tmp_path / "bc"), shards=2)
    assert cancer.classes == ["malignant", "benign"]
    assert prepare_dataset("sklearn:digits", str(tmp_path / "d"), shards=2).classes == [str(i) for i in range(10)]
