"""A dataset that arrives as an archive (smlt.runtime.data.archives): a zip of an image folder as
Kaggle's come (one wrapping folder, macOS' `__MACOSX/` and `.DS_Store` beside it), a tar of a CSV
(gzip, bzip2, xz), a zip of a table's parts, each prepared exactly as the folder or file it holds;
and the archives refused by name (archive and member), nothing extracted left behind."""

from __future__ import annotations

import io
import logging
import tarfile
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load

from smlt.cli import main
from smlt.datasets import local_dataset_folder
from smlt.runtime.data import archives
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.job import DatasetSpec
from tests.unit.test_image_splits import _images

CSV = "size,rooms,label\n" + "".join(f"{i},{i % 5},{'yes' if (i * 7) % 3 else 'no'}\n" for i in range(120))


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("SMLT_HOME", str(tmp_path / "home"))


def _zip_folder(folder: Path, archive: Path, *, wrap: bool = True, noise: bool = True) -> Path:
    """`folder` zipped as Finder zips it: under its own name, with __MACOSX/ resource forks and a .DS_Store."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(folder.rglob("*")):
            name = (f.relative_to(folder.parent) if wrap else f.relative_to(folder)).as_posix()
            if f.is_dir():
                z.writestr(name + "/", b"")
                continue
            z.write(f, name)
            if noise:
                z.writestr(f"__MACOSX/{Path(name).parent}/._{f.name}", b"\0\5\26\7 resource fork")
        if noise:
            z.writestr(f"{folder.name}/.DS_Store" if wrap else ".DS_Store", b"Bud1 finder")
            z.writestr(f"{folder.name}/Thumbs.db" if wrap else "Thumbs.db", b"windows")
    return archive


def _tar(archive: Path, files: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(archive, mode) as t:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
    return archive


def _zip(archive: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for name, body in files.items():
            z.writestr(name, body)
    return archive


def _shards(folder: Path) -> dict[str, np.ndarray]:
    return {f"{p.name}/{k}": v for p in sorted(folder.glob("*.safetensors")) for k, v in load(p.read_bytes()).items()}


def _no_extraction_left() -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob("smlt-archive-*"))


def test_a_finder_zip_of_an_image_folder_prepares_as_the_folder(tmp_path, caplog):
    _images(tmp_path / "pets", {"cat": 6, "dog": 5}, shade=1)
    (tmp_path / "pets" / "cat" / ".DS_Store").write_bytes(b"Bud1")  # a folder's own dot-file, as the zip's
    archive = _zip_folder(tmp_path / "pets", tmp_path / "pets-kaggle.zip")
    before = set(_no_extraction_left())

    folder = prepare_dataset(str(tmp_path / "pets"), str(tmp_path / "from-folder"), shards=2)
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        zipped = prepare_dataset(str(archive), str(tmp_path / "from-zip"), shards=2)

    assert zipped.name == "pets-kaggle" and zipped.source == str(archive)
    assert zipped.classes == folder.classes == ["cat", "dog"]  # no __MACOSX class, no Thumbs.db image
    assert (zipped.train.rows, zipped.validation.rows) == (folder.train.rows, folder.validation.rows)
    a, b = _shards(tmp_path / "from-folder"), _shards(tmp_path / "from-zip")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert "smlt-archive-" not in caplog.text
    assert set(_no_extraction_left()) == before  # the extraction is removed


def test_a_zip_split_already_without_a_wrapping_folder_keeps_its_split(tmp_path, caplog):
    _images(tmp_path / "pets" / "train", {"cat": 6, "dog": 6}, shade=1)
    _images(tmp_path / "pets" / "val", {"cat": 2, "dog": 3}, shade=2)
    archive = _zip_folder(tmp_path / "pets", tmp_path / "pets.zip", wrap=False)
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(archive), str(tmp_path / "out"), shards=2)
    assert (m.train.rows, m.validation.rows) == (12, 5)
    assert f"{archive}: split already: train/ (12 images)" in caplog.text  # named inside the archive


@pytest.mark.parametrize(
    ("suffix", "mode"),
    [(".tar.gz", "w:gz"), (".tgz", "w:gz"), (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz"), (".tar", "w")],
)
def test_a_tar_of_a_csv_prepares_as_the_csv(tmp_path, suffix, mode):
    (tmp_path / "houses.csv").write_text(CSV)
    archive = _tar(tmp_path / f"houses{suffix}", {"export/houses.csv": CSV.encode()}, mode)
    plain = prepare_dataset(str(tmp_path / "houses.csv"), str(tmp_path / "plain"), shards=2)
    packed = prepare_dataset(str(archive), str(tmp_path / "packed"), shards=2)
    assert packed.name == "houses" and packed.label == plain.label == "label"
    assert packed.columns == plain.columns and packed.normalization == plain.normalization
    a, b = _shards(tmp_path / "plain"), _shards(tmp_path / "packed")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_zip_of_a_tables_parts_is_prepared_part_by_part_and_two_tables_are_refused(tmp_path):
    head, rows = CSV.split("\n", 1)
    lines = rows.splitlines(keepends=True)
    parts = {"part-00000.csv": head + "\n" + "".join(lines[:60]), "part-00001.csv": head + "\n" + "".join(lines[60:])}
    archive = _zip(tmp_path / "spark.zip", {f"out/{n}": b.encode() for n, b in parts.items()} | {"out/_SUCCESS": b""})
    for name, body in parts.items():
        (tmp_path / "out" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "out" / name).write_text(body)
    m = prepare_dataset(str(archive), str(tmp_path / "parts"), shards=2)
    folder = prepare_dataset(str(tmp_path / "out"), str(tmp_path / "folder"), shards=2)
    assert m.train.rows + m.validation.rows == 120 and m.name == "spark" and m.columns == folder.columns
    a, b = _shards(tmp_path / "folder"), _shards(tmp_path / "parts")
    assert len(a) > 3 and a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    two = _zip(tmp_path / "two.zip", {"houses.csv": CSV.encode(), "prices.csv": b"city,price\nx,1\ny,2\n"})
    with pytest.raises(InvalidDataset, match=rf"{tmp_path}/two\.zip/prices\.csv.*columns") as e:
        prepare_dataset(str(two), str(tmp_path / "two"))
    assert "smlt-archive-" not in str(e.value)
    mixed = _zip(tmp_path / "mixed.zip", {"houses.csv": CSV.encode(), "readme.pdf": b"%PDF"})
    with pytest.raises(InvalidDataset, match=rf"^{tmp_path}/mixed\.zip: a folder is a source when .* readme\.pdf"):
        prepare_dataset(str(mixed), str(tmp_path / "mixed"))


def _cut(path: Path) -> Path:
    """The archive's first half, as an interrupted download leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _encrypted_zip(path: Path) -> Path:
    """A zip whose member is flagged encrypted (ZipCrypto: bit 0 of its flags in the local header
    and the central directory), as `zip -e` writes one."""
    blob = bytearray(_zip(path, {"houses.csv": CSV.encode()}).read_bytes())
    for signature, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        blob[blob.index(signature) + at] |= 0x1
    path.write_bytes(bytes(blob))
    return path


