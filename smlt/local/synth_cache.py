"""The synth cache: the project's CDK app synthesized once per version of what it is made from.

`smlt run --local`, `smlt resume --local` and `smlt local up` need the app's template and staged
assets, which change only when the code that defines them changes; importing the CDK (4-8 s) and
synthesizing (3-9 s) on every start paid for nothing new. :func:`synthesize_cached` keys the
synth by the contents of every input that can change its output (:func:`cache_key`), reuses an
entry with that key, and imports the CDK only to make a missing one.

Where: ``$SMLT_SYNTH_CACHE``, else ``$SMLT_HOME/synth`` (default ``~/.cache/smlt/synth``);
``SMLT_SYNTH_CACHE=off`` synthesizes every time. An entry, ``<folder>/<key>/``, is the cloud
assembly CDK wrote (template, assets manifest, the staged asset directories) plus ``entry.json``
(the stack's name and template file, and a digest of the entry's files). It is synthesized into a
temporary folder beside it and renamed into place, so a reader sees a whole entry or none; when
several processes miss at once, the first rename wins and the others use its entry. An entry that
does not read back whole (a file missing or changed, a bad ``entry.json``) is set aside and made
again. Making a new entry removes those not used for a day, except the ``KEEP`` used last.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

from .synth import SYNTH_CONTEXT, SynthError, Synthesized, asset_paths, synthesize

ENV = "SMLT_SYNTH_CACHE"
FORMAT = 1  # the entry's layout: bump when it changes
ENTRY = "entry.json"
KEEP = 8  # entries always kept (the ones used last), whatever their age
UNUSED_S = 24 * 3600  # older entries are removed once unused this long
STALE_TMP_S = 3600  # a temporary folder this old is a synth that died

# What the key hashes, by path relative to the project root and content (never mtime); a folder
# is every file under it but __pycache__/ and *.pyc (no asset holds them).
SOURCES = (
    "infra",  # the CDK app and its constructs
    "cdk.json",  # the context defaults build_app reads (smlt.runtime.deployed)
    "smlt",  # staged into the train_step image and hashed into the layer's fingerprint (both asset
    # hashes are in the template); infra imports it (the functions' environment, settings)
    "lambdas",  # the zip functions' assets and the image's handler (their asset hashes)
    "layers",  # layers/requirements.txt is in the layer's fingerprint and the image's build context
    ".dockerignore",  # which files the image's build context (and its asset hash) holds
    "pyproject.toml",  # the dependencies the app and its assets are built with
    "constraints.txt",  # ... and their exact versions
)
# Another version of these can synthesize another template from the same sources.
PACKAGES = ("aws-cdk-lib", "constructs", "jsii", "cdk-nag")
# build_app merges the CDK CLI's context from the environment over cdk.json's.
ENVIRONMENT = ("CDK_CONTEXT_JSON",)


def cache_folder() -> Path | None:
    """The cache's folder, or None when ``SMLT_SYNTH_CACHE=off``."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() == "off":
        return None
    if value:
        return Path(value).expanduser()
    # the home of smlt's other caches (smlt.datasets.cache_home)
    return Path(os.environ.get("SMLT_HOME", Path.home() / ".cache" / "smlt")) / "synth"


def _files(path: Path) -> Iterator[Path]:
    """The file, or every file under the folder but __pycache__/ and *.pyc, in a fixed order."""
    if path.is_file():
        yield path
    elif path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file() and p.suffix != ".pyc" and "__pycache__" not in p.relative_to(path).parts:
                yield p


