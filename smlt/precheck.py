"""The job's model, built here once before anything starts (`smlt run --local`, `smlt start`,
`smlt tune`): no engine, stack, upload or worker is paid for a model that cannot train.

On a few validation samples of the job's (local) dataset: the user's code is imported and the
model built (built-ins too), a forward pass run (and the `code.transform`), the output width
checked against the dataset's classes or targets, the memory training needs measured with the
workers' own rule (`smlt.runtime.steps.train`) against the deployed memory tiers, and a target the
untrained model already meets refused. An exception raised in the user's own files is shown as
`UserCodeError`: its type, its message and the frames in those files.

A dataset on S3 (`smlt start` with an s3:// dataset.uri) is read with the user's own AWS
credentials: its manifest.json, and at most one small validation shard (SHARD_MAX_BYTES; with
none that small the samples are zeros of the manifest's recorded shape and dtype, and the target
check is left to the run), never the whole dataset.
"""

from __future__ import annotations

import gc
import importlib.util
import linecache
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from smlt.runtime import deployed
from smlt.runtime.capacity import MAX_MB
from smlt.runtime.data.manifest import Manifest, parse_manifest
from smlt.runtime.data.prepare import read_local_manifest
from smlt.runtime.errors import (
    InvalidCode,
    InvalidDataset,
    InvalidJob,
    ModelTooLarge,
    SmltError,
    UserCodeError,
)
from smlt.runtime.evaluation import balanced_problem, lower_is_better, target_metric_problem, val_metrics
from smlt.runtime.job import BUILTIN_MODELS, Job
from smlt.runtime.progress import notice
from smlt.runtime.train.watchdog import Stalled, time_limit
from smlt.runtime.usercode import check_importable, entry_points, hint
from smlt.runtime.worker_limits import lambda_limits

SAMPLE_ROWS = 2  # the forward pass's batch (batch norm in training mode needs more than one row)
EVAL_ROWS = 4096  # validation rows the untrained model is evaluated on for a target check
EVAL_BYTES = 64 << 20  # ... at most this much of them in memory
EVAL_FLOPS = 2e11  # ... and not when their forward passes would cost more (a few seconds here)
EVAL_BATCH = 256
MAX_FRAMES = 6  # frames of the user's code shown, the innermost last
REBUILD_BYTES = 256 << 20  # a user's model is built a second time (is it the same?) up to this size
MIN_CALL_S = 30.0  # the least time a call into the user's model gets here (`_call_limit_s`)

T = TypeVar("T")


def check_model(job: Job, folder: Path | None, code: Path | None = None, *, deployed: bool = False) -> None:
    """Build and try the job's model on its local dataset folder (None: an s3:// dataset, see
    `check_s3_model`); `code`: the `--code DIR` folder; `deployed`: for the deployed stack, where
    what only this machine holds is refused (a warning otherwise). Raises UserCodeError,
    InvalidJob, InvalidCode, InvalidDataset or ModelTooLarge naming what to change."""
    if folder is None:
        return
    manifest = read_local_manifest(folder)
    x, y = _sample_rows(folder, manifest, _eval_rows(manifest))
    _check(job, manifest, x, y, code, deployed)


def check_s3_model(job: Job, uri: str, code: Path | None = None, client: Any = None) -> None:
    """The same checks for a dataset on S3, read with the caller's credentials (`client`: an S3
    client, default the CLI's): its manifest (checked against the job) and at most one small
    validation shard. AccessDenied or AwsNotConfigured naming the object when it cannot be read."""
    from smlt.runtime.job import check_dataset

    with _user_code(code):
        check_importable(job)  # what needs no AWS request is named first
    store = _s3_dataset(uri, client)
    manifest = parse_manifest(_s3_get(store, "manifest.json"), f"dataset.uri: {uri.rstrip('/')}/manifest.json")
    check_dataset(job, manifest)
    x, y = _s3_sample_rows(store, manifest, _eval_rows(manifest))
    _check(job, manifest, x, y, code, deployed=True)


