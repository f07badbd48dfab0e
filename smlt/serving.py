"""The model as a server runs it: a run's network with the model card's numeric preprocessing and
its post-processing inside one torch module (`served_module`), so `smlt export` writes a graph that
takes what the data holds and gives what `smlt predict` gives, and the contract it keeps
(`ServingSpec`, stored in the exported file).

What the served model takes, by what the model was trained on (`input_kind`):

- `features` float32 [batch, F]: array features in the data's own units (sklearn:digits' 0..16
  pixel values, an .npz's x), standardised inside;
- `columns` float32 [batch, N]: a CSV/Parquet of number columns, one value per column in the
  spec's `columns` order, NaN for a missing cell (imputed inside, with its missing indicator, as
  prepare did; a dataset prepared with --missing refuse imputes nothing: NaN outputs), standardised inside;
- `image` uint8 [batch, C, H, W]: pixels 0..255 at the recorded size and channels (float32 for an
  image array of floats, in its own units), normalised per channel inside;
- `token_ids` int64 [batch, T]: ids below the vocabulary size, as they are;
- `columns_text` (ONNX only; spec format smlt-serving/2): a table of number columns and one-hot
  text columns (at most MAX_ONEHOT_LEVELS levels), two inputs: `numbers` float32 [batch, N] as
  `columns` takes them (left out when the table has none) and `text` string [batch, M], one cell
  per column of the spec's `text_columns`, its text as written (the graph strips the whitespace
  around it as smlt's CSV reader does: ' Paris' is 'Paris'; "" or only whitespace for a missing cell):
  equal to one of the column's levels, a 1 in that level's feature; any other value all zeros
  (`unseen_values`), and true in the second output `unseen`; "" the column's imputed level with its indicator (prepared with --missing
  refuse: NaN features, so NaN outputs, as NaN in a number column); encoded, imputed and
  standardised inside, in `encode_columns`' feature order (`exporter._table_graph`: ONNX's string
  `RegexFullMatch`, opset 20). In Python: `table_feeds(smlt.load_model(RUN), rows)`;
- `encoded_features` float32 [batch, F]: a table with a hashed or free-text column or a date
  column (those have no graph form), and a table with text columns exported with torch.export (no
  string tensors): the card's column transforms and standardisation applied (`apply_columns`'
  output: `smlt.load_model(RUN).serving_input(rows)`).

The spec's `format` is smlt-serving/1 for a model of one input, as before; smlt-serving/2 adds
`inputs` (every input, in order) and `text_columns`, for kind `columns_text` only, so a reader of /1
never meets a second input it would not feed.

What it gives: `probabilities` float32 [batch, classes] (a softmax; the class names are the spec's
`classes`), or `values` float32 [batch, targets] in the label's own units (the target scaling undone).
A float input's row that holds an infinity, or a NaN where nothing is imputed (what `smlt predict`
refuses), gives NaN in every output column of that row, whatever the network makes of it (`Served`).
Kind `columns_text` gives a second output after it, `unseen` bool [batch, M]: true for a text cell
that is none of its column's levels and not missing (another letter case, a typo, a new category),
the cells `smlt predict`'s notice counts ('N of M rows hold values the model never saw'), so a
server can log or refuse such a row; the spec's `outputs` lists both (format /2). A float tensor
carries no column names: no output can say number columns came in another order.
`raw=True` keeps the bare network instead: its input after the card's normalisation (`model_input`),
its logits or standardised regression values.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, model_serializer
from torch import nn

from smlt.inference import Kind, input_kind, value_features
from smlt.runtime.data.manifest import ColumnTransform, Manifest

if TYPE_CHECKING:
    from smlt.inference import Inputs, LoadedModel

SPEC_FORMAT: Final = "smlt-serving/1"
SPEC_FORMAT_INPUTS: Final = "smlt-serving/2"  # a model of more than one input (kind columns_text)
SPEC_KEY = "smlt.serving"  # ONNX metadata_props key / .pt2 extra file holding the spec's JSON
CARD_KEY = "smlt.model_card"  # the model card's JSON beside it (model.json without the metrics)
BATCH = "batch"  # the dynamic first axis of every input and output
NUMBERS, TEXT = "numbers", "text"  # kind columns_text's inputs
UNSEEN = "unseen"  # kind columns_text's second output: the text cells the model never saw
# What a served model of float inputs gives for a row it cannot answer (`Served`'s `finite`)
NAN_ROW = (
    "NaN in every output column for a row whose input holds an infinity, or a NaN where nothing is "
    "imputed (smlt predict refuses such a row): check np.isnan(out).any(1) before taking a row's argmax, "
    "which would name a class for it"
)


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    dtype: Literal["float32", "uint8", "int64", "string", "bool"]
    shape: list[int | str]  # "batch" first
    means: str  # what a server puts in (input) or reads out (output), in words


class ServingSpec(BaseModel):
    """The contract of an exported model: its input and output tensors, in words and names."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["smlt-serving/1", "smlt-serving/2"] = SPEC_FORMAT
    run_id: str
    model: str
    task: Literal["classification", "regression"]
    raw: bool  # True: the bare network (input after the card's normalisation, raw outputs)
    kind: str  # the input's kind (module docstring), "model_input" when raw
    input: TensorSpec  # the (first) input
    output: TensorSpec
    # kind "columns": the input's columns, in order; "columns_text": the `numbers` input's
    columns: list[str] | None = None
    # format /2 only (None: the key is left out, a /1 spec as before): every input, in the graph's
    # order (kind columns_text: `numbers` when the table has number columns, then `text`), and the
    # `text` input's columns, in order, and every output, in order (the served one, then `unseen`)
    inputs: list[TensorSpec] | None = None
    outputs: list[TensorSpec] | None = None
    text_columns: list[str] | None = None
    classes: list[str] | None = None  # classification: output column j is classes[j]
    targets: list[str] | None = None  # regression: output column j is targets[j]
    torch: str  # the torch that exported it (a .pt2 loads in a compatible torch only)

    @model_serializer(mode="wrap")
    def _one_input_unsaid(self, handler: Any) -> Any:
        """A /1 spec without the /2 keys: as smlt wrote it before there were two inputs."""
        out = handler(self)
        if self.inputs is None and isinstance(out, dict):
            out.pop("inputs", None)
            out.pop("outputs", None)
            out.pop("text_columns", None)
        return out


