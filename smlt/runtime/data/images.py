"""An image folder as a dataset: one subfolder per class holding image files (PNG, JPEG, GIF, WebP, AVIF, BMP,
TIFF), read with Pillow, turned upright as their EXIF orientation says, resized to one size and
stored as uint8 (N, C, H, W) (16-bit grayscale scaled to 8 bits). A folder split already, as
torchvision's ImageFolder layouts and Kaggle's come (`train/` and `val/` or `test/`, each of class
subfolders), keeps its split (`split_folders`).

An image Pillow cannot read (a truncated JPEG, a 0-byte file, an HTML page saved as .jpg: common in
scraped datasets) is left out, as fastai's `verify_images` leaves it, with one warning that counts
them and names the first few with Pillow's reason (`read_images`, `unreadable_notice`); the rows
left are prepared exactly as the folder without those files would be. Refused instead: a class
folder left with no readable image, or more than half of a folder's images unreadable (the wrong
folder, or files of another format under an image's name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from smlt.runtime.errors import InvalidDataset

# `.jfif` and `.jpe`: JPEG as Windows' browsers save one; AVIF: what Pillow reads since 11.3.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".jfif", ".jpe", ".gif", ".webp", ".avif", ".bmp", ".tif", ".tiff")
IMAGE_KINDS = "PNG, JPEG, GIF, WebP, AVIF, BMP or TIFF"  # what IMAGE_SUFFIXES are, for messages
# An iPhone's photos (HEIC, HEIF), which Pillow does not read: named, with how to get JPEGs.
HEIC_SUFFIXES = (".heic", ".heif")
HEIC_TODO = (
    "HEIC photos (an iPhone's) are not read: convert them to JPEG (on a Mac `sips -s format jpeg IMG.HEIC --out "
    "IMG.jpg`; an iPhone set to Settings > Camera > Formats > Most Compatible takes JPEGs)"
)
SHOW_SKIPPED = 10  # skipped files named in the notice; the rest are counted
UNREADABLE_SHOWN = 3  # unreadable images named (with Pillow's reason) where they are told; the rest counted
# More than this share of a folder's images unreadable is refused, not left out: likely the wrong
# folder, or files of another format under an image's name.
UNREADABLE_REFUSED = 0.5


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
    """(file, class index) for every image, classes in sorted subfolder order, files in name order.
    A class folder's subfolders are read as part of its class (`cat/siamese/1.jpg` is a `cat`), as
    torchvision's ImageFolder and Keras' image_dataset_from_directory read them; dot-files and
    folders (`.ipynb_checkpoints/`, `.DS_Store`) and what Windows and macOS leave in a folder
    (`Thumbs.db`, `desktop.ini`, `__MACOSX/`) are passed over without a word."""
    files: list[tuple[Path, int]] = []
    skipped: list[str] = []
    nested: dict[str, int] = {}  # a class folder's subfolder holding images: how many
    for label, folder in enumerate(_class_dirs(path)):
        found = 0
        for f in _walk(folder):
            if f.suffix.lower() in IMAGE_SUFFIXES:
                files.append((f, label))
                found += 1
                if f.parent != folder:
                    key = f.parent.relative_to(path).as_posix() + "/"
                    nested[key] = nested.get(key, 0) + 1
            else:
                skipped.append(f.relative_to(path).as_posix())
        if not found:
            heic = any(f.suffix.lower() in HEIC_SUFFIXES for f in _walk(folder))
            raise InvalidDataset(
                f"{folder}: class folder holds no {IMAGE_KINDS} image" + (f"; {HEIC_TODO}" if heic else "")
            )
    from smlt.runtime.progress import notice  # local-only (not in the Lambda layer), as preparing is

    if nested:
        shown = ", ".join(f"{k} {n:,}" for k, n in list(nested.items())[:SHOW_SKIPPED]) + (
            f" and {len(nested) - SHOW_SKIPPED} more" if len(nested) > SHOW_SKIPPED else ""
        )
        notice.info(
            f"{path}: {sum(nested.values()):,} images in subfolders of class folders are read as the class "
            f"folder's class ({shown}), as torchvision's ImageFolder reads them; to learn the subfolders as "
            "classes of their own, make them class folders at the top"
        )
    if skipped:
        shown = ", ".join(skipped[:SHOW_SKIPPED]) + (
            f" and {len(skipped) - SHOW_SKIPPED} more" if len(skipped) > SHOW_SKIPPED else ""
        )
        one = len(skipped) == 1
        heic = any(Path(f).suffix.lower() in HEIC_SUFFIXES for f in skipped)
        notice.info(
            f"{path}: skipped {len(skipped)} {'file that is not an image' if one else 'files that are not images'} "
            f"({IMAGE_KINDS}): {shown}" + (f"; {HEIC_TODO}" if heic else "")
        )
    return files


def _refuse_stray_splits(path: Path) -> None:
    """A split's folder of class folders (`train/cat/`) beside a folder that is no split's name: a
    split layout gone wrong, whose split folders would otherwise be read as classes `train` and `val`."""
    names = TRAIN_NAMES + VALIDATION_NAMES
    splits = [p for p in _class_dirs(path) if p.name.lower() in names and any(_class_dirs(p))]
    if splits:
        others = [p.name + "/" for p in _class_dirs(path) if p.name.lower() not in names]
        raise InvalidDataset(
            f"{splits[0]}: holds class folders as a split of a folder split already does, beside "
            f"{', '.join(others[:3]) or 'no train/ or no val/'}{', ...' if len(others) > 3 else ''}: a folder split "
            f"already holds train/ and val/ (valid/, validation/ or test/) only, each of class folders; "
            "move the other folders into them, or make every subfolder a class folder of images"
        )


# What operating systems leave in a folder a person copies (Windows' thumbnail cache and folder
# settings, macOS's resource forks in a zip): not data, passed over without a word.
SYSTEM_FILES = {"thumbs.db", "desktop.ini", "__macosx", "ehthumbs.db"}


def _walk(folder: Path) -> list[Path]:
    """The files under `folder`, its subfolders' too, in name order (a folder's files before its
    subfolders'), without dot-files and folders or SYSTEM_FILES."""
    out: list[Path] = []
    subfolders: list[Path] = []
    for f in sorted(folder.iterdir()):
        if f.name.startswith(".") or f.name.lower() in SYSTEM_FILES:
            continue
        if f.is_dir():
            subfolders.append(f)
        elif f.is_file():
            out.append(f)
    for sub in subfolders:
        out.extend(_walk(sub))
    return out