def _eval_rows(manifest: Manifest) -> int:
    per_row = 4 * math.prod(manifest.x.shape)  # float32 once it is the model's input
    return max(SAMPLE_ROWS, min(EVAL_ROWS, EVAL_BYTES // per_row))


def _check(
    job: Job, manifest: Manifest, x: np.ndarray, y: np.ndarray | None, code: Path | None, deployed: bool = False
) -> None:
    """The checks on `x` (stored rows, or zeros of the recorded shape when `y` is None)."""
    from smlt.runtime.train.models import state_form

    with _user_code(code) as roots, _torch_defaults_kept(job):
        check_importable(job)
        roots = roots or _entry_point_roots(job)
        with lambda_limits(roots):  # a write outside /tmp, multiprocessing: refused as on a worker
            with _watch_reads() as reads:
                model = _build(job, manifest, roots)
                _check_cpu(job, model)
                _check_registered(job, model)
                built = state_form(model.state_dict())
                with _value_reads(job, roots) as values:
                    _try_forward(job, manifest, model, x[:SAMPLE_ROWS], roots)
                _tell_value_reads(job, values)
                _check_state_kept(job, model, built)
                _try_forward(job, manifest, model, x[:1], roots)  # a last validation batch may hold one row
                _try_transform(job, manifest, model, x[:SAMPLE_ROWS], roots)
                _try_train_step(job, manifest, model, x, y, roots)
                _check_non_persistent(job, manifest, model, x[:SAMPLE_ROWS], roots)
                if job.model.name not in BUILTIN_MODELS:
                    _check_repeatable(job, manifest, model, x[:SAMPLE_ROWS], roots)
            _check_reads(job, reads, roots, deployed)
            flops = _check_memory(job, manifest, model, roots)
            if y is not None:  # zeros say nothing of a target
                _check_target(job, manifest, model, x, y, flops, roots)


# --- the user's code -------------------------------------------------------------------------


_CHANGED_DEFAULTS: list[str] = []  # what the user's code changed of torch's settings, during one check


def _reset_defaults() -> list[str]:
    """torch's defaults set back (as a worker does before each call); everything changed so far."""
    from smlt.runtime.train.models import reset_torch_defaults

    _CHANGED_DEFAULTS.extend(reset_torch_defaults())
    return _CHANGED_DEFAULTS


@contextmanager
def _torch_defaults_kept(job: Job) -> Iterator[None]:
    """The process's torch defaults as they were, whatever the user's code set (this is the
    caller's process: a notebook's `smlt.train`); a warning names what it changed, which a
    worker sets back before each call."""
    _CHANGED_DEFAULTS.clear()
    try:
        yield
    finally:
        changed = list(dict.fromkeys(_reset_defaults()))
        if changed:
            notice.warning(
                f"model.name: {job.model.name!r} changes torch's settings for the whole process "
                f"({', '.join(changed)}, in its builder, forward or transform): the workers set them back before "
                "each call (float32, gradients on), so the model trains as built; leave it out, or set a dtype "
                "per layer (nn.Linear(..., dtype=torch.float64)) and use torch.no_grad() as a context"
            )


@contextmanager
def _user_code(code: Path | None) -> Iterator[list[Path]]:
    """`--code DIR` importable for the check (first on sys.path, as on a worker); the folders
    whose files are the user's. Modules it provided are forgotten afterwards."""
    if code is None:
        yield []
        return
    code = code.resolve()
    base = code.parent if (code / "__init__.py").is_file() else code
    names = {code.name} if base != code else {p.name.removesuffix(".py") for p in code.iterdir()}

    def forget() -> None:
        for mod in [m for m in sys.modules if m.split(".")[0] in names]:
            del sys.modules[mod]

    forget()
    sys.path.insert(0, str(base))
    importlib.invalidate_caches()
    try:
        yield [code]
    finally:
        sys.path.remove(str(base))
        forget()


def _entry_point_roots(job: Job) -> list[Path]:
    """Without --code: the top-level packages (or modules) the job's entry points import from."""
    roots = []
    for _, name in entry_points(job):
        top = name.partition(":")[0].split(".")[0]
        spec = importlib.util.find_spec(top)
        if spec is not None and spec.origin:
            origin = Path(spec.origin).resolve()
            roots.append(origin.parent if origin.name == "__init__.py" else origin)
    return roots


def _under(filename: str, roots: Sequence[Path]) -> bool:
    path = Path(filename).resolve()
    return any(path == r or r in path.parents for r in roots)


def user_frames(exc: BaseException, roots: Sequence[Path]) -> list[str]:
    """The traceback's frames in the user's files ("path:line in function: source"), innermost
    last; for a SyntaxError also where the parser stopped."""
    shown = []
    for f in traceback.extract_tb(exc.__traceback__):
        if _under(f.filename, roots):
            shown.append(f"{_short(f.filename, roots)}:{f.lineno} in {f.name}: {(f.line or '').strip()}")
    if isinstance(exc, SyntaxError) and exc.filename and _under(exc.filename, roots):
        shown.append(f"{_short(exc.filename, roots)}:{exc.lineno}: {(exc.text or '').strip()}")
    return shown[-MAX_FRAMES:]


def _short(filename: str, roots: Sequence[Path]) -> str:
    path = Path(filename).resolve()
    for r in roots:
        if path == r or r in path.parents:
            return path.relative_to(r.parent).as_posix()
    return filename


def _message(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"{exc.msg} ({Path(exc.filename or '?').name}, line {exc.lineno})"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"


def _users(
    fn: Callable[[], T],
    roots: Sequence[Path],
    where: str,
    own: bool,
    fallback: Callable[[Exception], SmltError],
    limit_s: float | None = None,
) -> T:
    """fn(); an exception it raises is the user's (UserCodeError) when it passed through their
    files or `own` says the code is theirs, else `fallback(exc)`. smlt's named errors pass as they are.
    `limit_s`: fn is stopped after that long (an endless loop), InvalidJob saying where it was."""
    try:
        with time_limit(limit_s):
            return fn()
    except Stalled as e:
        at = user_frames(e, roots)
        raise InvalidJob(
            f"{where}: did not finish in {limit_s:.3g} s"
            + (f" (stopped at {at[-1]})" if at else "")
            + f": an endless loop, a sleep or a read that waits? A worker gives one training step of "
            f"training.batch_size rows at most {0.8 * _worker_timeout_s():,.0f} s (0.8 of the "
            f"{_worker_timeout_s():,.0f} s Lambda timeout): make it finish"
        ) from None
    except SmltError as e:
        cause = e.__context__
        if isinstance(e, InvalidJob) and isinstance(cause, Exception) and user_frames(cause, roots):
            raise _user_error(cause, roots, where) from None  # the builder's own TypeError, not the params
        raise
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything
        if own or user_frames(e, roots):
            error = _user_error(e, roots, where)
            _let_go(e)
            raise error from None
        raise fallback(e) from None


def _let_go(e: BaseException) -> None:
    """Free what the user's code left half made in the frames of its exception, now: a cleanup of
    torch's that fails on it (a DataLoader iterator whose workers were refused their queue) would
    print its own traceback under the named error when the process ends."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        for exc in [e, *(c for c in (e.__cause__, e.__context__) if c is not None)]:
            traceback.clear_frames(exc.__traceback__)
        gc.collect()
    finally:
        sys.unraisablehook = hook


def _call_limit_s(job: Job, rows: int) -> float:
    """How long one call of the model on `rows` rows may take here: what a worker gives one training
    step of the job's batch (0.8 of its timeout), scaled to `rows`, and at least MIN_CALL_S (a first
    call's own setup on a busy machine). A step slower than that is refused anyway (`_check_step_time`)."""
    return max(MIN_CALL_S, 0.8 * _worker_timeout_s() * rows / job.training.batch_size)


def _user_error(e: BaseException, roots: Sequence[Path], where: str) -> UserCodeError:
    return UserCodeError(type(e).__name__, hint(_message(e)), user_frames(e, roots), where)


# --- files of this machine ---------------------------------------------------------------------

# The files opened while the user's code runs in the check (None: not watching): (path, whether
# for writing, the stack then). An audit hook cannot be removed, so one is added once and does
# nothing but while a check watches.
_opened: list[tuple[str, bool, traceback.StackSummary]] | None = None
_hooked = False
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# What a worker has too: the system's own files, and Python's (imports are smlt.code_imports' concern).
_SYSTEM = ("/dev", "/proc", "/sys", "/etc", "/usr", "/lib", "/lib64", "/bin", "/opt/conda")
_CODE_FILES = (".py", ".pyc", ".pyi", ".pth", ".so", ".pyd", ".dylib")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    global _opened
    if event != "open" or _opened is None:
        return
    opened, _opened = _opened, None  # what this hook runs opens nothing it records
    try:
        path, mode, flags = (*args, None, None)[:3]
        name = os.fsdecode(path) if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__") else ""
        if name and not name.endswith(_CODE_FILES):  # not a file descriptor, not an import
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITES)
            stack = traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False)
            stack.reverse()
            relative = not os.path.isabs(name)  # read from the current folder, a worker's is not this one
            opened.append((os.path.abspath(name) + ("\0" if relative else ""), writes, stack))
    finally:
        _opened = opened


@contextmanager
def _watch_reads() -> Iterator[list[tuple[str, bool, traceback.StackSummary]]]:
    global _opened, _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked = True
    opened: list[tuple[str, bool, traceback.StackSummary]] = []
    _opened = opened
    try:
        yield opened
    finally:
        _opened = None


def _check_reads(
    job: Job, opened: list[tuple[str, bool, traceback.StackSummary]], roots: Sequence[Path], deployed: bool
) -> None:
    """A file the user's code read that a worker does not have: one outside the code folder, the
    system's and Python's own files, and the files the code wrote itself (a path of this machine,
    `open("/home/me/vocab.txt")`, a relative path read from the current folder, pretrained weights
    in ~/.cache). Refused for the deployed stack (InvalidCode), a warning for a local run (its
    handlers share this machine's files)."""
    written = {path.removesuffix("\0") for path, writes, _ in opened if writes}
    ok = [
        *(str(r) for r in roots),
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        str(Path(__file__).parent),
    ]  # smlt's own package
    ok += list(_SYSTEM)
    found: dict[str, str] = {}
    for marked, writes, stack in opened:
        path, relative = marked.removesuffix("\0"), marked.endswith("\0")
        if writes or path in written or path in found or path.endswith(_CODE_FILES) or not os.path.isfile(path):
            continue
        if not relative and any(path == a or path.startswith(a.rstrip("/") + "/") for a in ok):
            continue
        frames = [f for f in stack if _under(f.filename, roots)]
        if not frames:  # opened by smlt or torch for their own use, not by the user's code
            continue
        found[path] = f" ({_short(frames[-1].filename, roots)}:{frames[-1].lineno} in {frames[-1].name})"
    if not found:
        return
    shown = ", ".join(f"{p}{at}" for p, at in list(found.items())[:3]) + (
        f" and {len(found) - 3} more" if len(found) > 3 else ""
    )
    what = (
        f"code: your code reads {'a file' if len(found) == 1 else 'files'} of this machine: {shown}; the workers "
        f"do not have {'it' if len(found) == 1 else 'them'}: put small files in the code folder (--code DIR, up to "
        "50 MB) and open them beside the module (Path(__file__).parent / NAME, not a path relative to the "
        "current folder), data in the dataset, weights in warm_start"
    )
    if deployed:
        raise InvalidCode(what)
    notice.warning(f"{what} (a local run reads this machine's files, so it runs; the deployed stack would not)")


# --- the checks ------------------------------------------------------------------------------


def _shape(manifest: Manifest) -> str:
    return "x".join(str(d) for d in manifest.x.shape) or "scalar"


def _build(job: Job, manifest: Manifest, roots: Sequence[Path]) -> Any:
    from smlt.runtime.train.models import build_model

    spec = job.model
    own = spec.name not in BUILTIN_MODELS

    def fallback(e: Exception) -> SmltError:
        return InvalidJob(
            f"model: {spec.name} cannot be built for {manifest.name}'s samples ({_shape(manifest)}, "
            f"{manifest.outputs} outputs): {type(e).__name__}: {_message(e)}"
        )

    return _users(
        lambda: build_model(spec, manifest.input_shape, manifest.outputs, job.seed, vocab_size=manifest.vocab_size),
        roots,
        f"building model.name {spec.name!r}",
        own,
        fallback,
        max(MIN_CALL_S, 0.8 * _worker_timeout_s()),  # a worker's whole call
    )


def _check_cpu(job: Job, model: Any) -> None:
    """The workers run on CPU (Lambda has no GPU): a model built on a GPU of this machine (CUDA,
    Apple's MPS) passes here and fails on every worker."""
    where = next(
        (t.device for t in [*model.parameters(), *model.buffers()] if t.device.type != "cpu"),
        None,
    )
    if where is not None:
        raise InvalidJob(
            f"model.name: {job.model.name!r} puts its weights on {where}, but the workers run on CPU (Lambda has "
            f"no GPU): leave out .cuda() and .to({where.type!r}), or choose the device with "
            f"torch.cuda.is_available() (False on a worker)"
        )


def _check_registered(job: Job, model: Any) -> None:
    """Modules in a plain list or dict, or a tensor that requires grad as a plain attribute:
    PyTorch does not see them (not in `parameters()` nor the state), so the optimizer never trains
    them and the model file leaves them out. Held by the model only (a list of modules registered
    elsewhere too is fine)."""
    import torch
    from torch import nn

    known = {id(p) for p in model.parameters()}
    for path, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_") or not isinstance(value, (list, tuple, dict, torch.Tensor)):
                continue
            items = list(value.values()) if isinstance(value, dict) else [value] if torch.is_tensor(value) else value
            where = f"{path}.{attr}" if path else attr
            for item in items:
                if isinstance(item, nn.Module) and any(id(p) not in known for p in item.parameters()):
                    holder = "ModuleDict" if isinstance(value, dict) else "ModuleList"
                    raise InvalidJob(
                        f"model.name: {job.model.name!r} holds modules in a plain {type(value).__name__} "
                        f"(self.{where}): PyTorch does not see their parameters, so training never changes them "
                        f"and the model file leaves them out: hold them in nn.{holder}"
                    )
                if torch.is_tensor(item) and item.requires_grad and id(item) not in known:
                    raise InvalidJob(
                        f"model.name: {job.model.name!r} holds a tensor that requires grad as a plain attribute "
                        f"(self.{where}, {tuple(item.shape)}): PyTorch does not see it, so training never changes "
                        "it and the model file leaves it out: make it an nn.Parameter"
                    )


# What reads a tensor's value into Python: torch.export (`smlt export`) cannot trace past it.
_VALUE_READS = ("item", "tolist", "numpy", "__array__", "__float__", "__int__", "__bool__", "__index__")


@contextmanager
def _value_reads(job: Job, roots: Sequence[Path]) -> Iterator[list[str]]:
    """Where the user's own files read a tensor's value into Python while it lasts (`.item()`,
    `float(t)`, `.numpy()`, `if t > 0:`), "file:line in function: source", the first only."""
    import torch

    seen: list[str] = []
    if job.model.name in BUILTIN_MODELS:
        yield seen
        return
    theirs: dict[str, bool] = {}
    saved = {n: getattr(torch.Tensor, n) for n in _VALUE_READS}
    own = {n for n in _VALUE_READS if n in vars(torch.Tensor)}  # the rest are torch.Tensor's base class's

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: Any, *args: Any, **kwargs: Any) -> Any:
            f = sys._getframe(1)
            name = f.f_code.co_filename
            if not seen and theirs.setdefault(name, _under(name, roots)):
                line = (linecache.getline(name, f.f_lineno) or "").strip()
                seen.append(f"{_short(name, roots)}:{f.f_lineno} in {f.f_code.co_name}: {line}")
            return fn(self, *args, **kwargs)

        return read

    for n, fn in saved.items():
        setattr(torch.Tensor, n, wrap(fn))
    try:
        yield seen
    finally:
        for n, fn in saved.items():
            if n in own:
                setattr(torch.Tensor, n, fn)
            else:
                delattr(torch.Tensor, n)


