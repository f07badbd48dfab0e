"""The project's root: the folder that holds the CDK app (infra/), the Lambda sources (lambdas/),
smlt/, cdk.json, layers/ and .dockerignore, as the repository does. The CDK app's assets (the zip
functions, the layer, the train image's build context), the synth cache's key and the local engine's
handler processes all read from it.

In a checkout (or an editable install) it is the repository. Installed from a wheel, site-packages
holds smlt/, infra/ and lambdas/ as packages and the root's own files as infra/project/ (setup.py):
:func:`root` copies them once into ``$SMLT_HOME/project/<digest>/``, a folder shaped like the
repository, so the CDK stages the image's build context through its .dockerignore, never by walking
site-packages.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from functools import cache
from importlib.util import find_spec
from pathlib import Path

PACKAGES = ("smlt", "infra", "lambdas")
SHIPPED = "project"  # infra/project/: the root's files in a wheel (setup.py's ROOT_FILES)


def _checkout() -> Path | None:
    top = Path(__file__).resolve().parents[1]
    return top if (top / "cdk.json").is_file() and (top / "infra").is_dir() else None


def _package(name: str) -> Path:
    spec = find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {name} package is not installed beside smlt (reinstall smlt)")
    return Path(next(iter(spec.submodule_search_locations)))


def _files(folder: Path) -> Iterator[Path]:
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.suffix != ".pyc" and "__pycache__" not in p.relative_to(folder).parts:
            yield p


def _layout() -> dict[str, Path]:
    """Every file of the root (relative path -> installed file)."""
    files: dict[str, Path] = {}
    shipped = _package("infra") / SHIPPED
    for name in PACKAGES:
        top = _package(name)
        for p in _files(top):
            rel = p.relative_to(top)
            if name != "infra" or rel.parts[0] != SHIPPED:
                files[f"{name}/{rel.as_posix()}"] = p
    for p in _files(shipped):
        files[p.relative_to(shipped).as_posix()] = p
    if "cdk.json" not in files:
        raise RuntimeError(f"{shipped}/cdk.json is missing: this smlt was not installed from its wheel (reinstall it)")
    return files


@cache
def root() -> Path:
    """The project's root (see the module's doc); made on first use when smlt runs from a wheel."""
    checkout = _checkout()
    if checkout is not None:
        return checkout
    files = _layout()
    h = hashlib.sha256()
    for rel, path in sorted(files.items()):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode() + data)
    from smlt.datasets import cache_home

    home = cache_home() / "project"
    folder = home / h.hexdigest()[:16]
    if folder.is_dir():
        return folder
    home.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=home))
    try:
        for rel, path in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, tmp / rel)
        os.rename(tmp, folder)  # whole or not at all; another process's rename may have won
    except OSError:
        if not folder.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