def onnx_table(manifest: Manifest) -> bool:
    """Whether an ONNX export of a model of this dataset takes the table's raw cells (kind
    columns_text): named columns, every one a number or one-hot text, one at least text."""
    kinds = {t.kind for t in manifest.columns or []}
    return manifest.normalization.applied == "stored" and "onehot" in kinds and kinds <= {"numeric", "onehot"}


def served_kind(manifest: Manifest, fmt: str = "onnx") -> str:
    """What the model `smlt export --format fmt` writes takes (the module docstring)."""
    return "columns_text" if fmt == "onnx" and onnx_table(manifest) else input_kind(manifest)


def _dtype(manifest: Manifest, kind: Kind) -> Literal["float32", "uint8", "int64"]:
    if kind == "token_ids":
        return "int64"
    return "uint8" if manifest.normalization.applied == "on_load" else "float32"


def _input_shape(manifest: Manifest, kind: Kind) -> list[int]:
    return [len(manifest.columns or [])] if kind == "columns" else list(manifest.x.shape)


# --------------------------------------------------------------------------------------------
# the module


class _Normalise(nn.Module):
    """(x as float32 - mean) / std along the normalisation's axis: `model_input` / `standardise`."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, manifest: Manifest) -> None:
        super().__init__()
        norm = manifest.normalization
        mean = torch.tensor(norm.mean, dtype=torch.float32)
        std = torch.tensor(norm.std, dtype=torch.float32)
        if norm.axis == "channel":  # (C, 1, 1): broadcast over (batch, C, H, W)
            shape = (len(norm.mean),) + (1,) * (len(manifest.x.shape) - 1)
            mean, std = mean.reshape(shape), std.reshape(shape)
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.float32) - self.mean) / self.std


class _Columns(nn.Module):
    """Number columns as prepare encoded them (`encode_columns`): a missing cell (NaN) is the
    column's imputed value, and 1 in its indicator feature, then the standardisation."""

    fill: torch.Tensor
    order: torch.Tensor

    def __init__(self, manifest: Manifest) -> None:
        super().__init__()
        columns = manifest.columns or []
        fill = [float(t.fill) if isinstance(t.fill, (int, float)) else math.nan for t in columns]
        n = len(columns)
        order: list[int] = []  # features = cat([filled columns, their gaps])[:, order]
        for j, t in enumerate(columns):
            order.append(j)
            if t.indicator:
                order.append(n + j)
        self.register_buffer("fill", torch.tensor(fill, dtype=torch.float32))
        self.register_buffer("order", torch.tensor(order, dtype=torch.int64))
        self.indicators = any(t.indicator for t in columns)
        self.normalise = _Normalise(manifest)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gaps = torch.isnan(x)
        filled = torch.where(gaps, self.fill, x)
        if self.indicators:
            filled = torch.cat([filled, gaps.to(torch.float32)], dim=1).index_select(1, self.order)
        return self.normalise(filled)


