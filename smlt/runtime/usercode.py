"""A user's own code (`--code DIR`): packaged by the CLI, fetched, verified and imported by workers.

DIR is either an importable package (a folder with `__init__.py`, stored under its own name) or a
folder holding packages and modules (what you would put on PYTHONPATH, stored as it is). The CLI
zips it deterministically (sorted entries, fixed timestamps and modes; `__pycache__`, `*.pyc` and
dot-files left out), so the same code gives the same sha256; refuses what the train_step image
cannot run (compiled extensions, packages the image provides, more than MAX_CODE_BYTES, no Python
at all); and stores it once under the stack's artifacts bucket as `code/<sha256>.zip`. The job
records `code = {uri, sha256}`.

A worker (a Lambda container or a local handler process: the same code path) fetches the zip,
checks its sha256, unpacks it once per process into SMLT_CODE_DIR/<sha256>/ (/tmp/smlt-code) and
puts that folder first on sys.path, so `model.name = "mymodels.cnn:build"` and `code.transform =
"mymodels.aug:transform"` import from it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import io
import os
import re
import shutil
import sys
import tempfile
import traceback
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from smlt.runtime import keys
from smlt.runtime.errors import FIX_AND_START_AGAIN, AccessDenied, InvalidCode, UserCodeError
from smlt.runtime.job import BUILTIN_MODELS, Job
from smlt.runtime.keys import parse_s3_uri
from smlt.runtime.progress import notice
from smlt.runtime.store import NotFound, S3Store
from smlt.runtime.worker_limits import LIMITS_ENV, code_root, impose, within

# The most a user's code may hold, unpacked: it lives in the worker's /tmp beside the dataset
# cache, and a model's weights belong in `warm_start`, not in the code.
MAX_CODE_BYTES = 50 * 2**20
# Compiled extensions: built for another platform or Python than the image's, they cannot load.
_COMPILED = re.compile(r"\.(so|pyd|dylib|dll)(\.\d+)*$", re.IGNORECASE)
# Top-level names the image provides: a user's copy would shadow the pinned one.
IMAGE_PACKAGES = frozenset({"smlt", "lambdas", "torch", "torchvision", "numpy", "PIL", "safetensors", "pyarrow"})
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can record


# Where the artifacts bucket keeps users' code (the train functions may read it: infra/stacks/functions.py).
CODE_PREFIX = keys.CODE
code_key = keys.code_key
_CODE_KEY = re.compile(re.escape(keys.code_key("SHA")).replace("SHA", "[0-9a-f]{64}"))


# --------------------------------------------------------------------------------------------
# CLI side: package and stage


@dataclass(frozen=True)
class CodePackage:
    data: bytes
    sha256: str
    files: int


def _check_name(name: str, where: str) -> None:
    """The rules both sides apply to a file of the user's code (`name`: its path in the zip)."""
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise InvalidCode(f"code: {where}: {name!r} points outside the package")
    if _COMPILED.search(name):
        raise InvalidCode(
            f"code: {where}: {name!r} is a compiled extension; the train_step image runs pure Python only "
            "(torch, torchvision, numpy, Pillow and safetensors are already there)"
        )
    if parts[0].removesuffix(".py") in IMAGE_PACKAGES:
        raise InvalidCode(
            f"code: {where}: {name!r} would replace the image's own {parts[0].removesuffix('.py')!r}; "
            "leave it out (the image provides it, pinned)"
        )


def _too_large(total: int, where: str) -> InvalidCode:
    return InvalidCode(
        f"code: {where} holds more than {MAX_CODE_BYTES // 2**20} MB ({total:,} bytes); keep data and weights "
        "out of the code (weights: `warm_start`, data: `dataset.uri`)"
    )


def _source_files(folder: Path) -> list[tuple[str, Path]]:
    """(name in the zip, file) for every file of the user's code, sorted by name."""
    if not folder.is_dir():
        raise InvalidCode(f"code: {folder} is not a folder")
    is_package = (folder / "__init__.py").is_file()
    if is_package and not folder.name.isidentifier():
        raise InvalidCode(f"code: {folder} is a package whose name {folder.name!r} Python cannot import")
    base = folder.parent if is_package else folder  # a package keeps its name
    found, total = [], 0
    for root, dirs, names in os.walk(folder):
        here = Path(root)
        links = [d for d in dirs if (here / d).is_symlink()]
        if links:
            raise InvalidCode(f"code: {here / links[0]} is a link to a folder; copy the folder in instead")
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        for n in names:
            if n.startswith(".") or n.endswith((".pyc", ".pyo")):
                continue
            path = here / n
            name = path.relative_to(base).as_posix()
            _check_name(name, str(folder))
            total += path.stat().st_size
            if total > MAX_CODE_BYTES:
                raise _too_large(total, str(folder))
            found.append((name, path))
    if not any(name.endswith(".py") for name, _ in found):
        raise InvalidCode(f"code: {folder} holds no Python (.py) files; pass your package's folder")
    return sorted(found)


