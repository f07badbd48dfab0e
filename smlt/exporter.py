"""`smlt export`: a run's model as a file a serving stack loads without smlt or the model's code.

- `onnx`: an ONNX graph (torch's dynamo-based exporter, `torch.onnx.export(..., dynamo=True)`),
  its batch axis dynamic; needs the `onnx` extra (onnx, onnxscript; onnxruntime to check it).
- `torch-export`: a `torch.export` program saved with `torch.export.save` (.pt2), loaded with
  `torch.export.load(path).module()`; TorchScript is deprecated upstream and not offered.

Either takes the model's input as the model card says (`input_shape`, `input_dtype`: float32
features or images after the recorded normalisation, int64 token ids) and gives its raw outputs
(logits, or standardised regression values). Every export is loaded back and run on the given rows
(or on a seeded batch shaped like the model's input) and its largest absolute difference from
PyTorch's outputs is reported: a file that differs by more than the tolerance is an ExportFailed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from smlt.runtime.errors import SmltError

Format = Literal["onnx", "torch-export"]
FORMATS: tuple[Format, ...] = ("onnx", "torch-export")
SUFFIX = {"onnx": ".onnx", "torch-export": ".pt2"}
# Largest absolute difference from PyTorch's outputs an export may show (float32 kernels reorder sums).
TOLERANCE = 1e-3
CHECK_ROWS = 8


class ExportFailed(SmltError):
    """The model cannot be exported in this format (the message names the operator or the cause)."""


@dataclass(frozen=True)
class Exported:
    path: Path
    format: Format
    rows: int  # rows the export was checked on
    max_abs_diff: float  # against the PyTorch model's outputs on those rows


def example_input(
    input_shape: list[int], input_dtype: str, vocab_size: int | None, rows: int = CHECK_ROWS
) -> torch.Tensor:
    """A seeded batch shaped like the model's input (token ids below the vocabulary size)."""
    g = torch.Generator().manual_seed(0)
    if input_dtype == "int64":
        return torch.randint(0, vocab_size or 2, (rows, *input_shape), generator=g)
    return torch.randn((rows, *input_shape), generator=g)


def export_module(module: torch.nn.Module, x: torch.Tensor, fmt: Format, path: Path) -> Exported:
    """Export `module` (eval mode) for inputs like `x` (at least 2 rows: the batch axis is dynamic),
    load the file back and compare its outputs on `x` with the module's."""
    if fmt not in FORMATS:
        raise ExportFailed(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    module = module.eval()
    if len(x) < 2:
        x = torch.cat([x, x])
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        want = module(x).float().numpy()
    with _quiet():
        got = _onnx(module, x, path) if fmt == "onnx" else _torch_export(module, x, path)
    diff = float(np.abs(got.astype(np.float64) - want).max()) if want.size else 0.0
    if not diff <= TOLERANCE:  # NaN fails too
        raise ExportFailed(
            f"{path}: the exported model's outputs differ from PyTorch's by up to {diff:.3g} (tolerance {TOLERANCE})"
        )
    return Exported(path, fmt, len(x), diff)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Torch's exporters print their progress and log traced graphs: keep the user's output clean
    (their errors still reach ExportFailed)."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", FutureWarning)  # torch.export.load's own deprecations
            yield
    finally:
        logger.setLevel(level)


def _batch_dim() -> torch.export.Dim:
    return torch.export.Dim("batch", min=1, max=1 << 20)


def _program(module: torch.nn.Module, x: torch.Tensor) -> torch.export.ExportedProgram:
    try:
        return torch.export.export(module, (x,), dynamic_shapes=({0: _batch_dim()},), strict=False)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds; each is named in the message
        raise ExportFailed(f"torch.export cannot trace the model: {_cause(e)}") from None


def _torch_export(module: torch.nn.Module, x: torch.Tensor, path: Path) -> np.ndarray:
    program = _program(module, x)
    torch.export.save(program, str(path))
    loaded = torch.export.load(str(path)).module()
    with torch.no_grad():
        return loaded(x).float().numpy()


def _onnx(module: torch.nn.Module, x: torch.Tensor, path: Path) -> np.ndarray:
    try:
        import onnxruntime
        import onnxscript  # noqa: F401 - the dynamo exporter's dependency, named here if absent
    except ImportError as e:
        raise ExportFailed(
            f"ONNX export needs the onnx extra ({e.name} is not installed): pip install 'smlt[onnx]'"
        ) from None
    program = _program(module, x)
    try:
        onnx_program = torch.onnx.export(program, (x,), dynamo=True, verbose=False)
    except Exception as e:  # noqa: BLE001
        raise ExportFailed(f"ONNX cannot express the model: {_cause(e)}") from None
    if onnx_program is None:
        raise ExportFailed("ONNX export produced no program")
    onnx_program.save(str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.asarray(session.run(None, {name: x.numpy()})[0], np.float32)


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def _cause(e: BaseException) -> str:
    """The exporter's error in one line: the operator it stopped at (ONNX's missing function, or
    the last traced op before a data-dependent branch), the user's line, then torch's own words."""
    text = _COLOUR.sub("", str(e))
    found = re.search(r"op='([\w.]+)'", text) or re.search(r"target=torch\.ops\.([\w.]+?)(?:\.default)?\]", text)
    ops = re.findall(r"torch\.ops\.([\w.]+?)(?:\.default)?\(", text)
    op = found.group(1) if found else (ops[-1] if ops else None)
    call = re.search(r'File "([^"]+)", line (\d+), in \w+\n\s+(.+)', text)
    code = re.search(r"code: (.+)", text)
    summary = re.search(r"Error'>: (No ONNX function .+)", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    words = summary.group(1) if summary else (lines[0] if lines else type(e).__name__)
    if "data-dependent" in text:
        words = f"the model branches on a tensor's value (use torch.where or torch.cond): {words}"
    at = f"{Path(call.group(1)).name}:{call.group(2)} `{call.group(3).strip()}`" if call else None
    at = at or (f"`{code.group(1).strip()}`" if code else None)
    parts = [f"operator {op}" if op else "", f"at {at}" if at else ""]
    where = " ".join(p for p in parts if p)
    return f"{where + ': ' if where else ''}{type(e).__name__}: {words[:300]}"