class _TokenIds(nn.Module):
    """Token ids as they are, a negative one made the vocabulary's size: ONNX's Gather reads -1 as
    the last id (a padding -1 would be a silent wrong answer); out of range, it is the runtime's
    error (onnxruntime: "indices element out of data bounds"; torch: "index out of range")."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.masked_fill(x < 0, self.vocab_size)


class _Unscale(nn.Module):
    """Standardised regression outputs in the label's units: `p * std + mean` (TargetScaling)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y.to(torch.float32) * self.std + self.mean


class _Softmax(nn.Module):
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.softmax(y.to(torch.float32), dim=1)


class Served(nn.Module):
    """preprocess -> the run's network -> postprocess, in eval mode. With `finite` (float inputs),
    a row whose network input holds a NaN or an infinity after the preprocessing (an infinity, a
    NaN where nothing is imputed: what `smlt predict` refuses) gives NaN in every output, whatever
    the network makes of it (a clamp of its input would give a finite answer a server takes for one)."""

    def __init__(self, network: nn.Module, pre: nn.Module, post: nn.Module, finite: bool = False) -> None:
        super().__init__()
        self.pre = pre
        self.network = network
        self.post = post
        self.finite = finite

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.pre(x)
        y = self.post(self.network(z))
        if not self.finite:
            return y
        # 0 for a row of finite values, NaN for one with a NaN or an infinity (0 * inf is NaN):
        # exact for every other row (y + 0), and cheaper in a graph than isfinite, all and where
        return y + (z.to(torch.float32) * 0).flatten(1).sum(dim=1, keepdim=True)


def nan_rows(manifest: Manifest) -> bool:
    """Whether the served model's input is float (features, columns, float images, encoded
    features), so that a row can hold a NaN or an infinity: NaN outputs for it (`Served`)."""
    return input_kind(manifest) != "token_ids" and manifest.normalization.applied != "on_load"


def served_module(model: LoadedModel) -> Served:
    """The run's network with the card's numeric pre- and post-processing around it."""
    manifest = model.manifest
    kind = input_kind(manifest)
    pre: nn.Module = nn.Identity()
    if kind == "columns":
        pre = _Columns(manifest)
    elif kind in ("features", "image"):
        pre = _Normalise(manifest)
    elif kind == "token_ids" and manifest.vocab_size:
        pre = _TokenIds(manifest.vocab_size)
    post: nn.Module
    if manifest.task == "classification":
        post = _Softmax()
    elif manifest.target is not None:
        post = _Unscale(manifest.target.mean, manifest.target.std)
    else:
        post = nn.Identity()
    return Served(model.module, pre, post, finite=nan_rows(manifest)).eval()


def serving_spec(model: LoadedModel, raw: bool = False, fmt: str = "onnx") -> ServingSpec:
    """The contract of the model `smlt export --format fmt` writes (raw: the bare network's)."""
    card = model.card
    classification = card.task == "classification"
    out_name = ("logits" if raw else "probabilities") if classification else ("scaled_values" if raw else "values")
    targets = None if classification else _targets(model)
    columns = text = None
    if raw:
        kind = "model_input"
        takes = (
            "the model's input after the card's normalisation (smlt.runtime.data.inputs.model_input): "
            f"{card.input_dtype} {'x'.join(map(str, card.input_shape))}"
        )
        inputs = [TensorSpec(name=kind, dtype=card.input_dtype, shape=[BATCH, *card.input_shape], means=takes)]
        gives = "logits (softmax them for probabilities)" if classification else "standardised values"
        if not classification:
            gives += " (times the card's target std, plus its mean, for the label's units)"
    else:
        manifest = model.manifest
        kind = served_kind(manifest, fmt)
        if kind == "columns_text":
            inputs, columns, text = _table_inputs(manifest)
        else:
            base = input_kind(manifest)
            takes = _image_takes(manifest) if base == "image" else _TAKES[base]
            shape: list[int | str] = [BATCH, *_input_shape(manifest, base)]
            inputs = [TensorSpec(name=base, dtype=_dtype(manifest, base), shape=shape, means=takes)]
            columns = [t.name for t in manifest.columns or []] if base == "columns" else None
        if classification:
            gives = "each class's probability (a softmax): the prediction is classes[argmax]"
        else:
            what = ", ".join(targets or []) if card.label else "values"
            gives = f"the predicted {what} in the label's own units (the training's target scaling undone)"
        if nan_rows(manifest):
            gives += f"; {NAN_ROW}"
    output = TensorSpec(name=out_name, dtype="float32", shape=[BATCH, card.output_dim], means=gives)
    return ServingSpec(
        format=SPEC_FORMAT if text is None else SPEC_FORMAT_INPUTS,
        run_id=card.run_id,
        model=card.model.name,
        task=card.task,
        raw=raw,
        kind=kind,
        input=inputs[0],
        output=output,
        columns=columns,
        inputs=None if text is None else inputs,
        outputs=None if text is None else [output, _unseen_output(text)],
        text_columns=text,
        classes=model.classes if classification else None,
        targets=targets,
        torch=torch.__version__,
    )