def read_image_folder(
    path: Path, size: int | None, channels: int | None
) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray | None]:
    """(x uint8 (N, C, size, size), y class indices, class names, and for a folder split already
    (`split_folders`) which rows are its validation split, else None). Without `size` every image
    must already have the first readable one's size. Unreadable images are left out with a warning
    (`refuse_unreadable` first)."""
    split = split_folders(path)
    if split is None:
        classes = [p.name for p in _class_dirs(path)]
        if len(classes) < 2:
            inner = _class_dirs(path / classes[0]) if classes else []
            wrapped = (
                f": {classes[0]}/ holds the class folders ({', '.join(p.name + '/' for p in inner[:5])}"
                f"{', ...' if len(inner) > 5 else ''}), so prepare {path / classes[0]}"
                if len(inner) >= 2
                else ""
            )
            raise InvalidDataset(f"{path}: an image folder needs at least 2 class subfolders, found {classes}{wrapped}")
        _refuse_stray_splits(path)
        files, validation = image_files(path), None
    else:
        files, classes, validation = _split_files(path, *split)
    mode = "L" if channels == 1 else "RGB"
    x, kept, unreadable = read_images([f for f, _ in files], mode, (size, size) if size else None)
    y = np.array([label for _, label in files], np.int64)
    if unreadable:
        refuse_unreadable(path, [f for f, _ in files], unreadable)
        y = y[kept]
        validation = None if validation is None else validation[kept]
    if split is not None and validation is not None:
        from smlt.runtime.progress import notice  # local-only (not in the Lambda layer), as preparing is

        train, val, left = split
        notice.info(
            f"{path}: split already: {train.name}/ ({int((~validation).sum()):,} images) is the train split and "
            f"{val.name}/ ({int(validation.sum()):,}) the validation split (--validation-fraction not used)"
            + (f"; {', '.join(p.name + '/' for p in left)} left out" if left else "")
        )
    if unreadable:
        from smlt.runtime.progress import notice

        notice.warning(unreadable_notice(path, len(files), unreadable, "left out of training and validation"))
    return x, y, classes, validation


def read_images(
    files: list[Path], mode: str, size: tuple[int, int] | None
) -> tuple[np.ndarray, np.ndarray, list[tuple[Path, str]]]:
    """The readable `files` as uint8 (n, C, H, W) in their order, resized to `size` (width,
    height) when given, else each the first readable one's size; which of `files` they are
    (indices); and the unreadable ones with Pillow's reason."""
    want = size
    x: np.ndarray | None = None
    kept: list[int] = []
    unreadable: list[tuple[Path, str]] = []
    for i, f in enumerate(files):
        pixels = _decode(f, mode, size)
        if isinstance(pixels, str):
            unreadable.append((f, pixels))
            continue
        if x is None:
            want = want or (pixels.shape[1], pixels.shape[0])
            x = np.empty((len(files) - len(unreadable), 1 if mode == "L" else 3, want[1], want[0]), np.uint8)
        assert want is not None
        x[len(kept)] = _as_chw(pixels, want, f)
        kept.append(i)
    if x is None:
        x = np.empty((0, 1 if mode == "L" else 3, *(want[::-1] if want else (0, 0))), np.uint8)
    return x[: len(kept)], np.array(kept, np.int64), unreadable


def unreadable_notice(root: Path, total: int, unreadable: list[tuple[Path, str]], then: str) -> str:
    """`pets: 3 of 20,000 images are unreadable (cat/05.jpg: image file is truncated; ...): THEN`."""
    n = len(unreadable)
    are = "is" if n == 1 else "are"
    return f"{root}: {n:,} of {total:,} images {are} unreadable ({_named(root, unreadable)}): {then}"