def _tell_value_reads(job: Job, seen: list[str]) -> None:
    if seen:
        notice.warning(
            f"model.name: {job.model.name!r} reads a tensor's value into Python in its forward pass ({seen[0]}; "
            ".item(), float(), int(), .numpy() or a branch on a tensor): it trains (the value is a constant to "
            "the gradient), but `smlt export` cannot trace it: keep it a tensor (torch.where, torch.clamp, "
            "x.amax()) if the model is to be exported"
        )


def _try_forward(job: Job, manifest: Manifest, model: Any, x: np.ndarray, roots: Sequence[Path]) -> None:
    import torch

    from smlt.runtime.data.inputs import model_input

    name = job.model.name

    def forward() -> Any:
        model.eval()
        with torch.no_grad():
            return model(torch.from_numpy(model_input(manifest, x)))

    def fallback(e: Exception) -> SmltError:
        return InvalidDataset(
            f"model: {name} does not take {manifest.name}'s samples ({_shape(manifest)}): "
            f"{type(e).__name__}: {_message(e)}"
        )

    where = (
        f"the forward pass of model.name {name!r} on {len(x)} sample{'s' * (len(x) != 1)} of shape {_shape(manifest)}"
    )
    out = _users(forward, roots, where, name not in BUILTIN_MODELS, fallback, _call_limit_s(job, len(x)))
    _check_outputs(job, manifest, out, len(x))