def _table_inputs(manifest: Manifest) -> tuple[list[TensorSpec], list[str] | None, list[str]]:
    """Kind columns_text's inputs (`numbers` when the table has number columns, then `text`), its
    number columns (None: none) and its text columns."""
    numbers = [t.name for t in manifest.columns or [] if t.kind == "numeric"]
    text = [t.name for t in manifest.columns or [] if t.kind == "onehot"]
    inputs = [TensorSpec(name=TEXT, dtype="string", shape=[BATCH, len(text)], means=_TAKES[TEXT])]
    if numbers:
        inputs.insert(0, TensorSpec(name=NUMBERS, dtype="float32", shape=[BATCH, len(numbers)], means=_TAKES[NUMBERS]))
    return inputs, numbers or None, text


def _unseen_output(text: list[str]) -> TensorSpec:
    return TensorSpec(
        name=UNSEEN,
        dtype="bool",
        shape=[BATCH, len(text)],
        means="true for a text cell (one per column of `text_columns`) that is none of its column's levels and not "
        "missing: a value the model never saw in training (another letter case, a typo, a new category), encoded as "
        "none of the levels, so that row's output is unreliable; the cells `smlt predict` counts in its notice "
        "'N of M rows hold values the model never saw': log, flag or reject such a row",
    )


_TAKES: dict[str, str] = {
    "features": "feature values in the data's own units (standardised inside)",
    "columns": "one value per column of `columns`, in that order, in the data's own units; NaN for a "
    "missing cell (imputed inside as the training data was); a float tensor carries no column names, so the "
    "graph cannot tell columns sent in another order: build the row from `columns` by name",
    "token_ids": "token ids in [0, vocabulary size): one outside (a negative padding id too) is the runtime's "
    "error, never a silent wrap",
    NUMBERS: "one value per number column of `columns`, in that order, in the data's own units; NaN for a "
    "missing cell (imputed inside as the training data was); a float tensor carries no column names, so the "
    "graph cannot tell columns sent in another order: build the row from `columns` by name",
    TEXT: "one cell per text column of `text_columns`, in that order, its text as written, case kept, a boolean "
    "as the CSV held it ('False', never \"\", which is a missing cell); the whitespace around it is stripped "
    'inside, as smlt\'s CSV reader strips it; "" for a missing cell (imputed inside as the training data was); a '
    "value that is none of the column's levels (the model card's) is encoded as none of them, as smlt predict "
    "does, and flagged in the output `unseen`",
    "encoded_features": "the rows with the card's column transforms and standardisation applied (a hashed or "
    "free-text column and a date column have no graph form; number and one-hot text columns have one in "
    "ONNX only): in Python smlt.load_model(RUN).serving_input(rows); elsewhere from the model card stored beside "
    "this spec (smlt.model_card: its features.columns, in order, and features.normalization), as smlt's README "
    "('Use the model') spells it out",
}


def _image_takes(manifest: Manifest) -> str:
    c, h, w = manifest.x.shape
    if manifest.normalization.applied != "on_load":
        return f"images (batch, {c}, {h}, {w}), channels first, as the array's values in their own units (normalised inside)"
    mode = "grayscale (PIL mode L)" if c == 1 else "RGB"
    return (
        f"{mode} images of {w}x{h} pixels, uint8 0..255, channels first (batch, {c}, {h}, {w}), normalised inside: "
        f"an image file upright (its EXIF orientation applied), a 16-bit grayscale one (PIL mode I;16 or I) made "
        "8-bit as round(value / 257) (PIL's own convert clips it at 255), converted to "
        f"{mode}, resized to {w}x{h} with PIL's bilinear filter when it is not that size (in Python "
        "smlt.load_model(RUN).serving_input(files))"
    )


