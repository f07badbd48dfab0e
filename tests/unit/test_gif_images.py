"""GIF files are images of an image folder (scraped and older datasets hold them): each read as
its first frame, in RGB as Pillow converts it, at prepare and at predict alike; a palette with a
transparent colour prints no Pillow warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image

from smlt.runtime.data.images import read_image_folder
from smlt.runtime.data.prepare import prepare_dataset
from tests.unit.untrained import load_folder, run_folder, untrained


def _gif(path: Path, colour: tuple[int, int, int], seed: int, frames: int = 1, transparent: bool = False) -> None:
    rng = np.random.default_rng(seed)
    shots = [
        Image.fromarray(np.clip(np.array(colour) + rng.normal(0, 20, (12, 12, 3)), 0, 255).astype(np.uint8))
        for _ in range(frames)
    ]
    extra = {"transparency": 0} if transparent else {}
    shots[0].save(path, save_all=frames > 1, append_images=shots[1:], **extra)


def test_gif_images_are_read_as_their_first_frame_at_prepare_and_predict(tmp_path: Path) -> None:
    root = tmp_path / "pets"
    for cls, colour in {"cat": (200, 50, 50), "dog": (50, 50, 200)}.items():
        (root / cls).mkdir(parents=True)
        for i in range(4):
            _gif(root / cls / f"{i}.gif", colour, seed=i, frames=3 if i == 0 else 1, transparent=i == 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's palette-transparency warning would reach the user
        x, y, classes, _ = read_image_folder(root, None, None)
    assert classes == ["cat", "dog"] and x.shape == (8, 3, 12, 12) and list(y) == [0] * 4 + [1] * 4
    with Image.open(root / "cat" / "0.gif") as first:  # an animated GIF: its first frame
        want = np.asarray(first.convert("RGB"), np.uint8).transpose(2, 0, 1)
    assert np.array_equal(x[0], want)
    assert x[:4, 0].mean() > x[:4, 2].mean() and x[4:, 2].mean() > x[4:, 0].mean()  # the colours survive
    m = prepare_dataset(str(root), str(tmp_path / "prepared"), shards=1)
    model = load_folder(run_folder(tmp_path / "run", *untrained(m, "lenet", tmp_path / "prepared")))
    folder = model.predict(root)  # predict takes GIF files too, in a folder or alone
    assert len(folder) == 8 and folder.ids[0].endswith("cat/0.gif")
    alone = model.predict(root / "dog" / "2.gif")
    assert np.allclose(alone.probability, folder.probability[6:7])