def _check_outputs(job: Job, manifest: Manifest, out: Any, rows: int) -> None:
    """The model gives (rows, outputs): one logit per class, or one value per regression target."""
    import torch

    name = job.model.name
    if not isinstance(out, torch.Tensor):
        what, hint = type(out).__name__, ""
        if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
            what += f" of {len(out)} tensor{'s' * (len(out) > 1)}"
            hint = ": return the logits tensor alone (`return out[0]`)"
        elif isinstance(out, dict) or hasattr(out, "logits"):
            keys = list(out.keys()) if isinstance(out, dict) else []
            what += f" with keys {keys}" if keys else ""
            pick = "logits" if "logits" in keys or not keys else keys[0]
            hint = f": return the logits tensor alone (`return out[{pick!r}]`; a Hugging Face model's `.logits`)"
        raise InvalidJob(f"model.name: {name!r} returned {what} from its forward pass, not a tensor{hint}")
    if out.device.type != "cpu":
        raise InvalidJob(
            f"model.name: {name!r} gives its outputs on {out.device}, but the workers run on CPU (Lambda has no "
            f"GPU): leave out .cuda() and .to({out.device.type!r}) in forward"
        )
    want = manifest.outputs
    what = (
        f"{manifest.name} has {want} classes"
        if manifest.task == "classification"
        else f"{manifest.name} has {want} regression target{'s' * (want != 1)}"
    )
    if out.ndim != 2 or out.shape[0] != rows:
        one = (
            " (a validation batch may hold one row: x.squeeze() drops its batch dimension too; name the dimension, "
            "x.squeeze(1))"
            if rows == 1 and tuple(out.shape) == (want,)
            else ""
        )
        raise InvalidJob(
            f"model.name: {name!r} gives outputs of shape {tuple(out.shape)} for a batch of {rows} "
            f"sample{'s' * (rows != 1)}; smlt needs ({rows}, {want}): one output per "
            f"{'class' if manifest.task == 'classification' else 'target'} and sample ({what}){one}"
        )
    got = int(out.shape[1])
    if got != want:
        raise InvalidJob(
            f"model.name: {name!r} gives {got} outputs per sample, but {what}: "
            f"{'too many' if got > want else 'too few'} (build_model gets output_dim={want}: make its last layer "
            f"{want} wide)"
        )
    classification = manifest.task == "classification"
    if not out.is_floating_point():
        raise InvalidJob(
            f"model.name: {name!r} gives {str(out.dtype).removeprefix('torch.')} outputs; smlt's loss needs "
            f"floating-point {'logits (one per class)' if classification else 'values'} with a gradient: return the "
            "last layer's output as it is (no .round(), .long(), .int() or argmax in forward)"
        )
    if classification and want > 1 and _probabilities(out):
        raise InvalidJob(
            f"model.name: {name!r} ends in a softmax: its outputs are probabilities (each row sums to 1); smlt's "
            "loss (cross-entropy) applies the softmax itself and needs the logits, so training on probabilities "
            "learns slowly and badly: return the last layer's output without softmax (log_softmax is fine; "
            "predictions give the probabilities)"
        )


def _type_name(v: Any) -> str:
    module = type(v).__module__.split(".")[0]
    return type(v).__name__ if module == "builtins" else f"{module}.{type(v).__name__}"


def _probabilities(out: Any) -> bool:
    """Every row non-negative, at most 1 and summing to 1: a softmax's output, not logits."""
    import torch

    v = out.detach().double()
    ones = torch.ones(len(v), dtype=v.dtype)
    return bool((v >= 0).all() and (v <= 1).all() and torch.allclose(v.sum(1), ones, atol=1e-4))


def _try_transform(job: Job, manifest: Manifest, model: Any, x: np.ndarray, roots: Sequence[Path]) -> None:
    """The `code.transform` on each sample, then the model on what it gives (as training does).
    It runs on training samples only (evaluation and predictions see the stored samples), so it
    must give a tensor of the sample's own shape and dtype."""
    if job.code is None or job.code.transform is None:
        return
    import torch

    from smlt.runtime.data.inputs import model_input

    batch = torch.from_numpy(model_input(manifest, x))
    out = _transformed(job, manifest, batch, roots)
    where = f"the forward pass of model.name {job.model.name!r} on what code.transform gives ({tuple(out.shape)})"

    def forward() -> Any:
        model.eval()
        with torch.no_grad():
            return model(out)

    out = _users(forward, roots, where, True, lambda e: InvalidJob(str(e)), _call_limit_s(job, len(x)))
    _check_outputs(job, manifest, out, len(x))


def _transformed(job: Job, manifest: Manifest, batch: Any, roots: Sequence[Path]) -> Any:
    """The batch through the job's `code.transform`, sample by sample (as a worker applies it: on
    a copy, so a transform that changes its sample in place leaves the check's stored samples as
    they are); InvalidJob when a sample comes back as something else than a tensor of its shape
    and dtype."""
    import torch

    from smlt.runtime.usercode import load_transform

    fn = load_transform(job)
    assert fn is not None and job.code is not None
    name = job.code.transform
    where = f"code.transform {name!r} on one sample of shape {_shape(manifest)}"
    limit = _call_limit_s(job, len(batch))
    batch = batch.clone()  # the stored rows it may view (model_input gives float32 rows as they are)
    samples = _users(lambda: [fn(s) for s in batch], roots, where, True, lambda e: InvalidJob(str(e)), limit)
    sample = batch[0]
    for got in samples:
        if not isinstance(got, torch.Tensor):
            raise InvalidJob(
                f"code.transform: {name!r} returned {_type_name(got)} for a sample, not a torch.Tensor: return a tensor "
                "(torch.from_numpy(a) for a NumPy array)"
            )
        if tuple(got.shape) != tuple(sample.shape) or got.dtype != sample.dtype:
            raise InvalidJob(
                f"code.transform: {name!r} turns a sample of shape {tuple(sample.shape)} "
                f"({str(sample.dtype).removeprefix('torch.')}) into {tuple(got.shape)} "
                f"({str(got.dtype).removeprefix('torch.')}); it runs on training samples only (evaluation and "
                "predictions see the samples as stored), so it must keep each sample's shape and dtype: change the "
                "data with `smlt data prepare` (e.g. --image-size) instead"
            )
    return torch.stack(samples)