def package_code(folder: Path) -> CodePackage:
    """The user's code as a deterministic zip, or InvalidCode naming what the image cannot run."""
    files = _source_files(folder)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, path in files:
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.create_system = 3  # Unix, wherever the zip is made
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes(), compresslevel=9)
    data = buf.getvalue()
    return CodePackage(data=data, sha256=hashlib.sha256(data).hexdigest(), files=len(files))


def stage_code(package: CodePackage, artifacts_bucket: str, client: Any = None) -> dict[str, str]:
    """Store the package under the artifacts bucket (only if absent); the job's `code` fields."""
    store = S3Store(artifacts_bucket, client=client)
    key = code_key(package.sha256)
    uri = f"s3://{artifacts_bucket}/{key}"
    stored = store.exists(key)
    if not stored:
        store.put(key, package.data, if_absent=True)
    notice.info(
        f"code: {package.files} files, {len(package.data):,} bytes zipped, "
        f"{'already stored' if stored else 'stored'} as {uri}"
    )
    return {"uri": uri, "sha256": package.sha256}


def with_code(raw: dict[str, Any], staged: dict[str, str]) -> dict[str, Any]:
    """The raw job with `code` pointing at the staged package (a `code.transform` is kept)."""
    return {**raw, "code": {**(raw.get("code") or {}), **staged}}


def entry_points(job: Job) -> list[tuple[str, str]]:
    """(field, entry point) of the job's user-code names: a non-built-in model, the transform."""
    found = [] if job.model.name in BUILTIN_MODELS else [("model.name", job.model.name)]
    if job.code is not None and job.code.transform is not None:
        found.append(("code.transform", job.code.transform))
    return found


def check_shipped(job: Job) -> None:
    """For a deployed stack: an entry point outside smlt needs the code in the job (`--code`)."""
    if job.code is not None and job.code.uri is not None:
        return
    for field, name in entry_points(job):
        if name.partition(":")[0].split(".")[0] != "smlt":
            raise InvalidCode(
                f"{field}: {name!r} is not in the train_step image (it holds smlt, torch, torchvision, numpy, "
                "Pillow and safetensors): pass your package with `smlt start JOB --code DIR`"
            )


def check_code_location(job: Job, artifacts_bucket: str) -> None:
    """`code.uri` may name only an object `stage_code` writes: the stack's artifacts bucket, its
    `code/` prefix, a key `code/<sha256>.zip`. The workers run what it names with their role's
    rights, so an object anyone else can write (the data bucket's `incoming/`, another bucket) is
    refused before a worker fetches it; the object's sha256 is checked against the job's when it
    is fetched (`_fetch`)."""
    code = job.code
    if code is None or code.uri is None or not artifacts_bucket:
        return
    try:
        bucket, key = parse_s3_uri(code.uri)
    except ValueError as e:
        raise InvalidCode(f"code.uri: {e}") from None
    if bucket != artifacts_bucket or not _CODE_KEY.fullmatch(key):
        raise InvalidCode(
            f"code.uri: {code.uri} is not a code object of this stack (s3://{artifacts_bucket}/"
            f"{keys.code_key('<sha256>')}); code runs only from the artifacts bucket's {keys.CODE} prefix, "
            "where `--code DIR` stores it: pass --code DIR"
        )


# --------------------------------------------------------------------------------------------
# worker side: fetch, verify, unpack, import

_active: tuple[str, Path, frozenset[str]] | None = None  # (sha256, folder on sys.path, its top-level names)


def _fetch(uri: str, sha256: str) -> bytes:
    try:
        bucket, key = parse_s3_uri(uri)
        data = S3Store(bucket).get(key)
    except ValueError as e:
        raise InvalidCode(f"code.uri: {e}") from None
    except NotFound:
        raise InvalidCode(f"code.uri: no object at {uri}; pass --code DIR again to store it") from None
    except AccessDenied:
        raise AccessDenied(f"code.uri: cannot read {uri} (AccessDenied)") from None
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("AccessDenied", "AllAccessDisabled", "403", "NoSuchBucket"):
            raise AccessDenied(f"code.uri: cannot read {uri} ({code})") from None
        raise
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise InvalidCode(
            f"code.sha256: {uri} has sha256 {got}, the job says {sha256}: the object changed since the job "
            "was made; pass --code DIR again"
        )
    return data


