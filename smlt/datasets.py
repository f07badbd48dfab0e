"""Resolve a job's dataset URI for the CLI: prepare local sources, upload them, rewrite the URI."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

import smlt.runtime.data
from smlt.runtime.data import archives
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset, read_local_manifest
from smlt.runtime.data.sources import folder_found, folder_parts, is_source_path
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.job import DatasetSpec, Job, check_dataset
from smlt.runtime.progress import notice
from smlt.runtime.store import S3Store


def cache_home() -> Path:
    return Path(os.environ.get("SMLT_HOME", Path.home() / ".cache" / "smlt"))


def local_dataset_folder(dataset: DatasetSpec | str, base: Path | None = None) -> Path | None:
    """A local folder holding manifest.json for the job's dataset, preparing its source (with the
    dataset section's options) into the cache first if needed. None for s3:// URIs."""
    spec = DatasetSpec(uri=dataset) if isinstance(dataset, str) else dataset
    uri = spec.uri
    if uri.startswith("s3://"):
        return None
    if uri.startswith(("sklearn:", "synthetic:")):
        return _prepared(uri, re.sub(r"[^A-Za-z0-9]+", "-", uri).strip("-"), uri, spec.options())
    path = Path(uri)
    if not path.is_absolute() and base is not None and not path.exists():
        path = base / path
    if path.is_dir() and (path / "manifest.json").exists():
        read_local_manifest(path)  # raises InvalidDataset with the reason
        return path
    if is_source_path(path):
        stem = archives.stem(path) if archives.is_archive(path) else path.stem
        return _prepared(str(path), stem, _fingerprint(path), spec.options())
    if path.is_dir():
        raise InvalidDataset(f"dataset.uri: {path} is not a prepared dataset (no manifest.json); {folder_found(path)}")
    raise InvalidDataset(
        f"dataset.uri: {uri!r} is not an s3:// URI, a prepared dataset folder, an image folder, a folder of a "
        f"table's parts, a .csv/.parquet/.jsonl/.xlsx/.npz file, an archive of one of those ({archives.ARCHIVE_KINDS}), "
        "sklearn:NAME or synthetic:..."
    )


# What preparing a cached source said (its warnings: a leak, an id, rows without a label), told
# again each time the cached preparation is used.
NOTICES = "notices.json"
_told: set[Path] = set()  # cached preparations whose notices this process has told


@functools.cache
def preparation_rules() -> str:
    """A digest of the code that turns a source into a dataset (smlt/runtime/data): a cached
    preparation made by other rules (an older smlt) is made again, never reused."""
    digest = hashlib.sha1()
    for f in sorted(Path(smlt.runtime.data.__file__).parent.glob("*.py")):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def _prepared(source: str, stem: str, identity: str, options: SourceOptions) -> Path:
    """The cache folder of `source` prepared with `options` by this smlt's rules: the slug hashes
    the three, so a different label (or any other option, or an upgrade) never reuses another
    preparation. What preparing said is told again on every use."""
    key = identity + "\n" + options.model_dump_json() + "\n" + preparation_rules()
    folder = cache_home() / "datasets" / f"{stem}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    if (folder / "manifest.json").exists():
        said = json.loads((folder / NOTICES).read_text()) if (folder / NOTICES).exists() else []
        if folder in _told:
            said = []
        _told.add(folder)
        if said:
            notice.info(f"{source}: prepared before, in {folder}; preparing it said:")
        for level, message in said:
            notice.log(level, message)
        return folder
    notice.info(f"preparing {source} into {folder}")
    tmp = folder.with_name(folder.name + f".{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    said = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append((record.levelno, record.getMessage()))

    keep = Keep(logging.INFO)
    notice.addHandler(keep)
    try:
        prepare_dataset(source, str(tmp), options=options)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed preparation leaves nothing behind
        raise
    finally:
        notice.removeHandler(keep)
    kept = [(level, m) for level, m in said if not m.startswith(("prepared ", "reading "))]
    (tmp / NOTICES).write_text(json.dumps(kept))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    _told.add(folder)
    return folder


def _fingerprint(path: Path) -> str:
    """A file's content hash; a folder of a table's parts, each part's name and content hash in
    the parts' order (a part changed, added, removed or renamed prepares again; `_SUCCESS` and
    `.crc` files are not parts); an image folder's listing (relative path, size, modification time)."""
    if path.is_file():
        return _content(path)
    parts = folder_parts(path)
    if parts is not None:
        return hashlib.sha1("\n".join(f"{p.name}:{_content(p)}" for p in parts).encode()).hexdigest()
    files = sorted(f for f in path.rglob("*") if f.is_file())
    listing = [f"{f.relative_to(path)}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
    return hashlib.sha1("\n".join(listing).encode()).hexdigest()


def _content(path: Path) -> str:
    """A file's sha1, read 1 MiB at a time (a large table's part is never held whole)."""
    digest = hashlib.sha1()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def upload_folder(folder: Path, store: S3Store, prefix: str) -> None:
    for f in sorted(folder.iterdir()):
        if f.is_file():
            key = prefix + f.name
            if not store.exists(key):
                store.put(key, f.read_bytes())


def stage_dataset(dataset: DatasetSpec | str, data_bucket: str, base: Path | None = None, client=None) -> str:
    """Return an s3:// URI for the job, uploading a local dataset into the data bucket."""
    folder = local_dataset_folder(dataset, base)
    if folder is None:
        return dataset if isinstance(dataset, str) else dataset.uri
    return upload_dataset(folder, data_bucket, client)


def checked_dataset_folder(job: Job, base: Path | None = None) -> Path | None:
    """The job's local dataset folder (prepared if needed), checked against the job before any
    engine or stack is touched; None for an s3:// dataset (the planner checks that one)."""
    folder = local_dataset_folder(job.dataset, base)
    if folder is not None:
        check_dataset(job, read_local_manifest(folder))
    return folder


def upload_dataset(folder: Path, data_bucket: str, client=None) -> str:
    """Upload a prepared dataset folder into the data bucket; returns its s3:// URI."""
    prefix = f"datasets/{folder.name}/"
    upload_folder(folder, S3Store(data_bucket, client=client), prefix)
    return f"s3://{data_bucket}/{prefix}"
