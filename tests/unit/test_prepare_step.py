"""The Prepare step's decisions: which data source an upload holds (or the named error that says
what is wrong with it), how much one function prepares, and archives unpacked safely."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from smlt.runtime.data.options import SourceOptions
from smlt.runtime.steps import prepare as p
from smlt.runtime.steps import prepare_limits as limits

WHERE = "s3://data/incoming/houses/v1/"
MB = 1_000_000


RECORDED = json.loads((Path(__file__).resolve().parents[2] / "bench/results/prepare_memory.json").read_text())


def test_the_limits_use_the_measurements_recorded_in_bench():
    csv = RECORDED["prepare"]
    assert limits.TABLE_MB_PER_S == pytest.approx(csv["mb_per_s_per_core"], abs=0.05)
    assert limits.TABLE_SPOOL_RATIO == pytest.approx(csv["shards_mb"] / RECORDED["input"]["mb"], abs=0.01)
    kinds = RECORDED["kinds"]
    assert limits.RSS_PER_MB == {
        "arrays": kinds["npz"]["rss_per_input_mb"],
        "images": kinds["images"]["rss_per_decoded_mb"],
    }
    assert limits.BASELINE_MB == {
        "arrays": kinds["npz"]["baseline_rss_mb"],
        "images": kinds["images"]["baseline_rss_mb"],
    }
    assert limits.FUNCTION_IMPORTS_MB == RECORDED["function"]["imports_rss_mb"]
    assert limits.S3_MB_PER_S == RECORDED["distributed_map_model"]["facts"]["s3_mib_s"]["value"] * 2**20 / MB


def test_a_table_is_bound_by_tmp_within_the_timeout():
    # /tmp: the download and the spooled rows, within four fifths of it
    assert (
        limits.MAX_TABLE_BYTES * (1 + limits.TABLE_SPOOL_RATIO)
        <= limits.TMP_SHARE * limits.PREPARE_EPHEMERAL_MB * 2**20
    )
    assert limits.MAX_TABLE_BYTES == 4_200 * MB and limits.TABLE_TMP_BYTES < limits.TABLE_TIME_BYTES
    # time: at half the measured rate, plus the download and the shards' upload, well within 15 minutes
    seconds = limits.MAX_TABLE_BYTES / MB * (2 / csv_rate() + (1 + limits.TABLE_SPOOL_RATIO) / (75 * 2**20 / MB))
    assert seconds + limits.PREPARE_RESERVE_S < limits.PREPARE_TIMEOUT_S == 900


def csv_rate() -> float:
    return RECORDED["prepare"]["mb_per_s_per_core"]


@pytest.mark.parametrize("kind, limit", [("arrays", 700 * MB), ("images", 1_100 * MB)])
def test_an_in_memory_kind_is_bound_by_memory(kind, limit):
    assert limits.PREPARE_MEMORY_MB <= 3008  # a new account's most
    top = limits.MAX_ARRAYS_BYTES if kind == "arrays" else limits.MAX_PIXELS_BYTES
    assert top == limit
    # its peak, at the measured rate, with the function's baseline and a shard in flight, leaves a fifth free
    peak = (
        top / 2**20 * limits.RSS_PER_MB[kind] + limits.FUNCTION_IMPORTS_MB + limits.BASELINE_MB[kind] + limits.SHARD_MB
    )
    assert peak <= limits.MEMORY_SHARE * limits.PREPARE_MEMORY_MB < peak + 100 * MB / 2**20 * limits.RSS_PER_MB[kind]


def test_an_archive_is_let_in_up_to_the_largest_limit_of_what_it_may_hold():
    assert (
        limits.MAX_INPUT_BYTES
        == max(limits.MAX_TABLE_BYTES, limits.MAX_ARRAYS_BYTES, limits.MAX_PIXELS_BYTES)
        == limits.MAX_TABLE_BYTES
    )


@pytest.mark.parametrize(
    "objects, kind, root",
    [
        ({"houses.csv": 10, "_SUCCESS": 0}, "file", "houses.csv"),
        ({"part.PARQUET": 10, "_SUCCESS": 0, "_committed_123": 5, ".part.crc": 1}, "file", "part.PARQUET"),
        ({"arrays.npz": 10, "_SUCCESS": 0, "notes/": 0}, "file", "arrays.npz"),
        ({"images.tar.gz": 10, "_SUCCESS": 0}, "archive", "images.tar.gz"),
        ({"cat/1.png": 3, "dog/2.JPG": 4, "dog/.DS_Store": 1, "_SUCCESS": 0}, "images", ""),
        ({"photos/cat/1.png": 3, "photos/dog/2.jpeg": 4, "_SUCCESS": 0}, "images", "photos"),
    ],
)
def test_the_one_source_beside_the_marker(objects, kind, root):
    source = p.find_source(objects, WHERE)
    assert (source.kind, source.root) == (kind, root)
    assert "_SUCCESS" not in source.names and not any(n.startswith((".", "_")) or "/." in n for n in source.names)
    assert source.bytes == sum(objects[n] for n in source.names)


def test_a_marker_alone_is_no_data_naming_the_prefix():
    with pytest.raises(p.NoDataFile, match=r"^s3://data/incoming/houses/v1/ has a _SUCCESS marker but no data"):
        p.find_source({"_SUCCESS": 0, "_temporary/0/x.csv": 5, ".DS_Store": 1}, WHERE)


def test_several_sources_are_named():
    with pytest.raises(p.MixedUpload, match=r"holds 2 data sources \(a\.csv, b\.parquet\); one version is one source"):
        p.find_source({"a.csv": 1, "b.parquet": 1, "_SUCCESS": 0}, WHERE)
    with pytest.raises(p.MixedUpload, match=r"\(houses\.csv, the class folders/\)"):
        p.find_source({"houses.csv": 1, "cat/1.png": 1, "dog/1.png": 1}, WHERE)


def test_a_format_smlt_does_not_prepare_is_named():
    with pytest.raises(p.UnsupportedFormat, match=r"v1/: notes\.docx is not a format smlt prepares; upload a \.csv"):
        p.find_source({"houses.csv": 1, "notes.docx": 1}, WHERE)
    with pytest.raises(p.MixedUpload, match=r"holds 2 data sources \(houses\.csv, notes\.xlsx\)"):
        p.find_source({"houses.csv": 1, "notes.xlsx": 1}, WHERE)  # a workbook is a table of its own
    with pytest.raises(
        p.UnsupportedFormat, match=r"docs/ \(docs/a\.txt: no PNG, JPEG, GIF, WebP, AVIF, BMP or TIFF image\)"
    ):
        p.find_source({"docs/a.txt": 1}, WHERE)


def test_a_prepared_dataset_is_not_raw_data():
    with pytest.raises(p.AlreadyPrepared, match=r"holds a prepared dataset \(manifest\.json\).*delete .*v1/_SUCCESS"):
        p.find_source({"manifest.json": 1, "train-00000.safetensors": 9, "_SUCCESS": 0}, WHERE)


def test_an_input_over_the_limit_names_the_object_its_size_and_what_to_do():
    size = limits.MAX_TABLE_BYTES + 1
    with pytest.raises(p.TooLargeForLambda) as e:
        p.find_source({"big.csv": size, "_SUCCESS": 0}, WHERE)
    message = str(e.value)
    assert message.startswith(
        "s3://data/incoming/houses/v1/big.csv is 4.20 GB, more than one Prepare function takes of a CSV or "
        "Parquet file: 4.20 GB (its 10,240 MB of /tmp holds the download and the rows spooled"
    )
    assert "`smlt data prepare SOURCE --out s3://data/incoming/houses/v1/`" in message
    assert "delete s3://data/incoming/houses/v1/_SUCCESS" in message
    assert p.find_source({"big.csv": limits.MAX_TABLE_BYTES}, WHERE).bytes == limits.MAX_TABLE_BYTES


def test_each_kind_is_held_to_its_own_limit_and_reason():
    with pytest.raises(
        p.TooLargeForLambda, match=r"v1/x\.npz is 0\.80 GB, .* an NPZ file: 0\.70 GB of arrays \(its arrays"
    ):
        p.find_source({"x.npz": 800 * MB}, WHERE)
    assert p.find_source({"x.npz": 700 * MB}, WHERE).root == "x.npz"
    # an image folder counts every image, its files' bytes at most its decoded pixels'
    half = limits.MAX_PIXELS_BYTES // 2 + 1
    with pytest.raises(
        p.TooLargeForLambda,
        match=r"^s3://data/incoming/houses/v1/photos/ is 1\.10 GB, .*image folder: 1\.10 GB of decoded pixels \(its images are decoded whole into its 3,008 MB",
    ):
        p.find_source({"photos/cat/1.png": half, "photos/dog/1.png": half}, WHERE)
    # resized by image_size: the pixels are known from the listing (30,000 x 3x112x112 = 1.13 GB)
    photos = {f"{c}/{i}.jpg": 1_000 for c in ("cat", "dog") for i in range(15_000)}
    with pytest.raises(p.TooLargeForLambda, match=r"v1/ is 1\.13 GB of decoded pixels \(30,000 images of 3x112x112\)"):
        p.find_source(photos, WHERE, options=SourceOptions(image_size=112))
    assert p.find_source(photos, WHERE, options=SourceOptions(image_size=112, channels=1)).kind == "images"
    with pytest.raises(
        p.TooLargeForLambda, match=r"v1/big\.tgz is 4\.30 GB, more than one Prepare function takes of an archive"
    ):
        p.find_source({"big.tgz": 4_300 * MB}, WHERE)


def test_an_npz_and_images_are_checked_by_what_they_hold_once_loaded(tmp_path, monkeypatch):
    monkeypatch.setattr(p, "ARRAYS_LIMIT", replace(p.ARRAYS_LIMIT, bytes=10_000))
    monkeypatch.setattr(p, "IMAGES_LIMIT", replace(p.IMAGES_LIMIT, bytes=10_000))
    np.savez_compressed(tmp_path / "x.npz", x=np.zeros((1000, 4), np.float32), y=np.zeros(1000))
    small = (tmp_path / "x.npz").stat().st_size
    assert small < 10_000  # compressed: its file is within the limit, its arrays are not
    npz = p.find_source({"x.npz": small}, WHERE)
    with pytest.raises(p.TooLargeForLambda, match=r"v1/x\.npz is 24,\d+ bytes of arrays, more than .* an NPZ file"):
        p._check_loaded(tmp_path / "x.npz", npz, WHERE, SourceOptions(), in_archive=False)
    for name in ("a/1.png", "b/2.png"):
        (tmp_path / "img" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 50)).save(tmp_path / "img" / name)  # tiny files, 6,000 bytes of pixels each
    folder = p.find_source({"a/1.png": 100, "b/2.png": 100}, WHERE)
    with pytest.raises(p.TooLargeForLambda, match=r"v1/ is 12,000 bytes of decoded pixels \(2 images of 3x50x40\)"):
        p._check_loaded(tmp_path / "img", folder, WHERE, SourceOptions(), in_archive=False)
    p._check_loaded(tmp_path / "img", folder, WHERE, SourceOptions(channels=1), in_archive=False)  # 4,000 bytes


def test_an_unreadable_first_image_does_not_skip_the_pixels_check(tmp_path, monkeypatch):
    # prepare leaves an unreadable image out, so the size is the first readable one's
    monkeypatch.setattr(p, "IMAGES_LIMIT", replace(p.IMAGES_LIMIT, bytes=10_000))
    for name in ("a/0.png", "a/1.png", "b/2.png"):
        (tmp_path / "img" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 50)).save(tmp_path / "img" / name)
    (tmp_path / "img" / "a" / "0.png").write_bytes(b"")
    folder = p.find_source({"a/0.png": 0, "a/1.png": 100, "b/2.png": 100}, WHERE)
    with pytest.raises(p.TooLargeForLambda, match=r"v1/ is 18,000 bytes of decoded pixels \(3 images of 3x50x40\)"):
        p._check_loaded(tmp_path / "img", folder, WHERE, SourceOptions(), in_archive=False)


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, body in files.items():
            z.writestr(name, body)
    return buf.getvalue()


def _tar(files: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def _unpack(tmp_path, name: str, blob: bytes) -> tuple[dict[str, int], p.RawSource]:
    archive = tmp_path / name
    archive.write_bytes(blob)
    source = p.RawSource("archive", name, (name,), len(blob))
    return p._extract(archive, tmp_path / "out", source, WHERE), source


def test_a_zip_of_an_image_folder_unpacks_to_its_source(tmp_path):
    unpacked, _ = _unpack(tmp_path, "shapes.zip", _zip({"shapes/a/1.png": b"x", "shapes/b/1.png": b"y"}))
    assert unpacked == {"shapes/a/1.png": 1, "shapes/b/1.png": 1}
    inner = p.find_source(unpacked, f"{WHERE}shapes.zip", in_archive=True)
    assert (inner.kind, inner.root) == ("images", "shapes")


def test_a_tar_of_a_csv_unpacks_and_an_archive_inside_is_refused(tmp_path):
    unpacked, _ = _unpack(tmp_path, "h.tgz", _tar({"houses.csv": b"a,label\n1,0\n"}))
    assert p.find_source(unpacked, f"{WHERE}h.tgz", in_archive=True).root == "houses.csv"
    with pytest.raises(p.UnsupportedFormat, match=r"v1/inner\.zip: inner\.zip is not a format"):
        p.find_source({"inner.zip": 3}, f"{WHERE}inner.zip", in_archive=True)
    with pytest.raises(p.NoDataFile, match=r"v1/empty\.zip holds no data"):
        p.find_source({}, f"{WHERE}empty.zip", in_archive=True)


def test_a_table_in_a_wrapping_folder_is_found_inside_it(tmp_path):
    unpacked, _ = _unpack(tmp_path, "h.zip", _zip({"export/houses.csv": b"a,label\n1,0\n", "__MACOSX/x": b"r"}))
    assert unpacked == {"export/houses.csv": 12}
    wrap, names, inside = p._unwrapped(unpacked, f"{WHERE}h.zip")
    assert (wrap, names, inside) == ("export", {"houses.csv": 12}, f"{WHERE}h.zip/export")
    assert p.find_source(names, inside, in_archive=True).root == "houses.csv"


def test_a_member_outside_the_archive_is_refused(tmp_path):
    with pytest.raises(
        p.UnsupportedFormat, match=r"v1/evil\.tar: member '\.\./escaped\.csv' points outside the archive"
    ):
        _unpack(tmp_path, "evil.tar", _tar({"../escaped.csv": b"a\n1\n"}, mode="w"))
    assert not (tmp_path / "escaped.csv").exists()


def test_an_archive_that_unpacks_over_the_limit_is_refused_before_it_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(p, "TABLE_LIMIT", replace(p.TABLE_LIMIT, bytes=1000))
    within = r"more than one Prepare function takes of a CSV or Parquet file: 1,000 bytes \(its 10,240 MB of /tmp"
    with pytest.raises(p.TooLargeForLambda, match=rf"^{WHERE}big\.zip/houses\.csv is 5,000 bytes, {within}"):
        _unpack(tmp_path, "big.zip", _zip({"houses.csv": b"0" * 5000}))
    assert not (tmp_path / "out").exists()
    with pytest.raises(
        p.TooLargeForLambda, match=r"--out s3://data/incoming/houses/v1/`.*delete s3://data/incoming/houses/v1/_SUCCESS"
    ):
        _unpack(tmp_path, "big.tar", _tar({"./houses.csv": b"0" * 5000}, mode="w"))
    assert not (tmp_path / "out").exists()


def test_not_an_archive_is_named(tmp_path):
    with pytest.raises(
        p.UnsupportedFormat, match=r"v1/fake\.zip: not a readable zip archive \(File is not a zip file\)"
    ):
        _unpack(tmp_path, "fake.zip", b"these bytes are not an archive")


def test_an_archive_is_unpacked_without_its_noise_and_a_locked_one_is_refused(tmp_path):
    finder = {"pets/cat/1.png": b"x", "pets/dog/1.png": b"y", "__MACOSX/pets/cat/._1.png": b"r", "pets/Thumbs.db": b"t"}
    unpacked, _ = _unpack(tmp_path, "pets.tar.bz2", _tar(finder, mode="w:bz2"))
    assert unpacked == {"pets/cat/1.png": 1, "pets/dog/1.png": 1}
    blob = bytearray(_zip({"houses.csv": b"a,label\n1,0\n"}))
    for signature, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        blob[blob.index(signature) + at] |= 0x1  # encrypted, as `zip -e` flags it
    with pytest.raises(p.UnsupportedFormat, match=r"v1/locked\.zip: member 'houses\.csv' is password-protected"):
        _unpack(tmp_path, "locked.zip", bytes(blob))


def test_an_archive_that_would_not_fit_the_functions_tmp_is_refused(tmp_path, monkeypatch):
    free = shutil.disk_usage(tmp_path)._replace(free=5000)
    monkeypatch.setattr(p.shutil, "disk_usage", lambda path: free)
    with pytest.raises(
        p.TooLargeForLambda,
        match=rf"^{WHERE}big\.tgz unpacks to 6,000 bytes \(its largest member 'houses\.csv', 6,000 bytes\), more than "
        r"the Prepare function's /tmp \(10,240 MB of ephemeral storage\) has free beside its download \(5,000 bytes",
    ):
        _unpack(tmp_path, "big.tgz", _tar({"houses.csv": b"0" * 6000}))
    assert not (tmp_path / "out").exists()


def test_messages_name_the_uploaded_objects_not_the_functions_copies():
    tmp = "/tmp/smlt-prepare-x1"
    zipped = p.RawSource("archive", "data.zip", ("data.zip",), 1)
    assert (
        p._local_names(f"{tmp}/unpacked/houses.csv: column 'x', line 3", tmp, WHERE, zipped)
        == "s3://data/incoming/houses/v1/data.zip/houses.csv: column 'x', line 3"
    )
    folder = p.RawSource("images", "", ("a/1.png",), 1)
    assert p._local_names(f"{tmp}/raw: not an image folder; {tmp}/raw/a/1.png", tmp, WHERE, folder) == (
        "s3://data/incoming/houses/v1: not an image folder; s3://data/incoming/houses/v1/a/1.png"
    )