def _symlink_tar(path: Path) -> Path:
    with tarfile.open(path, "w") as t:
        info = tarfile.TarInfo("data/houses.csv")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    return path


REFUSED = {
    "empty.zip": (lambda p: _zip(p, {}), r"empty\.zip holds no data: archive the image folder"),
    "noise.zip": (
        lambda p: _zip(p, {"__MACOSX/._a.csv": b"x", ".DS_Store": b"x"}),
        r"noise\.zip holds no data \(2 files of .* or dot-files\)",
    ),
    "locked.zip": (_encrypted_zip, r"locked\.zip: member 'houses\.csv' is password-protected \(encrypted\): unzip it"),
    "cut.zip": (
        lambda p: _cut(_zip(p, {"houses.csv": CSV.encode() * 20})),
        r"cut\.zip: not a readable zip archive \(File is not a zip file\): it may be truncated",
    ),
    "cut.tar.gz": (
        lambda p: _cut(_tar(p, {"houses.csv": bytes(range(256)) * 400})),
        r"cut\.tar\.gz: not a readable tar archive \(.*\): it may be truncated",
    ),
    "cut.tar.xz": (
        lambda p: _cut(_tar(p, {"houses.csv": bytes(range(256)) * 400}, "w:xz")),
        r"cut\.tar\.xz: not a readable tar archive \(.*\): it may be truncated",
    ),
    "cut.tar.bz2": (
        lambda p: _cut(_tar(p, {"houses.csv": bytes(range(256)) * 400}, "w:bz2")),
        r"cut\.tar\.bz2: not a readable tar archive \(.*\): it may be truncated",
    ),
    "fake.tgz": (
        lambda p: p.write_bytes(b"<html>not found</html>") and p,
        r"fake\.tgz: not a readable tar archive \(not a gzip file\): it may be truncated",
    ),
    "nested.zip": (
        lambda p: _zip(p, {"data/inner.tar.gz": b"x", "data/a.csv": b"a\n"}),
        r"nested\.zip: member 'data/inner\.tar\.gz' is an archive inside the archive",
    ),
    "evil.tar": (
        lambda p: _tar(p, {"../../escaped.csv": CSV.encode()}, "w"),
        r"evil\.tar: member '\.\./\.\./escaped\.csv' points outside the archive",
    ),
    "evil.zip": (
        lambda p: _zip(p, {"/etc/cron.d/x.csv": CSV.encode()}),
        r"evil\.zip: member '/etc/cron\.d/x\.csv' points outside the archive",
    ),
    "link.tar": (_symlink_tar, r"link\.tar: member 'data/houses\.csv' is a link, which smlt never extracts"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_bad_archive_is_refused_by_name_and_nothing_is_extracted(tmp_path, name, capsys):
    make, said = REFUSED[name]
    archive = make(tmp_path / name)
    before = set(_no_extraction_left())
    with pytest.raises(archives.BadArchive, match=said):
        prepare_dataset(str(archive), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "escaped.csv").exists()
    assert set(_no_extraction_left()) == before
    # the CLI says the same, without a traceback
    assert main(["data", "prepare", str(archive), "--out", str(tmp_path / "cli")]) != 0
    err = capsys.readouterr().err
    assert "BadArchive" in err and name in err and "Traceback" not in err


def test_too_large_and_a_zip_bomb_are_refused_before_a_byte_is_written(tmp_path, monkeypatch):
    archive = _zip(tmp_path / "big.zip", {"houses.csv": CSV.encode(), "more/zeros.csv": b"0\n" * 50_000})
    monkeypatch.setattr(archives, "MAX_UNPACKED_BYTES", 10_000)
    with pytest.raises(
        archives.BadArchive,
        match=r"big\.zip unpacks to 0\.1 MB \(its largest member 'more/zeros\.csv', 0\.1 MB\), more than 10,000 bytes",
    ):
        prepare_dataset(str(archive), str(tmp_path / "out"))
    monkeypatch.setattr(archives, "MAX_UNPACKED_BYTES", 10**12)
    monkeypatch.setattr(archives, "RATIO_FLOOR", 1000)
    with pytest.raises(
        archives.BadArchive, match=r"big\.zip: member 'more/zeros\.csv' unpacks to [\d,]+ times its packed"
    ):
        prepare_dataset(str(archive), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    # a compressed tar is listed by reading it: a bomb is refused once its headers have told enough
    bomb = _tar(tmp_path / "bomb.tar.bz2", {f"zeros-{i}.csv": b"0" * 200_000 for i in range(20)}, "w:bz2")
    monkeypatch.setattr(archives, "RATIO_FLOOR", 300_000)
    with pytest.raises(
        archives.BadArchive, match=r"bomb\.tar\.bz2 unpacks to [\d,]+ times its bytes \(0\.4 MB in 2 members"
    ):
        prepare_dataset(str(bomb), str(tmp_path / "out"))  # the first two members: the rest never read


def test_a_job_names_an_archive_and_its_preparation_is_cached_by_content(tmp_path):
    archive = _tar(tmp_path / "houses.tgz", {"houses.csv": CSV.encode()})
    first = local_dataset_folder(DatasetSpec(uri="houses.tgz"), base=tmp_path)
    assert first is not None and first.name.startswith("houses-")
    assert local_dataset_folder(DatasetSpec(uri=str(archive))) == first  # the same bytes: prepared once
    _tar(archive, {"houses.csv": (CSV + "999,1,no\n").encode()})
    assert local_dataset_folder(DatasetSpec(uri=str(archive))) != first  # new contents: prepared again