def _extract(data: bytes, dest: Path, uri: str) -> None:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise InvalidCode(f"code.uri: {uri} is not a zip file") from None
    with zf:
        infos = zf.infolist()
        for info in infos:
            _check_name(info.filename, uri)
        total = sum(i.file_size for i in infos)
        if total > MAX_CODE_BYTES:
            raise _too_large(total, uri)
        zf.extractall(dest)


def _unpacked(uri: str, sha256: str) -> Path:
    """The folder holding the verified code: unpacked here once; an earlier process's is reused
    (folders appear whole, by rename, and only from verified bytes)."""
    dest = code_root() / sha256
    if dest.is_dir():
        return dest
    data = _fetch(uri, sha256)
    code_root().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha256[:12]}-", dir=code_root()))
    try:
        _extract(data, tmp, uri)
        tmp.rename(dest)
    except OSError:
        if not dest.is_dir():  # not another process unpacking it first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _top_level(folder: Path) -> frozenset[str]:
    return frozenset(p.name.removesuffix(".py") for p in folder.iterdir())


def _put_first(sha256: str, folder: Path) -> None:
    """`folder` first on sys.path instead of the previously active code, forgetting the modules
    either provides, so a new version of a package is imported afresh."""
    global _active
    names = _top_level(folder)
    if _active is not None:
        old = str(_active[1])
        sys.path[:] = [p for p in sys.path if p != old]
        names |= _active[2]
    for mod in [m for m in sys.modules if m.split(".")[0] in names]:
        del sys.modules[mod]
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    _active = (sha256, folder, _top_level(folder))


