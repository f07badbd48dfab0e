"""An image folder as a dataset: one subfolder per class holding image files (PNG, JPEG, WebP, BMP,
TIFF), read with Pillow, turned upright as their EXIF orientation says, resized to one size and
stored as uint8 (N, C, H, W) (16-bit grayscale scaled to 8 bits). A folder split already, as
torchvision's ImageFolder layouts and Kaggle's come (`train/` and `val/` or `test/`, each of class
subfolders), keeps its split (`split_folders`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from smlt.runtime.errors import InvalidDataset

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
IMAGE_KINDS = "PNG, JPEG, WebP, BMP or TIFF"  # what IMAGE_SUFFIXES are, for messages
SHOW_SKIPPED = 10  # skipped files named in the notice; the rest are counted


# Subfolder names of a folder split already: its train split, and its validation split (the first
# of these found; a `test/` beside a `val/` is left out, with a word).
TRAIN_NAMES = ("train", "training")
VALIDATION_NAMES = ("val", "valid", "validation", "test")


def split_folders(path: Path) -> tuple[Path, Path, list[Path]] | None:
    """(train folder, validation folder, folders left out) when every subfolder of `path` is a
    split's name (train/ and val/, valid/, validation/ or test/) and the train folder holds class
    subfolders; else None (its subfolders are classes)."""
    dirs = {p.name.lower(): p for p in _class_dirs(path)}
    train = next((dirs[n] for n in TRAIN_NAMES if n in dirs), None)
    found = [dirs[n] for n in VALIDATION_NAMES if n in dirs]
    if train is None or not found or set(dirs) - set(TRAIN_NAMES) - set(VALIDATION_NAMES):
        return None
    if not any(_class_dirs(train)):
        return None
    return train, found[0], found[1:]


def is_image_folder(path: Path) -> bool:
    """A folder of class subfolders (and no manifest.json: that is a prepared dataset)."""
    return path.is_dir() and not (path / "manifest.json").exists() and any(_class_dirs(path))


def _class_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def image_files(path: Path) -> list[tuple[Path, int]]:
    """(file, class index) for every image, classes in sorted subfolder order, files in name order."""
    files: list[tuple[Path, int]] = []
    skipped: list[str] = []
    for label, folder in enumerate(_class_dirs(path)):
        found = 0
        for f in sorted(folder.iterdir()):
            if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES:
                files.append((f, label))
                found += 1
            elif not f.name.startswith("."):
                skipped.append(f.relative_to(path).as_posix() + ("/" if f.is_dir() else ""))
        if not found:
            raise InvalidDataset(f"{folder}: class folder holds no {IMAGE_KINDS} image")
    if skipped:
        from smlt.runtime.progress import notice  # local-only (not in the Lambda layer), as preparing is

        shown = ", ".join(skipped[:SHOW_SKIPPED]) + (
            f" and {len(skipped) - SHOW_SKIPPED} more" if len(skipped) > SHOW_SKIPPED else ""
        )
        one = len(skipped) == 1
        notice.info(
            f"{path}: skipped {len(skipped)} {'file that is not an image' if one else 'files that are not images'} "
            f"({IMAGE_KINDS}): {shown}"
        )
    return files


def read_image_folder(
    path: Path, size: int | None, channels: int | None
) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray | None]:
    """(x uint8 (N, C, size, size), y class indices, class names, and for a folder split already
    (`split_folders`) which rows are its validation split, else None). Without `size` every image
    must already have the first one's size."""
    split = split_folders(path)
    if split is None:
        classes = [p.name for p in _class_dirs(path)]
        if len(classes) < 2:
            raise InvalidDataset(f"{path}: an image folder needs at least 2 class subfolders, found {classes}")
        files, validation = image_files(path), None
    else:
        files, classes, validation = _split_files(path, *split)
    mode = "L" if channels == 1 else "RGB"
    first = _open(files[0][0], mode, None)
    want = (size, size) if size else first.shape[:2][::-1]
    x = np.empty((len(files), 1 if mode == "L" else 3, want[1], want[0]), np.uint8)
    for i, (f, _) in enumerate(files):
        x[i] = _as_chw(_open(f, mode, want if size else None), want, f)
    return x, np.array([label for _, label in files], np.int64), classes, validation


def _split_files(
    path: Path, train: Path, val: Path, left: list[Path]
) -> tuple[list[tuple[Path, int]], list[str], np.ndarray]:
    """The files of a folder split already, the train split's classes, where the validation rows are."""
    from smlt.runtime.progress import notice

    classes = [p.name for p in _class_dirs(train)]
    if len(classes) < 2:
        raise InvalidDataset(f"{train}: an image folder needs at least 2 class subfolders, found {classes}")
    unknown = sorted({p.name for p in _class_dirs(val)} - set(classes))
    if unknown:
        raise InvalidDataset(
            f"{val}: class folder {unknown[0]!r} is not among {train.name}/'s classes ({', '.join(classes)}): "
            "a validation class the model never trains on; add its images to the train folder or remove it"
        )
    index = {c: i for i, c in enumerate(classes)}
    files = image_files(train)
    val_classes = [p.name for p in _class_dirs(val)]
    held = [(f, index[val_classes[i]]) for f, i in image_files(val)]
    notice.info(
        f"{path}: split already: {train.name}/ ({len(files):,} images) is the train split and {val.name}/ "
        f"({len(held):,}) the validation split (--validation-fraction not used)"
        + (f"; {', '.join(p.name + '/' for p in left)} left out" if left else "")
    )
    validation = np.zeros(len(files) + len(held), bool)
    validation[len(files) :] = True
    return files + held, classes, validation


def _open(f: Path, mode: str, size: tuple[int, int] | None) -> np.ndarray:
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(f) as img:
            # a camera stores a portrait photo as landscape pixels plus an orientation tag: what
            # a viewer shows (and what a model serving the photo should see) is the tag applied
            upright = ImageOps.exif_transpose(img)
            pixels = _eight_bit(upright).convert(mode)
            if size is not None and pixels.size != size:
                pixels = pixels.resize(size, Image.Resampling.BILINEAR)
            return np.asarray(pixels, np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise InvalidDataset(f"{f}: not a readable {IMAGE_KINDS} image ({e})") from None


def _eight_bit(img: Any) -> Any:
    """A 16-bit grayscale image (PIL modes I;16* and I) as 8 bits, value / 257 (65535 -> 255), the
    same scale for every image: PIL's own conversion clips such values at 255 (white)."""
    if not (img.mode.startswith("I;16") or img.mode == "I"):
        return img
    from PIL import Image

    a = np.asarray(img, dtype=np.float64)
    return Image.fromarray(np.clip(np.rint(a / 257), 0, 255).astype(np.uint8), "L")


def _as_chw(pixels: np.ndarray, want: tuple[int, int], f: Path) -> np.ndarray:
    if pixels.shape[:2] != (want[1], want[0]):
        raise InvalidDataset(
            f"{f}: {pixels.shape[1]}x{pixels.shape[0]} pixels, the first image {want[0]}x{want[1]}: "
            "pass --image-size (or the job's dataset.image_size) to resize them all"
        )
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
