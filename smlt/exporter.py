"""`smlt export`: a run's model as a file a serving stack loads without smlt or the model's code.

- `onnx`: an ONNX graph (torch's dynamo-based exporter, `torch.onnx.export(..., dynamo=True)`);
  needs the `onnx` extra (onnx, onnxscript; onnxruntime to check it).
- `torch-export`: a `torch.export` program saved with `torch.export.save` (.pt2), loaded with
  `torch.export.load(path).module()`; TorchScript is deprecated upstream and not offered.

By default the file holds the served model (smlt.serving): the card's numeric preprocessing, the
network and its post-processing, so it takes what the data holds (feature values and number
columns in their own units, uint8 images, token ids; in ONNX a table's number and one-hot text
cells, its one-hot encoding an ONNX graph joined before the network's: `_table_graph`) and gives class probabilities or regression
values in the label's units (a table graph with text cells also `unseen`, the cells none of a column's levels, second); it is checked against `smlt predict` on the same rows (default: a
seeded batch in the data's units) within 1e-5 (regression: 1e-5 of the target's std). `raw=True`
(`--raw`) exports the bare network instead (the input after the card's normalisation, logits or
standardised values), checked against PyTorch within TOLERANCE. Either way the batch axis is
dynamic and named `batch` (1 row works: checked on the first row alone too), the input and output tensors are named (ServingSpec), and
the file carries the spec, the model card and the sha256 of the model.safetensors it was made
from: ONNX `metadata_props` `smlt.serving`, `smlt.model_card` and `smlt.model_sha256`, a .pt2's
extra files of the same names (a file left beside a later run's model is told apart from one made
from it: smlt.outputs.exported_from).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import secrets
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from smlt.inference import serving_input
from smlt.outputs import EXPORT_SUFFIX, MODEL_KEY
from smlt.runtime.errors import SmltError
from smlt.serving import (
    BATCH,
    CARD_KEY,
    NUMBERS,
    SPEC_KEY,
    TEXT,
    UNSEEN,
    ServingSpec,
    example_rows,
    feeds_inputs,
    feeds_unseen,
    served_module,
    serving_spec,
    stored_rows,
    table_feeds,
)

if TYPE_CHECKING:
    import onnx

    from smlt.inference import LoadedModel
    from smlt.runtime.data.manifest import Manifest

Format = Literal["onnx", "torch-export"]
FORMATS: tuple[Format, ...] = ("onnx", "torch-export")
SUFFIX = EXPORT_SUFFIX
# Largest absolute difference from PyTorch's outputs an export may show (float32 kernels reorder sums).
TOLERANCE = 1e-3
# Largest difference of a served export from `smlt predict`: probabilities, or regression values
# times the target's std (the same precision in the label's units), with RELATIVE of the value on
# top for a regression value (a float32's own rounding: a price of 300000 is held to 0.3 more).
SERVED_TOLERANCE = 1e-5
RELATIVE = 1e-6
CHECK_ROWS = 8
DATA_ROWS = 64  # rows of --data an export is checked on
TEXT_OPSET = 20  # ONNX's RegexFullMatch (strings) is opset 20's (kind columns_text)
# What smlt's CSV reader strips around a text cell (pyarrow's utf8_trim_whitespace: Python's
# str.isspace characters), as an RE2 class: the table graph strips it too (`_level_pattern`).
_SPACE = r"[\t-\r\x{1C}-\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]"
ENCODED = "smlt_encoded_features"  # kind columns_text: the table graph's output, the network's input


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
    # kind columns_text: the text cells of those rows the model never saw, which the file's `unseen`
    # output flagged exactly where `smlt predict` counts them (None: no such output)
    unseen: int | None = None


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
    refuse_target(path, fmt)  # before the rows are read
    if fmt == "onnx":
        _require_onnx()
    if not raw and model.card.features is None:
        raise ExportFailed(
            f"{model.source}: its model card records no feature spec (the dataset's manifest was unreadable when "
            "the run finished), so its preprocessing cannot go into the graph: export the bare network with --raw "
            "(raw=True), which takes the model's input after normalisation"
        )
    spec = serving_spec(model, raw, fmt)
    meta = {SPEC_KEY: spec.model_dump_json(), CARD_KEY: model.card.model_dump_json(exclude={"metrics"})}
    if model.sha256:  # the model.safetensors it is made from: a file left beside a later model is told apart
        meta[MODEL_KEY] = model.sha256
    if raw:
        x = model.transform(data)[:DATA_ROWS] if data is not None else _example(model)
        return export_module(model.module, x, fmt, path, spec=spec, metadata=meta)
    feeds = table_feeds(model, data, DATA_ROWS) if spec.kind == "columns_text" else None
    if feeds is not None:
        feeds = {name: np.concatenate([f, f]) if len(f) == 1 else f for name, f in feeds.items()}
        stored = feeds_inputs(model, feeds)  # predict's own reading of the same cells
        rows = stored.x
    else:
        rows = serving_input(model, data)[:DATA_ROWS] if data is not None else example_rows(model)
    if len(rows) == 0:
        raise ExportFailed(f"--data {data}: no rows to check the export on")
    if len(rows) < 2:  # the batch axis is traced on 2 rows (1 would fix it to 1)
        rows = np.concatenate([rows, rows])
    if feeds is None:
        stored = stored_rows(model, rows)
    predicted = model.predict_rows(stored)
    if predicted.probabilities is not None:
        want, atol, rtol = predicted.probabilities, np.asarray(SERVED_TOLERANCE), 0.0
    else:
        assert predicted.values is not None
        target = model.manifest.target
        std = np.asarray(target.std if target else [1.0] * predicted.values.shape[1], np.float64)
        want, atol, rtol = predicted.values, SERVED_TOLERANCE * std, RELATIVE
    front = (model.manifest, feeds) if feeds is not None else None
    return export_module(
        served_module(model),
        torch.from_numpy(rows),
        fmt,
        path,
        spec=spec,
        metadata=meta,
        expect=(want, atol, rtol),
        front=front,
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
    front: tuple[Manifest, dict[str, np.ndarray]] | None = None,
) -> Exported:
    """Export `module` (eval mode) for inputs like `x` (at least 2 rows: the batch axis is dynamic),
    load the file back and compare its outputs on `x` with `expect` (outputs, absolute tolerance
    per output column, relative tolerance of each value on top), else with the module's
    own within TOLERANCE. `spec` names the input and output tensors; `metadata` goes into the file.
    `front` (ONNX, kind columns_text): the manifest whose table graph goes before the module (`x`:
    its output), and the rows it takes, by input name (`x`'s), which the file is run on."""
    if fmt not in FORMATS:
        raise ExportFailed(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if front is not None and fmt != "onnx":
        raise ExportFailed(f"{fmt}: a table's text cells go into an ONNX graph only (no string tensors)")
    refuse_target(path, fmt)
    module = module.eval()
    if len(x) < 2:
        x = torch.cat([x, x])
    names = (spec.input.name, spec.output.name) if spec else ("input", "output")
    if front is not None:
        names = (ENCODED, names[1])
    work = _work_file(path)  # this export's own, renamed to `path` once checked
    try:
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
                run = _onnx(module, x, work, names, metadata or {}, front)
            else:
                run = _torch_export(module, x, work, metadata or {})
            got, one = run(slice(None)), run(slice(0, 1))
            with torch.no_grad():
                alone = module(x[:1]).float().numpy().astype(np.float64)  # the module on one row alone
        if got.shape != want.shape:
            raise ExportFailed(f"{path}: the exported model gives outputs of shape {got.shape}, not {want.shape}")
        gap = np.abs(got.astype(np.float64) - want)
        diff = float(gap.max()) if want.size else 0.0
        if not (gap <= bound).all():  # NaN fails too
            raise ExportFailed(
                f"{path}: the exported model's outputs differ from {against}'s by up to {diff:.3g} (tolerance {tolerance})"
            )
        lone = np.abs(one.astype(np.float64) - alone) if one.shape == alone.shape else np.array([np.inf])
        if not (lone <= bound[:1]).all():
            raise ExportFailed(
                f"{path}: on a batch of 1 row the exported model's outputs differ from the model's own by up to "
                f"{float(lone.max()):.3g} (tolerance {tolerance}; on {len(x)} rows they agree): the model's code treats one "
                "row otherwise (a branch on x.shape[0], a squeeze of the batch axis), and the file holds only what it "
                f"traced on {len(x)} rows: make forward the same for any batch size"
            )
    except BaseException:  # a refusal, an error, a Ctrl-C (KeyboardInterrupt)
        work.unlink(missing_ok=True)  # no file a server could pick up is left, only this export's own
        raise
    work.replace(path)
    unseen = int(feeds_unseen(*front).sum()) if front is not None else None
    return Exported(path, fmt, len(x), diff, against, tolerance, spec, unseen)


def _work_file(path: Path) -> Path:
    """A new empty file beside `path` that no other export uses: `NAME.partial-PID-RANDOM.onnx`
    (`.pt2`: torch.export.save wants that suffix), made with O_EXCL so that two exports to one
    `--out` at once never write, check, rename or delete each other's file; ExportFailed when the
    folder cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            work = path.with_name(f"{path.stem}.partial-{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")
            try:  # 0o666 less the umask: the renamed file is readable as any other the user writes
                os.close(os.open(work, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                return work
            except FileExistsError:
                continue
    except OSError as e:
        raise ExportFailed(
            f"--out {path} cannot be written ({e.strerror or e}): name a file in a folder you can write to"
        ) from None


def refuse_target(path: Path, fmt: Format) -> None:
    """ExportFailed when `path` is a folder, under a file, or a file other than an earlier export (.onnx, .pt2):
    an export never writes over a model, its card, metrics or data (`--out OUT/model.safetensors`
    replaced the model it was made from)."""
    if path.is_dir():
        raise ExportFailed(f"--out {path} is a folder: name the file, e.g. --out {path / ('model' + SUFFIX[fmt])}")
    for above in path.parents:
        if above.exists():
            if not above.is_dir():
                raise ExportFailed(f"--out {path}: {above} is a file, not a folder: name a file in a folder")
            break
    suggest = f"name the file, e.g. --out {path.parent / ('model' + SUFFIX[fmt])}"
    if path.exists() and path.suffix not in SUFFIX.values():
        raise ExportFailed(
            f"--out {path} exists and is not an export (.onnx, .pt2): an export never writes over another file "
            f"(a model, its card, metrics, data); {suggest}"
        )


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


def _torch_export(
    module: torch.nn.Module, x: torch.Tensor, path: Path, metadata: dict[str, str]
) -> Callable[[slice], np.ndarray]:
    """Export, save and load back: the loaded program's outputs on `x`'s rows, by slice."""
    program = _program(module, x)
    torch.export.save(program, str(path), extra_files=metadata)
    loaded = torch.export.load(str(path)).module()

    def run(rows: slice) -> np.ndarray:
        with torch.no_grad():
            try:
                return np.asarray(loaded(x[rows]).float().numpy())
            except Exception as e:  # noqa: BLE001 - a guard the program keeps (a batch size it refuses)
                raise ExportFailed(f"{path}: the exported program refuses {len(x[rows])} row(s): {_cause(e)}") from None

    return run


def _onnx(
    module: torch.nn.Module,
    x: torch.Tensor,
    path: Path,
    names: tuple[str, str],
    metadata: dict[str, str],
    front: tuple[Manifest, dict[str, np.ndarray]] | None = None,
) -> Callable[[slice], np.ndarray]:
    """Export and save the graph, load it in onnxruntime: its outputs on `x`'s rows (`front`'s
    feeds' rows), by slice."""
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
    _label(path, metadata, front[0] if front else None)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = front[1] if front else {session.get_inputs()[0].name: x.numpy()}

    def outputs(rows: slice) -> list[np.ndarray]:
        """Every output of the graph (kind columns_text: the served one, then `unseen`) on `rows`."""
        try:
            return list(session.run(None, {k: v[rows] for k, v in feeds.items()}))
        except Exception as e:  # noqa: BLE001 - onnxruntime's own error (a shape the graph fixed)
            raise ExportFailed(f"{path}: onnxruntime refuses {len(x[rows])} row(s): {_cause(e)}") from None

    whole, one = outputs(slice(None)), outputs(slice(0, 1))  # the graph run once on each: every check reads these
    if front is not None:
        _check_unseen(path, front[0], feeds, whole[1], one[1])

    def run(rows: slice) -> np.ndarray:
        return np.asarray((one if rows == slice(0, 1) else whole)[0], np.float32)

    return run


def _check_unseen(path: Path, manifest: Manifest, feeds: dict[str, np.ndarray], got: Any, one: Any) -> None:
    """The graph's `unseen` output on the check rows, whole (`got`) and on the first row alone
    (`one`), against `smlt predict`'s rule (`feeds_unseen`): ExportFailed naming the first cell
    they disagree on."""
    want = feeds_unseen(manifest, feeds)
    got, one = np.asarray(got), np.asarray(one)
    if got.shape != want.shape or one.shape != want[:1].shape or (got != want).any() or (one != want[:1]).any():
        bad = np.argwhere(got != want) if got.shape == want.shape else np.zeros((1, 2), int)
        i, k = (int(v) for v in bad[0]) if len(bad) else (0, 0)
        raise ExportFailed(
            f"{path}: the graph's {UNSEEN!r} output flags row {i}'s text cell {str(feeds[TEXT][i, k])!r} otherwise than "
            "smlt predict counts values the model never saw: report this as a bug in smlt"
        )


def _require_onnx() -> None:
    """ExportFailed naming the onnx extra when a module of it is missing: onnx (names the graph's
    batch axis, stores the spec), onnxscript (the dynamo exporter's), onnxruntime (the check)."""
    from importlib.util import find_spec

    missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if find_spec(m) is None]
    if missing:
        raise ExportFailed(
            f"ONNX export needs the onnx extra ({', '.join(missing)} not installed): pip install 'smlt[onnx]'"
        )


def _label(path: Path, metadata: dict[str, str], table: Manifest | None = None) -> None:
    """The saved graph with its batch axis named `batch` (torch names it after a symbol, `s31`) on
    every input and output, `table`'s graph before it (kind columns_text: `_table_graph`), and
    `metadata` in its metadata_props."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False)
    first = graph.graph.input[0].type.tensor_type.shape.dim
    symbol = first[0].dim_param if len(first) else ""
    for value in [*graph.graph.input, *graph.graph.output, *graph.graph.value_info]:
        dims = value.type.tensor_type.shape.dim
        if symbol and len(dims) and dims[0].dim_param == symbol:
            dims[0].dim_param = BATCH
    if table is not None:
        from onnx.compose import merge_models

        opset = next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))
        if opset < TEXT_OPSET:
            raise ExportFailed(
                f"the network's ONNX opset is {opset}: text cells need {TEXT_OPSET} (RegexFullMatch on strings)"
            )
        front = _table_graph(table, opset, graph.ir_version)
        served = [o.name for o in graph.graph.output]
        graph = merge_models(front, graph, io_map=[(ENCODED, ENCODED)], outputs=[*served, UNSEEN])
        outputs = sorted(graph.graph.output, key=lambda o: o.name == UNSEEN)  # merge_models puts front's first
        del graph.graph.output[:]
        graph.graph.output.extend(outputs)  # the served output first, as a graph of one input has it
    for key, text in metadata.items():
        graph.metadata_props.add(key=key, value=text)
    onnx.save(graph, str(path))


def _table_graph(manifest: Manifest, opset: int, ir_version: int) -> onnx.ModelProto:
    """Kind columns_text's preprocessing, `encode_columns` then the standardisation, as an ONNX
    graph from the inputs `numbers` (float32 [batch, N], NaN where missing; absent when N is 0) and
    `text` (string [batch, M], "" where missing) to ENCODED (float32 [batch, F]): a number column's
    missing cell its fill (NaN without one) and 1 in its indicator; a text column one 0/1 feature
    per level (RegexFullMatch of the level with the whitespace smlt's CSV reader strips around it,
    `_level_pattern`: ' Paris' is 'Paris', as `smlt predict` reads a CSV; a value none of them: all
    0), a missing cell ("" or only whitespace) the fill level's features (NaN without a fill) and 1
    in its indicator; the features gathered into `encode_columns`' order, minus the mean, over the
    std. A second output, UNSEEN (bool [batch, M]), is true for a text cell that is neither missing
    nor any of its column's levels: the cells encoded as none of them, that `smlt predict` counts as
    values the model never saw (`tabular.unseen_values`)."""
    from onnx import TensorProto, helper

    from smlt.runtime.data.tabular import width

    columns = manifest.columns or []
    numbers = [t for t in columns if t.kind == "numeric"]
    text = [t for t in columns if t.kind == "onehot"]
    nodes: list[onnx.NodeProto] = []
    consts: list[onnx.TensorProto] = []
    inputs: list[onnx.ValueInfoProto] = []

    def const(name: str, values: Any, kind: int = TensorProto.FLOAT, row: bool = True) -> str:
        """A constant [1, n] (a row broadcast over the batch), or [n] when not `row`."""
        values = list(values)
        consts.append(helper.make_tensor(f"smlt_{name}", kind, [1, len(values)] if row else [len(values)], values))
        return f"smlt_{name}"

    def node(op: str, args: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, args, [f"smlt_{out}"], name=f"smlt_{out}", **attrs))
        return f"smlt_{out}"

    # the pieces, concatenated: the numbers filled, their gaps, each text column's levels, their gaps
    pieces: list[str] = []
    own: dict[str, int] = {}  # a column's first feature in the pieces, by name
    gap: dict[str, int] = {}  # its gap's
    at = 0
    if numbers:
        inputs.append(helper.make_tensor_value_info(NUMBERS, TensorProto.FLOAT, [BATCH, len(numbers)]))
        fill = [float(t.fill) if isinstance(t.fill, (int, float)) else np.nan for t in numbers]
        gaps = node("IsNaN", [NUMBERS], "number_gaps")
        pieces.append(node("Where", [gaps, const("number_fill", fill), NUMBERS], "numbers_filled"))
        pieces.append(node("Cast", [gaps], "number_indicators", to=TensorProto.FLOAT))
        for j, t in enumerate(numbers):
            own[t.name], gap[t.name] = j, len(numbers) + j
        at = 2 * len(numbers)
    inputs.append(helper.make_tensor_value_info(TEXT, TensorProto.STRING, [BATCH, len(text)]))
    unseen: list[str] = []  # per text column, bool [batch, 1]: a cell neither missing nor a level
    text_gaps = node("RegexFullMatch", [TEXT], "text_gaps", pattern=f"{_SPACE}*")
    for k, t in enumerate(text):
        where = const(f"text_{k}_at", [k], TensorProto.INT64, row=False)
        cell = node("Gather", [TEXT, where], f"text_{k}", axis=1)
        each = [
            node("RegexFullMatch", [cell], f"text_{k}_is_{j}", pattern=_level_pattern(level))
            for j, level in enumerate(t.levels)
        ]
        matched = node("Concat", each, f"text_{k}_hot", axis=1) if len(each) > 1 else each[0]
        hot = node("Cast", [matched], f"text_{k}_features", to=TensorProto.FLOAT)
        empty = node("Gather", [text_gaps, where], f"text_{k}_gap", axis=1)
        fill = [float(level == str(t.fill)) if t.fill is not None else np.nan for level in t.levels]
        pieces.append(node("Where", [empty, const(f"text_{k}_fill", fill), hot], f"text_{k}_filled"))
        axis = const(f"text_{k}_axis", [1], TensorProto.INT64, row=False)
        known = node("Cast", [node("ReduceMax", [hot, axis], f"text_{k}_max")], f"text_{k}_known", to=TensorProto.BOOL)
        unseen.append(node("Not", [node("Or", [empty, known], f"text_{k}_seen")], f"text_{k}_unseen"))
        own[t.name] = at
        at += len(t.levels)
    pieces.append(node("Cast", [text_gaps], "text_indicators", to=TensorProto.FLOAT))
    for k, t in enumerate(text):
        gap[t.name] = at + k
    order: list[int] = []  # encode_columns' features, from the concatenated pieces
    for t in columns:
        order += range(own[t.name], own[t.name] + width(t) - int(t.indicator))
        order += [gap[t.name]] if t.indicator else []
    norm = manifest.normalization
    joined = node("Concat", pieces, "joined", axis=1)
    encoded = node("Gather", [joined, const("order", order, TensorProto.INT64, row=False)], "encoded", axis=1)
    centred = node("Sub", [encoded, const("mean", norm.mean, row=False)], "centred")
    nodes.append(
        helper.make_node("Div", [centred, const("std", norm.std, row=False)], [ENCODED], name="smlt_standardised")
    )
    if len(unseen) > 1:
        nodes.append(helper.make_node("Concat", unseen, [UNSEEN], name="smlt_unseen", axis=1))
    else:
        nodes.append(helper.make_node("Identity", unseen, [UNSEEN], name="smlt_unseen"))
    output = helper.make_tensor_value_info(ENCODED, TensorProto.FLOAT, [BATCH, len(order)])
    flags = helper.make_tensor_value_info(UNSEEN, TensorProto.BOOL, [BATCH, len(text)])
    graph = helper.make_graph(nodes, "smlt_table", inputs, [output, flags], initializer=consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def _level_pattern(level: str) -> str:
    """An RE2 pattern that fully matches a cell that is `level` once the whitespace around it is
    stripped, as smlt's CSV reader strips it (`_SPACE`); the level's characters matched as they
    are (every one but a letter or digit written as its code point: no regex meaning). A level
    with whitespace of its own around it (a Parquet string is kept as stored) matches only as it is."""
    exact = "".join(c if c.isalnum() else f"\\x{{{ord(c):X}}}" for c in level)
    return exact if level != level.strip() else f"{_SPACE}*{exact}{_SPACE}*"


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
        if "aten.item" in text or "zuf" in text:
            words = (
                "the model reads a tensor's value into Python (.item(), float(), int() or a branch on it): keep it "
                f"a tensor (torch.where, torch.clamp, torch.cond): {lines[0] if lines else type(e).__name__}"
            )
    numpy = (
        ".numpy() is not supported for tensor subclasses" in text
    )  # torch.export's fake tensor, asked for its values
    if numpy:
        words = (
            "the model turns a tensor into a NumPy array in its forward (.numpy(), np.asarray(t), np.clip(t, ...)), "
            "which torch.export cannot trace (an exported graph holds torch operations only): keep forward in torch "
            "ops (torch.clamp for np.clip, torch.exp for np.exp, torch.where for np.where)"
        )
    fixed = re.search(r"Constraints violated \(batch\)!.*?specialized it to be a constant \((\d+)\)", text, re.S)
    if fixed:
        words = (
            f"the model's code makes the batch size a constant ({fixed.group(1)} rows: a Python loop over the rows, "
            "or x.shape[0] used as a number), so the file could not take another batch size: compute on the whole "
            "batch at once (x @ w, torch.stack of whole tensors, x.reshape(x.shape[0], -1))"
        )
    at = f"{Path(call.group(1)).name}:{call.group(2)} `{call.group(3).strip()}`" if call else None
    at = at or (f"`{code.group(1).strip()}`" if code else None)
    caused = re.search(r"Caused by: \(([^()]+):(\d+) in \w+\)", text)  # a data-dependent read's line
    at = at or (f"{Path(caused.group(1)).name}:{caused.group(2)}" if caused else None)
    at = at or (_user_line(e) if numpy else None)
    parts = [f"operator {op}" if op else "", f"at {at}" if at else ""]
    where = " ".join(p for p in parts if p)
    return f"{where + ': ' if where else ''}{type(e).__name__}: {words[:300]}"


def _user_line(e: BaseException) -> str | None:
    """The last line of `e`'s traceback in neither torch, NumPy (np.clip's own Python) nor this
    module: the model's own code that called `.numpy()`, as "file:line `source`"."""
    import traceback

    theirs = tuple(str(Path(m.__file__).parent) + os.sep for m in (torch, np) if m.__file__)
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if not frame.filename.startswith(theirs) and frame.filename != __file__:
            code = f" `{frame.line.strip()}`" if frame.line else ""
            return f"{Path(frame.filename).name}:{frame.lineno}{code}"
    return None
