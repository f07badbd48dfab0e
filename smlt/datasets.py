"""Resolve a job's dataset URI for the CLI: prepare local sources, upload them, rewrite the URI."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from smlt.data.prepare import prepare_dataset, read_local_manifest
from smlt.errors import InvalidDataset
from smlt.job import Job, check_dataset
from smlt.progress import notice
from smlt.store import S3Store


def cache_home() -> Path:
    return Path(os.environ.get("SMLT_HOME", Path.home() / ".cache" / "smlt"))


def local_dataset_folder(uri: str, base: Path | None = None) -> Path | None:
    """A local folder holding manifest.json for `uri`, preparing it first if needed.
    Returns None for s3:// URIs (nothing to do locally)."""
    if uri.startswith("s3://"):
        return None
    if uri.startswith(("sklearn:", "synthetic:")):
        slug = re.sub(r"[^A-Za-z0-9]+", "-", uri).strip("-") + "-" + hashlib.sha1(uri.encode()).hexdigest()[:6]
        folder = cache_home() / "datasets" / slug
        if not (folder / "manifest.json").exists():
            notice.info(f"preparing {uri} into {folder}")
            prepare_dataset(uri, str(folder))
        return folder
    path = Path(uri)
    if not path.is_absolute() and base is not None and not path.exists():
        path = base / path
    if path.is_dir():
        read_local_manifest(path)  # raises InvalidDataset with the reason
        return path
    if path.is_file() and path.suffix in (".csv", ".npz"):
        folder = cache_home() / "datasets" / (path.stem + "-" + hashlib.sha1(path.read_bytes()).hexdigest()[:8])
        if not (folder / "manifest.json").exists():
            notice.info(f"preparing {path} into {folder}")
            prepare_dataset(str(path), str(folder))
        return folder
    raise InvalidDataset(
        f"dataset.uri: {uri!r} is not an s3:// URI, a prepared dataset folder, a .csv/.npz file, "
        "sklearn:NAME or synthetic:..."
    )


def upload_folder(folder: Path, store: S3Store, prefix: str) -> None:
    for f in sorted(folder.iterdir()):
        if f.is_file():
            key = prefix + f.name
            if not store.exists(key):
                store.put(key, f.read_bytes())


def stage_dataset(uri: str, data_bucket: str, base: Path | None = None, client=None) -> str:
    """Return an s3:// URI for the job, uploading a local dataset into the data bucket."""
    folder = local_dataset_folder(uri, base)
    return uri if folder is None else upload_dataset(folder, data_bucket, client)


def checked_dataset_folder(job: Job, base: Path | None = None) -> Path | None:
    """The job's local dataset folder (prepared if needed), checked against the job before any
    engine or stack is touched; None for an s3:// dataset (the planner checks that one)."""
    folder = local_dataset_folder(job.dataset.uri, base)
    if folder is not None:
        check_dataset(job, read_local_manifest(folder))
    return folder


def upload_dataset(folder: Path, data_bucket: str, client=None) -> str:
    """Upload a prepared dataset folder into the data bucket; returns its s3:// URI."""
    prefix = f"datasets/{folder.name}/"
    upload_folder(folder, S3Store(data_bucket, client=client), prefix)
    return f"s3://{data_bucket}/{prefix}"
