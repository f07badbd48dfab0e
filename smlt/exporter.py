"""`smlt export`: a run's model as a file a serving stack loads without smlt or the model's code.

- `onnx`: an ONNX graph (torch's dynamo-based exporter, `torch.onnx.export(..., dynamo=True)`);
  needs the `onnx` extra (onnx, onnxscript; onnxruntime to check it).
- `torch-export`: a `torch.export` program saved with `torch.export.save` (.pt2), loaded with
  `torch.export.load(path).module()`; TorchScript is deprecated upstream and not offered.

By default the file holds the served model (smlt.serving): the card's numeric preprocessing, the
network and its post-processing, so it takes what the data holds (feature values and number
columns in their own units, uint8 images, token ids) and gives class probabilities or regression
values in the label's units; it is checked against `smlt predict` on the same rows (default: a
seeded batch in the data's units) within 1e-5 (regression: 1e-5 of the target's std). `raw=True`
(`--raw`) exports the bare network instead (the input after the card's normalisation, logits or
standardised values), checked against PyTorch within TOLERANCE. Either way the batch axis is
dynamic and named `batch` (1 row works), the input and output tensors are named (ServingSpec), and
the file carries the spec and the model card: ONNX `metadata_props` `smlt.serving` and
`smlt.model_card`, a .pt2's extra files of the same names.
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
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from smlt.inference import serving_input
from smlt.runtime.errors import SmltError
from smlt.serving import (
    BATCH,
    CARD_KEY,
    SPEC_KEY,
    ServingSpec,
    example_rows,
    served_module,
    serving_spec,
    stored_rows,
)

if TYPE_CHECKING:
    from smlt.inference import LoadedModel

Format = Literal["onnx", "torch-export"]
FORMATS: tuple[Format, ...] = ("onnx", "torch-export")
SUFFIX = {"onnx": ".onnx", "torch-export": ".pt2"}
# Largest absolute difference from PyTorch's outputs an export may show (float32 kernels reorder sums).
TOLERANCE = 1e-3
# Largest difference of a served export from `smlt predict`: probabilities, or regression values
# times the target's std (the same precision in the label's units), with RELATIVE of the value on
# top for a regression value (a float32's own rounding: a price of 300000 is held to 0.3 more).
SERVED_TOLERANCE = 1e-5
RELATIVE = 1e-6
CHECK_ROWS = 8
DATA_ROWS = 64  # rows of --data an export is checked on


class ExportFailed(SmltError):
    """The model cannot be exported in this format (the message names the operator or the cause)."""


@dataclass(frozen=True)
class Exported:
    path: Path
    format: Format
    rows: int  # rows the export was checked on
    max_abs_diff: float  # against the reference's outputs on those rows
    against: str = "PyTorch"  # the reference: "PyTorch" (the module) or "smlt predict"
    tolerance: str = f"{TOLERANCE}"  # the largest difference allowed (per output column, in its units)
    spec: ServingSpec | None = None  # the contract stored in the file


def example_input(
    input_shape: list[int], input_dtype: str, vocab_size: int | None, rows: int = CHECK_ROWS
) -> torch.Tensor:
    """A seeded batch shaped like the model's input (token ids below the vocabulary size)."""
    g = torch.Generator().manual_seed(0)
    if input_dtype == "int64":
        return torch.randint(0, vocab_size or 2, (rows, *input_shape), generator=g)
    return torch.randn((rows, *input_shape), generator=g)