def refuse_unreadable(root: Path, files: list[Path], unreadable: list[tuple[Path, str]]) -> None:
    """InvalidDataset when more than half of an image folder's `files` are unreadable, or a class
    folder is left with no readable image: leaving them out would train on the wrong data."""
    if len(unreadable) > UNREADABLE_REFUSED * len(files):
        raise InvalidDataset(
            unreadable_notice(root, len(files), unreadable, "more than half")
            + f", so this is likely the wrong folder or files that are not {IMAGE_KINDS} images under an image's "
            "name; check the folder (when at most half are unreadable, they are left out with a warning)"
        )
    bad = {f for f, _ in unreadable}
    folders: dict[Path, list[bool]] = {}
    for f in files:
        folders.setdefault(f.parent, []).append(f in bad)
    empty = [folder for folder, broken in folders.items() if all(broken)]
    if empty:
        first = [(f, why) for f, why in unreadable if f.parent == empty[0]]
        others = f" (and {len(empty) - 1} more class folder{'s' if len(empty) > 2 else ''})" if len(empty) > 1 else ""
        raise InvalidDataset(
            f"{empty[0]}: class folder holds no readable image{others}: all {len(first):,} "
            f"{'is' if len(first) == 1 else 'are'} unreadable ({_named(empty[0], first)}); replace them with "
            f"readable {IMAGE_KINDS} images, or remove the class folder"
        )


def _named(root: Path, unreadable: list[tuple[Path, str]]) -> str:
    """The first few unreadable images, relative to `root`, each with its reason."""
    shown = [
        f"{f.relative_to(root).as_posix() if f.is_relative_to(root) else f}: {why}"
        for f, why in unreadable[:UNREADABLE_SHOWN]
    ]
    return "; ".join(shown) + ("; ..." if len(unreadable) > UNREADABLE_SHOWN else "")


def _split_files(
    path: Path, train: Path, val: Path, left: list[Path]
) -> tuple[list[tuple[Path, int]], list[str], np.ndarray]:
    """The files of a folder split already, the train split's classes, where the validation rows are."""
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
    validation = np.zeros(len(files) + len(held), bool)
    validation[len(files) :] = True
    return files + held, classes, validation


def _open(f: Path, mode: str, size: tuple[int, int] | None) -> np.ndarray:
    """One image's pixels, or InvalidDataset naming it and Pillow's reason."""
    pixels = _decode(f, mode, size)
    if isinstance(pixels, str):
        raise InvalidDataset(f"{f}: not a readable {IMAGE_KINDS} image ({pixels})")
    return pixels


def _decode(f: Path, mode: str, size: tuple[int, int] | None) -> np.ndarray | str:
    """One image's pixels (H, W) or (H, W, 3), upright and resized to `size` when given; or why
    Pillow cannot read it (a truncated file, 0 bytes, another format under an image's name)."""
    from PIL import Image, ImageOps

    try:
        with Image.open(f) as img:
            if img.mode == "F":
                _refuse_float(f, img)
            # a camera stores a portrait photo as landscape pixels plus an orientation tag: what
            # a viewer shows (and what a model serving the photo should see) is the tag applied
            upright = ImageOps.exif_transpose(img)
            pixels = _eight_bit(upright).convert(mode)
            if size is not None and pixels.size != size:
                pixels = pixels.resize(size, Image.Resampling.BILINEAR)
            return np.asarray(pixels, np.uint8)
    except (MemoryError, InvalidDataset):
        raise
    except Exception as e:  # a corrupt file fails in many ways (OSError, SyntaxError, struct.error, ...)
        return _reason(f, e)


def _refuse_float(f: Path, img: Any) -> None:
    """A 32-bit floating-point image (a TIFF of mode F: microscopy, satellite bands, depth maps) has no
    one 8-bit scale (0-1, 0-255, metres?): converted as 8 bits every pixel would round to 0 or 1."""
    a = np.asarray(img, dtype=np.float64)
    lo, hi = (float(np.nanmin(a)), float(np.nanmax(a))) if a.size else (0.0, 0.0)
    raise InvalidDataset(
        f"{f}: a 32-bit floating-point image (values {lo:g} to {hi:g}), which has no one scale to 8 bits, as smlt "
        "stores images: save the images as 8- or 16-bit PNG or TIFF scaled as they are meant, or their pixels as an "
        ".npz of float arrays (x of shape (N, H, W), y the labels), stored as float32 and standardised"
    )


def _reason(f: Path, e: Exception) -> str:
    """Pillow's reason an image is unreadable, without the file's name (it is said beside it)."""
    try:
        with open(f, "rb") as file:
            head: bytes | None = file.read(64)
    except OSError:
        head = None
    if head == b"":
        return "0 bytes"
    said = str(e)
    for name in (repr(str(f)), repr(f), str(f)):
        said = said.replace(f" {name}", "")
    said = said.strip().rstrip(":") or type(e).__name__
    if not isinstance(e, (OSError, ValueError)):
        said = f"{type(e).__name__}: {said}"
    if head is not None and head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        said += ", an HTML page"
    return said


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