def _try_train_step(
    job: Job, manifest: Manifest, model: Any, x: np.ndarray, y: np.ndarray | None, roots: Sequence[Path]
) -> None:
    """One training step as a worker takes it (training mode, the loss, the backward pass) on a
    batch of the job's batch size or SAMPLE_ROWS, whichever is smaller, without the optimizer's
    step: what fails only in training mode (dropout, batch norm on one row, a branch on
    `self.training`) is the user's error here, and a model that nothing trains is refused. It is
    the memory check's measurement too (`smlt.runtime.train.measure`: the model, its buffers and
    the random state are left as they were), and timed."""
    import torch

    from smlt.runtime.data.inputs import model_input
    from smlt.runtime.steps.train import _loss_fn
    from smlt.runtime.train.measure import MEASURE_ROWS, measure, remember
    from smlt.runtime.train.models import check_trainable

    name = job.model.name
    check_trainable(model, name)
    rows = min(job.training.batch_size, SAMPLE_ROWS)
    xb = torch.from_numpy(model_input(manifest, x[:rows]))
    if job.code is not None and job.code.transform is not None:
        xb = _transformed(job, manifest, xb, roots)
    yb = torch.from_numpy(
        np.zeros((rows, *manifest.y.shape), manifest.y.dtype) if y is None else np.ascontiguousarray(y[:rows])
    )
    where = f"a training step of model.name {name!r} (training mode, forward and backward) on a batch of {rows}"

    def inspect(out: Any) -> None:
        _check_outputs(job, manifest, out, rows)
        if not out.requires_grad:
            raise InvalidJob(
                f"model.name: {name!r} gives outputs that do not depend on its trainable parameters (no gradient "
                "reaches them), so training would not change the model: leave out .detach(), torch.no_grad(), "
                ".item() or a NumPy round trip in forward"
            )
        if y is not None and not bool(torch.isfinite(out).all()):  # zeros in place of samples say nothing
            raise InvalidJob(
                f"model.name: {name!r} gives NaN or Inf outputs for validation samples before any training "
                "(their inputs are finite; a log or sqrt of a negative value or a division by zero? numeric "
                "features are standardised, about half of them negative), so the run would fail at once as "
                "Diverged: make the forward pass finite for any input"
            )

    ungraded: list[tuple[str, int]] = []  # trainable parameters the backward pass left without a gradient

    def graded() -> None:
        ungraded.extend((n, p.numel()) for n, p in model.named_parameters() if p.requires_grad and p.grad is None)

    t0 = time.perf_counter()
    fp = _users(
        lambda: measure(model, xb, yb, _loss_fn(manifest.task), inspect, graded),
        roots,
        where,
        name not in BUILTIN_MODELS,
        lambda e: InvalidJob(f"{where}: {type(e).__name__}: {_message(e)}"),
        _call_limit_s(job, rows),
    )
    took = time.perf_counter() - t0
    model.eval()
    if ungraded and name not in BUILTIN_MODELS:
        _warn_ungraded(job, model, ungraded)
    if rows == MEASURE_ROWS:
        remember(_footprint_key(job, manifest), fp)  # the memory check's, measured once
    _check_step_time(job, took, rows)


def _warn_ungraded(job: Job, model: Any, ungraded: list[tuple[str, int]]) -> None:
    """Some trainable parameters (requires_grad) get no gradient from a training step: the forward
    pass cuts them off (`.detach()`, `torch.no_grad()` around part of it) or never uses them, so
    training never changes them and the run trains the rest only. Every one cut off is refused
    (`_try_train_step`); some are told, as a model may hold layers it does not use."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    missed = sum(n for _, n in ungraded)
    names = ", ".join(n for n, _ in ungraded[:3]) + (f" and {len(ungraded) - 3} more" if len(ungraded) > 3 else "")
    notice.warning(
        f"model.name: {job.model.name!r}: {missed:,} of its {total:,} trainable parameters get no gradient from a "
        f"training step ({names}), so training never changes them and the run trains the rest only: a .detach() "
        "or torch.no_grad() in forward, or layers forward does not use? Freeze what should stay as built "
        "(requires_grad_(False)) and this is not told"
    )


def _check_repeatable(job: Job, manifest: Manifest, model: Any, x: np.ndarray, roots: Sequence[Path]) -> None:
    """Warnings, for a user's model that trains but not as its author may think: outputs that
    differ for the same samples in evaluation mode, weights that differ between two builds with
    the job's seed."""
    import torch

    from smlt.runtime.data.inputs import model_input

    name = job.model.name
    xb = torch.from_numpy(model_input(manifest, x))

    def twice() -> tuple[Any, Any]:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            return model(xb.clone()), model(xb.clone())

    where = f"the forward pass of model.name {name!r} on {len(x)} samples of shape {_shape(manifest)}"
    limit = _call_limit_s(job, 2 * len(x))
    first, second = _users(twice, roots, where, True, lambda e: InvalidJob(f"{where}: {e}"), limit)
    if not bool(((first == second) | (first.isnan() & second.isnan())).all()):
        notice.warning(
            f"model.name: {name!r} gives different outputs for the same samples in evaluation mode (dropout that "
            "ignores model.eval(), e.g. F.dropout(x, training=True) instead of training=self.training, or state "
            "its forward keeps between calls): validation metrics, the target check and predictions vary from "
            "one call to the next"
        )
    if sum(p.numel() * p.element_size() for p in model.parameters()) > REBUILD_BYTES:
        return
    _reset_defaults()  # a second build as a worker's, after an earlier call's forward
    again = _build(job, manifest, roots).state_dict()
    _check_same_form(name, model.state_dict(), again)
    if any(k not in again or not torch.equal(v, again[k]) for k, v in model.state_dict().items()):
        notice.warning(
            f"model.name: {name!r} builds different weights each time with the same seed (it draws random "
            "numbers that torch.manual_seed does not fix: Python's random, numpy.random or a generator of its "
            "own): the run's workers all start from its one stored model 0, but two runs of this job start "
            "from different weights; draw them with torch (torch.randn, nn.init) to make runs repeatable"
        )


def _check_same_form(name: str, first: dict[str, Any], again: dict[str, Any]) -> None:
    """InvalidJob when a second build of the model has other parameters or shapes than the first:
    each worker builds the model and loads the run's one stored model 0 into it."""
    from smlt.runtime.train.models import form_difference, state_form

    diff = form_difference(state_form(first), state_form(again))
    if diff:
        raise InvalidJob(
            f"model.name: {name!r} builds another architecture each time with the same params ({diff} on a second "
            "build): every worker builds the model and loads the run's one stored model 0 into it, so they must all "
            "build the same layers; decide sizes and layer counts from the builder's arguments (model.params, "
            "input_shape, output_dim), not from random, numpy.random or the time"
        )