def _targets(model: LoadedModel) -> list[str]:
    label = model.card.label
    n = model.card.output_dim
    if label and n == 1:
        return [label]
    return ["prediction"] if n == 1 else [f"prediction_{j}" for j in range(n)]


# --------------------------------------------------------------------------------------------
# rows in the served form


def stored_rows(model: LoadedModel, x: np.ndarray) -> Inputs:
    """The served input `x` as `smlt predict` reads the same rows (its own functions: the
    recorded standardisation, `apply_columns`), for `predict_rows`."""
    from smlt.inference import Inputs, read_inputs, table_inputs
    from smlt.runtime.data.tabular import Table

    manifest = model.manifest
    kind = input_kind(manifest)
    if kind == "encoded_features":
        return Inputs(np.asarray(x, np.float32), [str(i) for i in range(len(x))])
    if kind == "columns":
        cols = {t.name: np.asarray(x[:, j], np.float64) for j, t in enumerate(manifest.columns or [])}
        return table_inputs(manifest, Table("serving input", cols, np.arange(len(x)), "row"))
    return read_inputs(manifest, x)


def example_rows(model: LoadedModel, rows: int = 8) -> np.ndarray:
    """A seeded batch of served input in the data's units (some missing cells for imputed columns)."""
    manifest = model.manifest
    kind = input_kind(manifest)
    g = np.random.default_rng(0)
    shape = (rows, *_input_shape(manifest, kind))
    if kind == "token_ids":
        return g.integers(0, manifest.vocab_size or 2, shape, dtype=np.int64)
    if manifest.normalization.applied == "on_load":
        return g.integers(0, 256, shape, dtype=np.uint8)
    z = g.standard_normal(shape).astype(np.float32)
    if kind == "encoded_features":
        return z
    norm = manifest.normalization
    mean, std = np.asarray(norm.mean, np.float32), np.asarray(norm.std, np.float32)
    if kind == "columns":
        at = value_features(manifest)
        x = z * std[at] + mean[at]
        for j, t in enumerate(manifest.columns or []):
            if t.fill is not None:
                x[j % rows, j] = np.nan  # imputed inside the graph
        return x
    if norm.axis == "channel":
        shape_c = (1, len(mean)) + (1,) * (len(shape) - 2)
        mean, std = mean.reshape(shape_c), std.reshape(shape_c)
    return (z * std + mean).astype(np.float32)


# --------------------------------------------------------------------------------------------
# kind columns_text: a table's raw cells, two inputs


def table_feeds(model: LoadedModel, data: Any = None, rows: int | None = None) -> dict[str, np.ndarray]:
    """The inputs of kind columns_text (`numbers` float32, NaN where a cell is missing, and `text`,
    an object array of str, "" where missing) for `data`'s first `rows` rows: a table file or
    DataFrame read as `smlt predict` reads it (its refusals and notices), other data (a prepared
    dataset folder) its stored rows read back (an unseen level: a value none of the column's);
    None: a seeded batch with missing cells and unseen values where the columns allow them."""
    from smlt.inference import _is_table, read_table_rows, serving_input, table_inputs
    from smlt.runtime.data.tabular import Table, missing

    manifest = model.manifest
    columns = manifest.columns or []
    if data is None:
        return _example_feeds(manifest)
    if not _is_table(data):
        return _stored_feeds(manifest, serving_input(model, data)[:rows])
    table = read_table_rows(manifest, data)
    if rows is not None:
        table = Table(table.path, {n: c[:rows] for n, c in table.columns.items()}, table.rows[:rows], table.unit)
    table_inputs(manifest, table)  # predict's refusal of a bad cell, by name, and its notices
    numbers, text = [], []
    for t in columns:
        cells = table.columns[t.name]
        if t.kind == "numeric":
            numbers.append(cells if cells.dtype.kind == "f" else np.where(cells == "", "nan", cells).astype(np.float64))
        else:
            text.append(np.where(missing(cells), "", cells.astype(str)))
    return _feeds(len(table), numbers, text)