def export_model(model: LoadedModel, fmt: Format, path: Path, data: Any = None, raw: bool = False) -> Exported:
    """A loaded run's model exported to `path`: the served model (smlt.serving) checked against
    `smlt predict` on `data`'s first DATA_ROWS rows (default: a seeded batch), or with `raw` the
    bare network checked against PyTorch."""
    if fmt not in FORMATS:
        raise ExportFailed(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt == "onnx":
        _require_onnx()  # before the rows are read
    if not raw and model.card.features is None:
        raise ExportFailed(
            f"{model.source}: its model card records no feature spec (the dataset's manifest was unreadable when "
            "the run finished), so its preprocessing cannot go into the graph: export the bare network with --raw "
            "(raw=True), which takes the model's input after normalisation"
        )
    spec = serving_spec(model, raw)
    meta = {SPEC_KEY: spec.model_dump_json(), CARD_KEY: model.card.model_dump_json(exclude={"metrics"})}
    if raw:
        x = model.transform(data)[:DATA_ROWS] if data is not None else _example(model)
        return export_module(model.module, x, fmt, path, spec=spec, metadata=meta)
    rows = serving_input(model, data)[:DATA_ROWS] if data is not None else example_rows(model)
    if len(rows) == 0:
        raise ExportFailed(f"--data {data}: no rows to check the export on")
    if len(rows) < 2:  # the batch axis is traced on 2 rows (1 would fix it to 1)
        rows = np.concatenate([rows, rows])
    predicted = model.predict_rows(stored_rows(model, rows))
    if predicted.probabilities is not None:
        want, atol, rtol = predicted.probabilities, np.asarray(SERVED_TOLERANCE), 0.0
    else:
        assert predicted.values is not None
        target = model.manifest.target
        std = np.asarray(target.std if target else [1.0] * predicted.values.shape[1], np.float64)
        want, atol, rtol = predicted.values, SERVED_TOLERANCE * std, RELATIVE
    return export_module(
        served_module(model), torch.from_numpy(rows), fmt, path, spec=spec, metadata=meta, expect=(want, atol, rtol)
    )


def _example(model: LoadedModel) -> torch.Tensor:
    card = model.card
    return example_input(card.input_shape, card.input_dtype, card.vocab_size)


def export_module(
    module: torch.nn.Module,
    x: torch.Tensor,
    fmt: Format,
    path: Path,
    *,
    spec: ServingSpec | None = None,
    metadata: dict[str, str] | None = None,
    expect: tuple[np.ndarray, np.ndarray, float] | None = None,
) -> Exported:
    """Export `module` (eval mode) for inputs like `x` (at least 2 rows: the batch axis is dynamic),
    load the file back and compare its outputs on `x` with `expect` (outputs, absolute tolerance
    per output column, relative tolerance of each value on top), else with the module's
    own within TOLERANCE. `spec` names the input and output tensors; `metadata` goes into the file."""
    if fmt not in FORMATS:
        raise ExportFailed(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    module = module.eval()
    if len(x) < 2:
        x = torch.cat([x, x])
    path.parent.mkdir(parents=True, exist_ok=True)
    names = (spec.input.name, spec.output.name) if spec else ("input", "output")
    if expect is None:
        with torch.no_grad():
            want = module(x).float().numpy().astype(np.float64)
        bound = np.full(want.shape, TOLERANCE)
        against, tolerance = "PyTorch", f"{TOLERANCE}"
    else:
        want, atol, rtol = expect
        bound = np.broadcast_to(atol, want.shape) + rtol * np.abs(want)
        against = "smlt predict"
        tolerance = _said(atol) + (f" + {rtol:.0e} of the value" if rtol else "")
    with _quiet(), _frozen(module):
        if fmt == "onnx":
            got = _onnx(module, x, path, names, metadata or {})
        else:
            got = _torch_export(module, x, path, metadata or {})
    if got.shape != want.shape:
        raise ExportFailed(f"{path}: the exported model gives outputs of shape {got.shape}, not {want.shape}")
    gap = np.abs(got.astype(np.float64) - want)
    diff = float(gap.max()) if want.size else 0.0
    if not (gap <= bound).all():  # NaN fails too
        raise ExportFailed(
            f"{path}: the exported model's outputs differ from {against}'s by up to {diff:.3g} (tolerance {tolerance})"
        )
    return Exported(path, fmt, len(x), diff, against, tolerance, spec)


def _said(atol: np.ndarray) -> str:
    values = sorted({float(a) for a in np.atleast_1d(atol)})
    return ", ".join(f"{a:.3g}" for a in values[:4]) + (" ..." if len(values) > 4 else "")


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


@contextlib.contextmanager
def _frozen(module: torch.nn.Module) -> Iterator[None]:
    """The module's parameters without requires_grad while it is exported and saved, so the loaded
    program builds no autograd graph on a server's every call; the flags are restored after."""
    flags = [(p, p.requires_grad) for p in module.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _batch_dim() -> torch.export.Dim:
    return torch.export.Dim("batch", min=1, max=1 << 20)


def _program(module: torch.nn.Module, x: torch.Tensor) -> torch.export.ExportedProgram:
    try:
        return torch.export.export(module, (x,), dynamic_shapes=({0: _batch_dim()},), strict=False)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds; each is named in the message
        raise ExportFailed(f"torch.export cannot trace the model: {_cause(e)}") from None


def _torch_export(module: torch.nn.Module, x: torch.Tensor, path: Path, metadata: dict[str, str]) -> np.ndarray:
    program = _program(module, x)
    torch.export.save(program, str(path), extra_files=metadata)
    loaded = torch.export.load(str(path)).module()
    with torch.no_grad():
        return loaded(x).float().numpy()


def _onnx(
    module: torch.nn.Module, x: torch.Tensor, path: Path, names: tuple[str, str], metadata: dict[str, str]
) -> np.ndarray:
    _require_onnx()
    import onnxruntime

    program = _program(module, x)
    try:
        onnx_program = torch.onnx.export(
            program, (x,), dynamo=True, verbose=False, input_names=[names[0]], output_names=[names[1]]
        )
    except Exception as e:  # noqa: BLE001
        raise ExportFailed(f"ONNX cannot express the model: {_cause(e)}") from None
    if onnx_program is None:
        raise ExportFailed("ONNX export produced no program")
    onnx_program.save(str(path))
    _label(path, metadata)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.asarray(session.run(None, {name: x.numpy()})[0], np.float32)


def _require_onnx() -> None:
    """ExportFailed naming the onnx extra when a module of it is missing: onnx (names the graph's
    batch axis, stores the spec), onnxscript (the dynamo exporter's), onnxruntime (the check)."""
    from importlib.util import find_spec

    missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if find_spec(m) is None]
    if missing:
        raise ExportFailed(
            f"ONNX export needs the onnx extra ({', '.join(missing)} not installed): pip install 'smlt[onnx]'"
        )


def _label(path: Path, metadata: dict[str, str]) -> None:
    """The saved graph with its batch axis named `batch` (torch names it after a symbol, `s31`) on
    every input and output, and `metadata` in its metadata_props."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False)
    first = graph.graph.input[0].type.tensor_type.shape.dim
    symbol = first[0].dim_param if len(first) else ""
    for value in [*graph.graph.input, *graph.graph.output, *graph.graph.value_info]:
        dims = value.type.tensor_type.shape.dim
        if symbol and len(dims) and dims[0].dim_param == symbol:
            dims[0].dim_param = BATCH
    for key, text in metadata.items():
        graph.metadata_props.add(key=key, value=text)
    onnx.save(graph, str(path))


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