def _check_state_kept(job: Job, model: Any, built: dict[str, tuple[int, ...]]) -> None:
    """InvalidJob when the forward pass added to the model's state or reshaped it (a parameter
    created on its first call): the workers store, average and load the state the builder makes."""
    from smlt.runtime.train.models import form_difference, state_form

    diff = form_difference(built, state_form(model.state_dict()))
    if diff:
        raise InvalidJob(
            f"model.name: {job.model.name!r} changes its state in its forward pass ({diff} after a first call): "
            "smlt stores, averages and loads the model as the builder returns it; create every parameter and buffer "
            "in __init__ (the builder gets input_shape for their sizes)"
        )


def _check_non_persistent(job: Job, manifest: Manifest, model: Any, x: np.ndarray, roots: Sequence[Path]) -> None:
    """A warning when a forward pass in training mode changes a buffer that is not in the model's
    state (`register_buffer(..., persistent=False)`): the workers neither average nor store it, so
    the published model has the builder's value. The buffers are left as they were."""
    import torch

    from smlt.runtime.data.inputs import model_input

    kept = set(model.state_dict())
    if all(k in kept for k, _ in model.named_buffers()):
        return
    built = {k: b.detach().clone() for k, b in model.named_buffers()}
    xb = torch.from_numpy(model_input(manifest, x)).clone()

    def forward() -> list[str]:
        model.train()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                model(xb)
            now = dict(model.named_buffers())
            return [k for k, b in built.items() if k not in kept and k in now and not torch.equal(b, now[k])]
        finally:
            model.eval()
            with torch.no_grad():
                for k, b in model.named_buffers():
                    if k in built:
                        b.copy_(built[k])

    where = f"the forward pass of model.name {job.model.name!r} in training mode on {len(x)} samples"
    changed = _users(forward, roots, where, True, lambda e: InvalidJob(f"{where}: {e}"), _call_limit_s(job, len(x)))
    if changed:
        notice.warning(
            f"model.name: {job.model.name!r} changes its non-persistent buffer {changed[0]!r} while it trains "
            "(register_buffer(..., persistent=False)): it is not in the model's state, so the workers neither "
            "average nor store it, and the published model has the builder's value; register it persistent "
            "(the default) if training should keep it"
        )


def _worker_timeout_s() -> float:
    return float(deployed.value("worker_timeout_s"))


def _check_step_time(job: Job, took: float, rows: int) -> None:
    """Refused when one training step of the job's batch, scaled from the step just timed on
    `rows` rows, takes more than 0.8 of a worker's timeout (the planner's own bound for a worker's
    call): a worker takes at least one step per round, so no plan could finish it."""
    batch = job.training.batch_size
    step_s = took * batch / rows
    limit = 0.8 * _worker_timeout_s()
    if step_s <= limit:
        return
    fit = int(limit / (took / rows))
    smaller = f"lower training.batch_size to at most {fit}, or " if fit >= 1 else ""
    raise InvalidJob(
        f"model.name: {job.model.name!r} takes {took:.3g} s for one training step on {rows} "
        f"sample{'s' * (rows != 1)} here, so about {step_s:,.0f} s for a batch of {batch}: more than a worker may "
        f"run ({limit:,.0f} s, 0.8 of the {_worker_timeout_s():,.0f} s Lambda timeout), and every worker takes at "
        f"least one step per round: {smaller}make the forward and backward pass faster (a Python loop over the "
        "rows, a sleep, a file or network read in forward)"
    )


# --- memory ----------------------------------------------------------------------------------


def _fits(model: Any, memory_mb: int, data_bytes: int, activation_mb: float, batch: int) -> bool:
    """The workers' memory rule (what a worker checks before it trains)."""
    from smlt.runtime.steps.train import _check_fits

    try:
        _check_fits(model, memory_mb, data_bytes, activation_mb, batch)
    except ModelTooLarge:
        return False
    return True