def check_importable(job: Job, shipped: frozenset[str] | None = None) -> None:
    """InvalidCode unless the job's entry points import from this process's path (`shipped`: the
    top-level names of the job's code, when it has some)."""
    for field, name in entry_points(job):
        module = name.partition(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if found:
            continue
        if shipped is not None:
            raise InvalidCode(
                f"{field}: no module {module!r} in the job's code (it holds {', '.join(sorted(shipped))}): "
                "pass the folder that holds it with `--code DIR`"
            )
        raise InvalidCode(
            f"{field}: no module {module!r} here: pass your package with `--code DIR` "
            "(`smlt run --local JOB --code DIR`, `smlt start JOB --code DIR`; locally, PYTHONPATH works too)"
        )


def activate_code(job: Job, artifacts_bucket: str = "") -> None:
    """Make the job's code importable in this process (fetched and verified on first use);
    without code in the job, check that its entry points import from the process's own path.
    With `artifacts_bucket`, the code must be the stack's own code object (`check_code_location`)."""
    code = job.code
    if code is None or code.uri is None or code.sha256 is None:
        check_importable(job)
        impose_limits_here(job)
        return
    check_code_location(job, artifacts_bucket)
    if _active is None or _active[0] != code.sha256:
        _put_first(code.sha256, _unpacked(code.uri, code.sha256))
    check_importable(job, shipped=_active[2] if _active else None)
    impose_limits_here(job)


def impose_limits_here(job: Job) -> None:
    """In a process that asks for it (LIMITS_ENV, set by the local engine for its handler
    processes), the job's code from now on meets what a Lambda worker lacks (`smlt.runtime.worker_limits`)."""
    if os.environ.get(LIMITS_ENV):
        impose(user_code_roots(job))


def load_transform(job: Job) -> Callable[..., Any] | None:
    """The job's per-sample transform (`code.transform`), or None when it names none."""
    if job.code is None or job.code.transform is None:
        return None
    activate_code(job)
    from smlt.runtime.train.models import import_entry_module

    module, _, attr = job.code.transform.partition(":")
    try:
        fn = getattr(import_entry_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise InvalidCode(f"code.transform: cannot import {job.code.transform!r} ({e})") from None
    if not callable(fn):
        raise InvalidCode(f"code.transform: {job.code.transform!r} is a {type(fn).__name__}, not a function")
    return fn


# --------------------------------------------------------------------------------------------
# worker side: the user's own error, verbatim

MAX_USER_FRAMES = 6  # the last frames inside the user's package that a UserCodeError shows
MAX_TRACE_CHARS = 3000  # and at most this much of them (an ERROR item, a Lambda error, a CLI line)


def user_code_roots(job: Job) -> list[str]:
    """The folders holding the job's own code: its unpacked `--code` package, and the package of
    each entry point outside smlt (a model or transform importable from the process's path)."""
    roots: list[str] = []
    if _active is not None and job.code is not None and job.code.sha256 == _active[0]:
        roots.append(str(_active[1]))
    for _, name in entry_points(job):
        top = name.partition(":")[0].split(".")[0]
        if top in IMAGE_PACKAGES:
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        if spec.submodule_search_locations:
            roots.extend(str(Path(p).resolve()) for p in spec.submodule_search_locations)
        elif spec.origin:
            roots.append(str(Path(spec.origin).resolve()))
    return [r for r in dict.fromkeys(roots) if r]


def _chain(e: BaseException) -> list[BaseException]:
    """The exception and the ones it was raised from or during (a named error raised `from None`
    keeps the user's exception as its context)."""
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _inside(filename: str, roots: list[str]) -> str | None:
    """The frame's file relative to the user's folder it is in, or None."""
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return None
    for root in roots:
        if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
            base = Path(root).parent if Path(root).is_file() or (Path(root) / "__init__.py").exists() else Path(root)
            return str(Path(path).relative_to(base))
    return None


def user_code_failure(e: BaseException, job: Job | None) -> UserCodeError | None:
    """A UserCodeError when `e` (or the exception it was raised from) came from inside the user's
    code: its type, message and last frames there; None when the user's code is not involved."""
    if job is None:
        return None
    roots = user_code_roots(job)
    if not roots:
        return None
    for exc in _chain(e):
        if isinstance(exc, SyntaxError) and exc.filename and (where := _inside(exc.filename, roots)):
            line = (exc.text or "").strip()
            trace = f'  File "{where}", line {exc.lineno}\n    {line}'
            return _user_error(exc, trace)
        frames = _frames_text(exc, roots)
        if frames is not None:
            return _user_error(exc, frames)
    return None


def _frames_text(exc: BaseException, roots: list[str]) -> str | None:
    """The last MAX_USER_FRAMES frames of `exc`'s traceback inside the user's files, as Python
    prints them (paths relative to the code's root); None when none is there."""
    frames = [
        (where, f) for f in traceback.extract_tb(exc.__traceback__) if (where := _inside(f.filename, roots)) is not None
    ]
    if not frames:
        return None
    shown = frames[-MAX_USER_FRAMES:]
    lines = [f'  File "{w}", line {f.lineno}, in {f.name}' + (f"\n    {f.line}" if f.line else "") for w, f in shown]
    more = len(frames) - len(shown)
    return (f"  ... {more} earlier frames in your code\n" if more else "") + "\n".join(lines)


def user_trace(e: BaseException, job: Job | None) -> str | None:
    """Where `e` was in the user's code when it was raised into it (a watchdog's stop): its frames
    there, as a worker's UserCodeError shows them; None when none is in the user's files."""
    roots = user_code_roots(job) if job is not None else []
    return _frames_text(e, roots) if roots else None


def model_failure(e: BaseException, job: Job | None) -> UserCodeError:
    """What the job's own model raised in its forward or backward pass, as the user's error: its
    frames in the user's files, or, with none there (a `nn.Sequential` of torch's layers), the
    model named instead."""
    found = user_code_failure(e, job)
    if found is not None:
        return found
    name = job.model.name if job is not None else "the model"
    return _user_error(e, f"  (raised inside torch by model.name {name!r}: no frame of it is in your files)")


def _user_error(exc: BaseException, trace: str) -> UserCodeError:
    """The worker's form (one text), with the exception's type kept for the run's records."""
    error = UserCodeError(_user_message(exc, trace))
    error.type = type(exc).__name__
    return error


# What a worker's machine lacks, said where an error's own words do not.
NO_GPU = "the workers run on CPU: Lambda has no GPU; leave out .cuda() and device='cuda'"
_GPU_ERRORS = ("not compiled with CUDA", "no NVIDIA driver", "CUDA driver", "MPS backend", "not built with MPS")


ONE_ROW = "batch norm needs 2 or more rows per training batch: set training.batch_size to at least 2"
WEIGHTS = (
    "pretrained weights: put the weights file in the code folder (--code DIR ships up to 50 MB) and load it "
    "beside the module (torch.load(Path(__file__).parent / NAME)), or build without them (weights=None) and "
    "start from a stored model with warm_start"
)
READ_ONLY = (
    "a worker's file system is read-only but for /tmp, and its current folder is the image's code folder: write "
    "under tempfile.gettempdir() (a file beside your module works too: the code is unpacked under /tmp), or not at all"
)
CACHE = (
    "a worker's file system is read-only but for /tmp, $HOME too, where torch.hub, torchvision's weights= and "
    "Hugging Face keep their downloads: " + WEIGHTS
)
_CACHES = ("/.cache/", "/torch/hub", "huggingface")


_READ_ONLY_PATH = re.compile(r"Read-only file system: '(?P<path>[^']+)'")


def _in_cache(message: str) -> bool:
    """Whether a read-only error names $HOME, a download cache (TORCH_HOME, HF_HOME...), a folder
    in one or one holding one (makedirs stops at the first folder it cannot make)."""
    if any(m.lower() in message.lower() for m in _CACHES):
        return True
    m = _READ_ONLY_PATH.search(message)
    if m is None or not os.path.isabs(m["path"]):  # a relative path: the current folder
        return False
    path = m["path"].rstrip("/")
    caches = [os.path.expanduser("~/.cache"), *(os.environ.get(v) for v in ("TORCH_HOME", "HF_HOME", "XDG_CACHE_HOME"))]
    return any(path and (within(path, [c]) or within(c, [path])) for c in (c.rstrip("/") for c in caches if c))


NO_SHM = (
    "Lambda has no /dev/shm, so multiprocessing's Pool, Queue and Lock, torch.multiprocessing and "
    "DataLoader(num_workers>0) cannot run on a worker: leave them out (num_workers=0), or use threads "
    "(concurrent.futures.ThreadPoolExecutor)"
)
OFFLINE = (
    "a worker may not reach the internet (a stack with the exchange runs its workers in a VPC that reaches S3 and "
    "DynamoDB only), and each worker would download it again at every cold start: " + WEIGHTS
)
RELATIVE = (
    "a path relative to the current folder, which on a worker is the image's code folder, not yours: open a file "
    "shipped with your code beside the module (Path(__file__).parent / NAME), data through the dataset"
)
_MISSING_PATH = re.compile(r"\[Errno 2\] No such file or directory: '(?P<path>[^']+)'")
_READ_ONLY_ERRORS = ("[Errno 30] Read-only file system",)
_NO_SHM_ERRORS = ("[Errno 38] Function not implemented",)
_OFFLINE_ERRORS = (
    "no internet connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "nodename nor servname provided",
    "Network is unreachable",
    "Failed to establish a new connection",
    "urlopen error",
    "couldn't connect to 'https://huggingface.co'",
)


def hint(message: str) -> str:
    """`message` with what to do when its own words do not say it (a GPU asked for on a worker,
    batch norm given a training batch of one row, a write outside /tmp, multiprocessing, a download)."""
    low = message.lower()
    if any(w.lower() in low for w in _GPU_ERRORS):
        return f"{message} ({NO_GPU})"
    if "Expected more than 1 value per channel when training" in message:
        return f"{message} ({ONE_ROW})"
    missing = _MISSING_PATH.search(message)
    if missing is not None and not os.path.isabs(missing["path"]):
        return f"{message} ({RELATIVE})"
    if any(w.lower() in low for w in _READ_ONLY_ERRORS):
        return f"{message} ({CACHE if _in_cache(message) else READ_ONLY})"
    for found, advice in ((_NO_SHM_ERRORS, NO_SHM), (_OFFLINE_ERRORS, OFFLINE)):
        if any(w.lower() in low for w in found):
            return f"{message} ({advice})"
    return message


def _user_message(exc: BaseException, trace: str) -> str:
    text = hint(str(exc) if not isinstance(exc, SyntaxError) else (exc.msg or str(exc)))
    message = f"your code raised {type(exc).__name__}: {text}"
    if len(trace) > MAX_TRACE_CHARS:
        trace = "  ...\n" + trace[-MAX_TRACE_CHARS:]
    return f"{message}\n{trace}\n{FIX_AND_START_AGAIN}"


_FRAME = re.compile(r'\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>.+))?')


def read_user_message(text: str) -> tuple[str, list[str]]:
    """A worker's UserCodeError text (`_user_message`) read back: the message ("your code raised
    T: ...", every line of it) and the frames as the client's check shows them ("file:line in
    function: source", innermost last; "... N earlier frames" kept as it is)."""
    lines = [line for line in text.splitlines() if line.strip() != FIX_AND_START_AGAIN]
    first = next((i for i, line in enumerate(lines) if _FRAME.fullmatch(line) or line.startswith("  ...")), len(lines))
    frames: list[str] = []
    source_due = False  # the line after a frame is its source line
    for line in lines[first:]:
        m = _FRAME.fullmatch(line)
        if m:
            frames.append(f"{m['file']}:{m['line']}" + (f" in {m['fn']}" if m["fn"] else ""))
            source_due = True
        elif source_due and line.startswith("    "):
            frames[-1] += f": {line.strip()}"
            source_due = False
        elif line.strip():
            frames.append(line.strip())
            source_due = False
    return "\n".join(lines[:first]).strip(), frames