def cache_key(
    build_app: Callable[..., Any],
    root: Path,
    *,
    context: dict[str, Any] | None = None,
    stack: str | None = None,
) -> str:
    """The hex key of the app's synth: everything that can change the synthesized output."""
    h = hashlib.sha256()

    def add(name: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        h.update(f"{name}\0{len(raw)}\0".encode() + raw)

    add("format", str(FORMAT))
    add("app", f"{build_app.__module__}.{build_app.__qualname__}")  # which app
    # the layer's asset path is the absolute source folder (bundling is off), image functions run
    # from the root: the template and the entry are this checkout's
    add("root", str(root.resolve()))
    add("python", sys.version)  # the app and jsii's runtime run on it
    for name in PACKAGES:
        try:
            add(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            add(name, "absent")
    for name in ENVIRONMENT:
        add(name, os.environ.get(name, ""))
    # the synth's own arguments: the context as synthesize() merges it, the stack it picks
    add("context", json.dumps({**SYNTH_CONTEXT, **(context or {})}, sort_keys=True, default=str))
    add("stack", repr(stack))
    for source in SOURCES:
        add("source", source)
        for path in _files(root / source):
            add(path.relative_to(root).as_posix(), path.read_bytes())
    return h.hexdigest()


def _digest(entry: Path) -> str:
    """The entry's files (entry.json aside) by relative path and content."""
    h = hashlib.sha256()
    for path in _files(entry):
        rel = path.relative_to(entry).as_posix()
        if rel != ENTRY:
            data = path.read_bytes()
            h.update(f"{rel}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def read_entry(entry: Path) -> Synthesized | None:
    """The entry as the synth that made it returned it, or None if it is missing or not whole."""
    try:
        meta = json.loads((entry / ENTRY).read_text())
        if meta["format"] != FORMAT or meta["digest"] != _digest(entry):
            return None
        template_path = entry / meta["template"]
        template = json.loads(template_path.read_text())
        assets = asset_paths(template, entry)
        if not all(p.is_dir() for p in assets.values()):
            return None
        return Synthesized(
            stack_name=meta["stack_name"],
            template=template,
            assembly_dir=entry,
            template_path=template_path,
            asset_paths=assets,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _set_aside(path: Path) -> None:
    """Remove a folder other processes may be reading or removing too: renamed first (atomic)."""
    aside = path.with_name(f".{path.name}.gone-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another process did
    shutil.rmtree(aside, ignore_errors=True)


def _install(tmp: Path, entry: Path) -> None:
    """Rename the finished ``tmp`` to ``entry``; an entry already there is kept if whole (another
    process made it), else replaced."""
    try:
        os.rename(tmp, entry)
        return
    except OSError:
        if read_entry(entry) is not None:
            return
    _set_aside(entry)
    try:
        os.rename(tmp, entry)
    except OSError:
        pass  # a third process installed one meanwhile: the caller reads whichever is there


def _prune(folder: Path, keep: Path) -> None:
    """Remove entries unused for UNUSED_S but the KEEP used last, and dead synths' folders."""
    now = time.time()
    entries: list[tuple[float, Path]] = []
    for path in folder.iterdir():
        try:
            if path.name.startswith("."):
                if now - path.stat().st_mtime > STALE_TMP_S:
                    shutil.rmtree(path, ignore_errors=True)
            elif path != keep:
                used = (path / ENTRY).stat().st_mtime if (path / ENTRY).exists() else path.stat().st_mtime
                entries.append((used, path))
        except OSError:
            continue  # removed meanwhile
    for used, path in sorted(entries, reverse=True)[KEEP - 1 :]:
        if now - used > UNUSED_S:
            _set_aside(path)


def synthesize_cached(
    build_app: Callable[..., Any],
    folder: Path,
    *,
    root: Path,
    context: dict[str, Any] | None = None,
    stack: str | None = None,
) -> Synthesized:
    """:func:`synthesize` ``build_app`` (whose every input is under ``root``'s :data:`SOURCES`),
    or read it from ``folder``'s entry of its key. The result points into the entry."""
    t0 = time.perf_counter()
    folder = folder.expanduser().resolve()  # the entry's paths are absolute, as a synth's are
    entry = folder / cache_key(build_app, root, context=context, stack=stack)
    syn = read_entry(entry)
    if syn is not None:
        try:
            os.utime(entry / ENTRY)  # used now (_prune)
        except OSError:
            pass  # a cache this process may read but not write
        return replace(syn, seconds=time.perf_counter() - t0, cached=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name[:16]}-", dir=folder))
    except OSError as e:
        raise SynthError(f"the synth cache {folder}: {e} (set {ENV} to another folder, or to off)") from None
    try:
        made = synthesize(build_app, tmp, context=context, stack=stack)
        meta = {
            "format": FORMAT,
            "stack_name": made.stack_name,
            "template": made.template_path.relative_to(tmp.resolve()).as_posix(),
            "digest": _digest(tmp),
        }
        (tmp / ENTRY).write_text(json.dumps(meta, indent=2) + "\n")
        _install(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # left only when it was not installed
    syn = read_entry(entry)
    if syn is None:
        raise SynthError(f"the synth cache entry {entry} did not read back after it was written")
    _prune(folder, keep=entry)
    return replace(syn, seconds=time.perf_counter() - t0)