def _least(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The least n in [lo, hi] with ok(n), ok monotone (None when not even hi)."""
    if not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _footprint_key(job: Job, manifest: Manifest) -> tuple[Any, ...]:
    return (
        "precheck",
        job.model.model_dump_json(),
        job.code.model_dump_json() if job.code else None,  # the same model name in another package
        manifest.x.model_dump_json(),
        manifest.y.model_dump_json(),
        manifest.outputs,
    )


def _check_memory(job: Job, manifest: Manifest, model: Any, roots: Sequence[Path] = ()) -> float:
    """Refused when no deployed tier (or the pinned workers.memory_mb) holds a worker's training:
    the tier it needs, whether any Lambda tier can hold it, and the batch size that would fit.
    Returns the model's training FLOPs per sample (measured)."""
    from smlt.runtime.steps.train import _loss_fn
    from smlt.runtime.train.measure import footprint

    fp = _users(
        lambda: footprint(_footprint_key(job, manifest), model, manifest, _loss_fn(manifest.task)),
        roots,
        f"measuring a training step of model.name {job.model.name!r} on {_shape(manifest)} samples",
        job.model.name not in BUILTIN_MODELS,
        lambda e: InvalidJob(f"model: {job.model.name} cannot be trained on {manifest.name}'s samples: {e}"),
        _call_limit_s(job, SAMPLE_ROWS),
    )
    batch = job.training.batch_size
    shards = [*manifest.train.shards, *manifest.validation.shards]
    data_bytes = 3 * max((sh.bytes for sh in shards), default=0)
    tiers = sorted(int(t) for t in deployed.value("memory_tiers"))
    pinned = job.workers.memory_mb
    candidates = [pinned] if pinned else tiers
    if any(_fits(model, t, data_bytes, fp.activation_mb(batch), batch) for t in candidates):
        return fp.flops_per_sample
    top = int(MAX_MB)
    need = _least(lambda mb: _fits(model, mb, data_bytes, fp.activation_mb(batch), batch), 1, 1 << 24)
    params = sum(p.numel() for p in model.parameters())
    what = (
        f"model {job.model.name} ({params / 1e6:.1f}M parameters) on {_shape(manifest)} samples, batch "
        f"{batch}: a worker needs about {need:,} MB"
    )
    largest = max([top, *tiers])
    fit_batch = _least(lambda b: not _fits(model, largest, data_bytes, fp.activation_mb(b), b), 1, batch)
    max_batch = (fit_batch - 1) if fit_batch is not None else batch
    smaller = (
        f"lower training.batch_size to at most {max_batch}"
        if max_batch >= 1
        else "use a smaller model (its parameters alone do not fit)"
    )
    if need is not None and need > top:
        raise ModelTooLarge(f"{what}, more than any Lambda memory tier can hold (the largest is {top:,} MB): {smaller}")
    where = (
        f"workers.memory_mb {pinned} MB" if pinned else f"the deployed memory tiers ({', '.join(map(str, tiers))} MB)"
    )
    fix = (
        f"set workers.memory_mb to at least {need:,} (or leave it out to let the planner choose)"
        if pinned and any(t >= (need or 0) for t in tiers)
        else f"deploy a tier of at least {need:,} MB (memory_tiers in cdk.json; Lambda allows up to {top:,} MB)"
    )
    raise ModelTooLarge(f"{what}, more than {where}: {fix}, or {smaller}")


# --- a target met before training --------------------------------------------------------------


def _check_target(
    job: Job, manifest: Manifest, model: Any, x: np.ndarray, y: np.ndarray, flops: float, roots: Sequence[Path] = ()
) -> None:
    """A target the untrained model already meets would stop the run at round 0 with that model;
    one that always predicting the most common class meets, as soon as the model learns that."""
    t = job.training
    if t.target_value is None:
        return
    _check_majority(job, manifest, y)
    if job.warm_start is not None:
        return
    from smlt.runtime.steps.train import _evaluate

    if flops / 3 * len(x) > EVAL_FLOPS:  # forward passes (a third of training's) of a large model: too slow here
        return
    batches = ((x[i : i + EVAL_BATCH], y[i : i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH))
    where = f"the forward pass of model.name {job.model.name!r} on {len(x)} validation samples"
    e = _users(
        lambda: _evaluate(model, batches, manifest),
        roots,
        where,
        job.model.name not in BUILTIN_MODELS,
        lambda err: InvalidJob(f"{where}: {type(err).__name__}: {_message(err)}"),
        _call_limit_s(job, len(x)),
    )
    m = val_metrics(
        e.loss,
        e.correct,
        e.count,
        task=manifest.task,
        outputs=manifest.outputs,
        target=manifest.target,
        class_correct=e.class_correct,  # balanced accuracy (up to MAX_CLASS_SUMS classes)
        class_count=e.class_count,
    )
    value = getattr(m, t.target_metric)
    if value is None:
        return
    lower = lower_is_better(t.target_metric)
    if (value <= t.target_value) if lower else (value >= t.target_value):
        raise InvalidJob(
            f"training.target_value: the untrained model already meets {t.target_metric} "
            f"{'<=' if lower else '>='} {t.target_value:g} ({t.target_metric} {value:.4g} on {e.count} validation rows "
            f"before any training), so the run would stop at round 0: {_units(t.target_metric, manifest, m)}"
        )


def _check_majority(job: Job, manifest: Manifest, y: np.ndarray) -> None:
    """An accuracy target the most common class alone reaches: on imbalanced classes the run
    would stop with a model that predicts that class for every row."""
    t = job.training
    if t.target_metric != "val_accuracy" or t.target_value is None or manifest.task != "classification" or len(y) < 20:
        return
    counts = np.bincount(np.asarray(y, np.int64).ravel(), minlength=manifest.outputs)
    k = int(counts.argmax())
    share = float(counts[k]) / len(y)
    if share < t.target_value:
        return
    name = manifest.classes[k] if manifest.classes and k < len(manifest.classes) else str(k)
    rows = f"{len(y):,} validation rows" + ("" if len(y) >= manifest.validation.rows else " sampled")
    raise InvalidJob(
        f"training.target_value: val_accuracy {t.target_value:g} is met by always predicting the most common "
        f"class {name!r} ({share:.1%} of {rows}), so the run could stop with a model that learned only that: "
        f'set a target above {share:.3f}, or balance the classes (training.class_weights "balanced" makes the '
        "rare ones count in training; every run reports each class's recall)"
    )


def _units(metric: str, manifest: Manifest, m: Any) -> str:
    """What the metric's numbers mean, and what to set instead."""
    if metric == "val_loss" and manifest.task == "regression":
        rmse = "" if m.val_rmse is None else f" (the untrained model's: {m.val_rmse:.4g})"
        return (
            "for regression val_loss is the mean squared error of the standardised targets (about 1.0 when "
            "predicting the mean); for a target in the dataset's own units use val_rmse"
            f"{rmse} or val_r2"
        )
    if metric == "val_loss":
        chance = math.log(max(manifest.outputs, 2))
        return f"val_loss is the mean cross-entropy (about {chance:.3g} when guessing among {manifest.outputs} classes): set a lower target"
    if metric == "val_rmse":
        return "val_rmse is in the dataset's own units: set a lower target"
    return "set a higher target"


def _sample_rows(folder: Path, manifest: Manifest, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Up to `rows` validation rows (x as stored, y), read from the folder's shards in order."""
    from safetensors.numpy import load_file

    xs, ys, got = [], [], 0
    for sh in manifest.validation.shards:
        try:
            arrays = load_file(str(folder / sh.key))
        except Exception as e:  # noqa: BLE001 - any unreadable shard
            raise InvalidDataset(
                f"{folder / sh.key}: cannot read this shard ({e}); prepare the dataset again"
            ) from None
        xs.append(arrays["x"])
        ys.append(arrays["y"])
        got += len(arrays["x"])
        if got >= rows:
            break
    if not xs:
        raise InvalidDataset(f"{folder}: the dataset has no validation shard")
    return np.concatenate(xs)[:rows], np.concatenate(ys)[:rows]


def check_job_file(path: Path, code: Path | None = None, *, s3: bool = False) -> None:
    """`smlt run --local JOB` / `smlt start JOB`: the job file, its dataset and its model checked
    before any engine, stack or upload (the run itself reads them again: prepared data is cached).
    `s3` (`smlt start`): an s3:// dataset is read too, with the user's credentials."""
    from smlt.datasets import checked_dataset_folder
    from smlt.jobfile import read_job_file
    from smlt.runtime.usercode import check_shipped, package_code

    job, _ = read_job_file(path)
    folder = checked_dataset_folder(job, base=path.parent)
    if code is not None:
        package_code(code)  # what the image cannot run is named before anything is imported
    if folder is None and s3 and job.dataset.uri.startswith("s3://"):
        if code is None:
            check_shipped(job)  # as `smlt start` does, before any AWS request
        check_s3_model(job, job.dataset.uri, code)
        return
    check_model(job, folder, code, deployed=s3)


# --- a dataset on S3, read with the user's credentials ----------------------------------------

SHARD_MAX_BYTES = 16 << 20  # the one validation shard read from S3 for the check, at most


def _s3_dataset(uri: str, client: Any) -> Any:
    from smlt.runtime import clients
    from smlt.runtime.keys import parse_s3_uri
    from smlt.runtime.store import S3Store

    try:
        bucket, prefix = parse_s3_uri(uri)
    except ValueError as e:
        raise InvalidDataset(f"dataset.uri: {e}") from None
    if client is None:
        import boto3
        from botocore.exceptions import NoRegionError

        from smlt.aws_errors import aws_not_configured

        if boto3.session.Session().region_name is None:  # S3 would answer without one; the stack would not
            raise aws_not_configured(NoRegionError()) or NoRegionError()
        client = clients.make("s3")
    return S3Store(bucket, prefix.rstrip("/") + "/" if prefix else "", client=client)


def _s3_get(store: Any, key: str) -> bytes:
    """An object of the dataset, or a named error: what cannot be read, and why, for the user."""
    from smlt.aws_errors import user_get
    from smlt.runtime.store import NotFound

    try:
        return user_get(store, key, "dataset.uri", InvalidDataset)
    except NotFound:
        raise InvalidDataset(
            f"dataset.uri: no s3://{store.bucket}/{store.prefix}{key}: upload the prepared dataset there (`smlt data "
            f"prepare SOURCE --out s3://{store.bucket}/{store.prefix}`), or point dataset.uri at its folder"
        ) from None


def _s3_sample_rows(store: Any, manifest: Manifest, rows: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Up to `rows` rows of the smallest validation shard when it is at most SHARD_MAX_BYTES
    (checked against the manifest's sha256), else SAMPLE_ROWS zeros of the recorded shape and
    dtype (y None)."""
    import hashlib

    from safetensors.numpy import load

    small = [sh for sh in manifest.validation.shards if sh.bytes <= SHARD_MAX_BYTES]
    if not small:
        return np.zeros((SAMPLE_ROWS, *manifest.x.shape), dtype=manifest.x.dtype), None
    shard = min(small, key=lambda sh: sh.bytes)
    blob = _s3_get(store, shard.key)
    where = f"s3://{store.bucket}/{store.prefix}{shard.key}"
    if hashlib.sha256(blob).hexdigest() != shard.sha256:
        raise InvalidDataset(f"{where}: its sha256 does not match the manifest's; prepare and upload the dataset again")
    try:
        arrays = load(blob)
        x, y = arrays["x"], arrays["y"]
    except Exception as e:  # noqa: BLE001 - any unreadable shard
        raise InvalidDataset(f"{where}: cannot read this shard ({e}); prepare the dataset again") from None
    if len(x) < SAMPLE_ROWS:  # batch norm needs two rows: repeat the one there is
        x, y = np.concatenate([x] * SAMPLE_ROWS), np.concatenate([y] * SAMPLE_ROWS)
    return x[:rows], y[:rows]


# --- studies ---------------------------------------------------------------------------------


def first_plan_refusal(job: Job, manifest: Manifest, budget_usd: float, deadline_s: float | None = None) -> str | None:
    """Why the planner would refuse a run of `job` under `budget_usd` before its first round (its
    own first decision, on the dataset and the built-in model's footprint), None when it would train."""
    from smlt.runtime.planner import decide
    from smlt.runtime.planner.footprint import model_cost
    from smlt.runtime.planner.types import RunHistory
    from smlt.runtime.prices import Prices

    cost = model_cost(job.model, manifest.input_shape, manifest.outputs, manifest.vocab_size)
    history = RunHistory(
        param_count=cost.params if cost else 0,
        flops_per_sample=cost.flops_per_sample if cost else None,
        train_rows=manifest.train.rows,
        val_rows=manifest.validation.rows,
        dataset_bytes=sum(sh.bytes for sh in manifest.train.shards),
    )
    c = job.constraints.model_copy(update={"budget_usd": budget_usd, "best_effort": False})
    if deadline_s is not None:
        c = c.model_copy(update={"deadline_seconds": min(c.deadline_seconds or deadline_s, deadline_s)})
    trial = job.model_copy(update={"constraints": c})
    tiers = sorted(int(t) for t in deployed.value("memory_tiers"))
    decision = decide(trial, history, tiers, Prices())
    return decision.reason if decision.action == "stop" and decision.infeasible else None


def _check_study_metric(study: Any, manifest: Manifest) -> None:
    """The study's own `metric` (its trials' target metric is checked with each trial's job): one
    the dataset never measures would leave every trial without a value to compare."""
    if study.metric is None:
        return
    problem = target_metric_problem(study.metric, manifest.task, "study.metric")
    if problem is None and manifest.task == "classification":
        problem = balanced_problem(study.metric, manifest.outputs, "study.metric")
    if problem:
        raise InvalidJob(problem)


def check_study(study: Any, base: Path) -> None:
    """`smlt tune`: before any trial starts, every value of the search space (each choice, both
    ends of each range) builds a valid job and a model that trains on the dataset, and the first
    trial's share of the budget pays its first plan; else InvalidJob naming the value and the fix."""
    from smlt.datasets import checked_dataset_folder
    from smlt.runtime.job import parse_job
    from smlt.runtime.study.spec import corner_points, trial_job

    folder = checked_dataset_folder(study.job, base=base)
    for params in corner_points(study):
        shown = ", ".join(f"{k}={json_text(v)}" for k, v in params.items())
        try:
            job = parse_job(trial_job(study, params))
            checked_dataset_folder(job, base=base)
            check_model(job, folder)
        except SmltError as e:
            raise InvalidJob(f"study.space: with {shown}: {type(e).__name__}: {e}") from None
    if folder is None:
        return
    from smlt.runtime.study.budget import DEADLINE_MARGIN_S

    manifest = read_local_manifest(folder)
    _check_study_metric(study, manifest)
    share = study.budget_usd / study.trials  # the first trial's (smlt.runtime.study.budget.share)
    deadline = study.deadline_seconds - DEADLINE_MARGIN_S  # the first trial's (budget.trial_deadline)
    if first_plan_refusal(study.job, manifest, share, deadline) is None:
        return
    why = first_plan_refusal(study.job, manifest, share)
    if why is None:  # the deadline, not the budget
        why = first_plan_refusal(study.job, manifest, share, deadline)
        enough = _least_usd(
            lambda s: first_plan_refusal(study.job, manifest, share, s - DEADLINE_MARGIN_S) is None,
            study.deadline_seconds,
            top=7 * 24 * 3600,
        )
        need = f"at least {enough:.3g} s" if enough else "a longer deadline"
        raise InvalidJob(
            f"study.deadline_seconds: {study.deadline_seconds:g} s cannot fit one trial ({why}): give "
            f"deadline_seconds {need}"
        )
    enough = _least_usd(lambda usd: first_plan_refusal(study.job, manifest, usd) is None, share)
    need = f"at least ${enough * study.trials:.4g} for {study.trials} trials" if enough else "a larger budget"
    raise InvalidJob(
        f"study.budget_usd: ${study.budget_usd:g} over {study.trials} trials gives each ${share:.3g}, which "
        f"cannot pay one trial's first rounds ({why}): give budget_usd {need}, or fewer trials"
    )


def _least_usd(ok: Callable[[float], bool], low: float, top: float = 1000.0) -> float | None:
    """The least amount (to 2 significant digits) ok takes, searched up from `low` (None above `top`)."""
    hi = max(low, 1e-6)
    while not ok(hi):
        hi *= 2
        if hi > top:
            return None
    lo = hi / 2
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return float(f"{hi:.2g}") if ok(float(f"{hi:.2g}")) else hi


def json_text(v: Any) -> str:
    import json

    return json.dumps(v)