def feeds_inputs(model: LoadedModel, feeds: dict[str, np.ndarray]) -> Inputs:
    """Kind columns_text's inputs as `smlt predict` reads the same rows (`apply_columns`)."""
    from smlt.inference import Inputs
    from smlt.runtime.data.tabular import Table, apply_columns

    manifest = model.manifest
    n = len(feeds[TEXT])
    numbers, text = iter(feeds.get(NUMBERS, np.zeros((n, 0), np.float32)).T), iter(feeds[TEXT].T)
    cols = {
        t.name: np.asarray(next(numbers), np.float64) if t.kind == "numeric" else np.asarray(next(text), str)
        for t in manifest.columns or []
    }
    x = apply_columns(manifest, Table("serving input", cols, np.arange(n), "row"))
    return Inputs(x, [str(i) for i in range(n)])


def feeds_unseen(manifest: Manifest, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Kind columns_text's `unseen` output for these inputs by `smlt predict`'s rule
    (`tabular.unseen_values`): bool [rows, text columns], a cell neither missing ("" or only
    whitespace) nor one of its column's levels (once stripped, as the graph and smlt's CSV reader
    strip it)."""
    text = [t for t in manifest.columns or [] if t.kind == "onehot"]
    cells = np.asarray(feeds[TEXT], object).reshape(len(feeds[TEXT]), len(text))
    out = np.zeros(cells.shape, bool)
    for k, t in enumerate(text):
        stripped = np.array([str(c).strip() for c in cells[:, k]], object)
        own = np.array([str(c) in t.levels for c in cells[:, k]], bool)  # a level kept with its own spaces
        out[:, k] = (stripped != "") & ~np.isin(stripped, list(t.levels)) & ~own
    return out


def _feeds(n: int, numbers: list[np.ndarray], text: list[np.ndarray]) -> dict[str, np.ndarray]:
    feeds = {TEXT: np.stack(text, axis=1).astype(object) if text else np.zeros((n, 0), object)}
    if numbers:
        feeds = {NUMBERS: np.stack(numbers, axis=1).astype(np.float32), **feeds}
    return feeds


def unseen_level(t: ColumnTransform) -> str:
    """A value that is none of a one-hot column's levels (nor empty)."""
    value = "<unseen>"
    while value in t.levels:
        value += "_"
    return value


def _example_feeds(manifest: Manifest, rows: int = 8) -> dict[str, np.ndarray]:
    """A seeded batch: numbers about the data's, each level, an unseen value and a missing cell
    where the column was imputed."""
    from smlt.runtime.data.tabular import width

    g = np.random.default_rng(0)
    norm = manifest.normalization
    numbers: list[np.ndarray] = []
    text: list[np.ndarray] = []
    at = 0
    for j, t in enumerate(manifest.columns or []):
        if t.kind == "numeric":
            x = g.standard_normal(rows) * norm.std[at] + norm.mean[at]
        else:
            x = np.array([*t.levels, unseen_level(t)], object)[g.integers(0, len(t.levels) + 1, rows)]
            x[(j + 1) % rows] = unseen_level(t)
        if t.fill is not None:
            x[j % rows] = np.nan if t.kind == "numeric" else ""
        (numbers if t.kind == "numeric" else text).append(x)
        at += width(t)
    return _feeds(rows, numbers, text)


def _stored_feeds(manifest: Manifest, stored: np.ndarray) -> dict[str, np.ndarray]:
    """Stored (standardised) rows back as kind columns_text's inputs: a number column's value (NaN
    where its indicator is 1), a text column's level whose feature is 1 ("" where its indicator is
    1, an unseen value where none is)."""
    from smlt.runtime.data.tabular import width

    norm = manifest.normalization
    x = stored.astype(np.float32) * np.asarray(norm.std, np.float32) + np.asarray(norm.mean, np.float32)
    numbers: list[np.ndarray] = []
    text: list[np.ndarray] = []
    at = 0
    for t in manifest.columns or []:
        n = width(t) - int(t.indicator)
        gaps = x[:, at + n] > 0.5 if t.indicator else np.zeros(len(x), bool)
        if t.kind == "numeric":
            numbers.append(np.where(gaps, np.nan, x[:, at]))
        else:
            levels = np.array([*t.levels, unseen_level(t)], object)
            hot = x[:, at : at + n] > 0.5
            cells = levels[np.where(hot.any(axis=1), hot.argmax(axis=1), n)]
            text.append(np.where(gaps, "", cells))
        at += width(t)
    return _feeds(len(x), numbers, text)
