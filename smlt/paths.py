"""The folders the commands write (`--out`): checked before anything starts."""

from __future__ import annotations

from pathlib import Path

from smlt.runtime.errors import InvalidJob


def out_folder(path: Path, flag: str = "--out") -> Path:
    """`path` as a folder to write into (made later, when missing), or InvalidJob when it, or a
    folder above it, is a file."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                what = f"{flag} {path} is a file" if p == path else f"{flag} {path}: {p} is a file"
                raise InvalidJob(
                    f"{what}: name a folder (it is created if missing), e.g. {flag} {path.with_suffix('')}-out"
                )
            break
    return path
