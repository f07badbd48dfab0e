"""The model as a server runs it: a run's network with the model card's numeric preprocessing and
its post-processing inside one torch module (`served_module`), so `smlt export` writes a graph that
takes what the data holds and gives what `smlt predict` gives, and the contract it keeps
(`ServingSpec`, stored in the exported file).

What the served model takes, by what the model was trained on (`input_kind`):

- `features` float32 [batch, F]: array features in the data's own units (sklearn:digits' 0..16
  pixel values, an .npz's x), standardised inside;
- `columns` float32 [batch, N]: a CSV/Parquet of number columns, one value per column in the
  spec's `columns` order, NaN for a missing cell (imputed inside, with its missing indicator, as
  prepare did; NaN in a column trained without missing values gives NaN outputs), standardised inside;
- `image` uint8 [batch, C, H, W]: pixels 0..255 at the recorded size and channels (float32 for an
  image array of floats, in its own units), normalised per channel inside;
- `token_ids` int64 [batch, T]: ids below the vocabulary size, as they are;
- `encoded_features` float32 [batch, F]: a table with a text or date column: the card's column
  transforms and standardisation applied (`apply_columns`' output:
  `smlt.load_model(RUN).serving_input(rows)`); a one-hot or hashed text column and a date column
  have no graph form.

What it gives: `probabilities` float32 [batch, classes] (a softmax; the class names are the spec's
`classes`), or `values` float32 [batch, targets] in the label's own units (the target scaling undone).
`raw=True` keeps the bare network instead: its input after the card's normalisation (`model_input`),
its logits or standardised regression values.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from smlt.inference import Kind, input_kind, value_features
from smlt.runtime.data.manifest import Manifest

if TYPE_CHECKING:
    from smlt.inference import Inputs, LoadedModel

SPEC_FORMAT: Final = "smlt-serving/1"
SPEC_KEY = "smlt.serving"  # ONNX metadata_props key / .pt2 extra file holding the spec's JSON
CARD_KEY = "smlt.model_card"  # the model card's JSON beside it (model.json without the metrics)
BATCH = "batch"  # the dynamic first axis of every input and output


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    dtype: Literal["float32", "uint8", "int64"]
    shape: list[int | str]  # "batch" first
    means: str  # what a server puts in (input) or reads out (output), in words


class ServingSpec(BaseModel):
    """The contract of an exported model: its input and output tensors, in words and names."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["smlt-serving/1"] = SPEC_FORMAT
    run_id: str
    model: str
    task: Literal["classification", "regression"]
    raw: bool  # True: the bare network (input after the card's normalisation, raw outputs)
    kind: str  # the input's kind (module docstring), "model_input" when raw
    input: TensorSpec
    output: TensorSpec
    columns: list[str] | None = None  # kind "columns": the input's columns, in order
    classes: list[str] | None = None  # classification: output column j is classes[j]
    targets: list[str] | None = None  # regression: output column j is targets[j]
    torch: str  # the torch that exported it (a .pt2 loads in a compatible torch only)


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
    """preprocess -> the run's network -> postprocess, in eval mode."""

    def __init__(self, network: nn.Module, pre: nn.Module, post: nn.Module) -> None:
        super().__init__()
        self.pre = pre
        self.network = network
        self.post = post

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.network(self.pre(x)))


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
    return Served(model.module, pre, post).eval()


def serving_spec(model: LoadedModel, raw: bool = False) -> ServingSpec:
    """The exported model's contract (raw: the bare network's)."""
    card = model.card
    classification = card.task == "classification"
    out_name = ("logits" if raw else "probabilities") if classification else ("scaled_values" if raw else "values")
    targets = None if classification else _targets(model)
    if raw:
        kind = "model_input"
        takes = (
            "the model's input after the card's normalisation (smlt.runtime.data.inputs.model_input): "
            f"{card.input_dtype} {'x'.join(map(str, card.input_shape))}"
        )
        gives = "logits (softmax them for probabilities)" if classification else "standardised values"
        if not classification:
            gives += " (times the card's target std, plus its mean, for the label's units)"
        dtype: Literal["float32", "uint8", "int64"] = card.input_dtype
        shape = list(card.input_shape)
        columns = None
    else:
        manifest = model.manifest
        kind = input_kind(manifest)
        dtype = _dtype(manifest, kind)
        shape = _input_shape(manifest, kind)
        takes = _image_takes(manifest) if kind == "image" else _TAKES[kind]
        columns = [t.name for t in manifest.columns or []] if kind == "columns" else None
        if classification:
            gives = "each class's probability (a softmax): the prediction is classes[argmax]"
        else:
            what = ", ".join(targets or []) if card.label else "values"
            gives = f"the predicted {what} in the label's own units (the training's target scaling undone)"
    in_name = "model_input" if raw else kind
    return ServingSpec(
        run_id=card.run_id,
        model=card.model.name,
        task=card.task,
        raw=raw,
        kind=kind,
        input=TensorSpec(name=in_name, dtype=dtype, shape=[BATCH, *shape], means=takes),
        output=TensorSpec(name=out_name, dtype="float32", shape=[BATCH, card.output_dim], means=gives),
        columns=columns,
        classes=model.classes if classification else None,
        targets=targets,
        torch=torch.__version__,
    )


_TAKES: dict[str, str] = {
    "features": "feature values in the data's own units (standardised inside)",
    "columns": "one value per column of `columns`, in that order, in the data's own units; NaN for a "
    "missing cell (imputed inside as the training data was)",
    "token_ids": "token ids in [0, vocabulary size): one outside (a negative padding id too) is the runtime's "
    "error, never a silent wrap",
    "encoded_features": "the rows with the card's column transforms and standardisation applied (a text or "
    "date column has no graph form): in Python smlt.load_model(RUN).serving_input(rows)",
}


def _image_takes(manifest: Manifest) -> str:
    c, h, w = manifest.x.shape
    if manifest.normalization.applied != "on_load":
        return f"images (batch, {c}, {h}, {w}), channels first, as the array's values in their own units (normalised inside)"
    mode = "grayscale (PIL mode L)" if c == 1 else "RGB"
    return (
        f"{mode} images of {w}x{h} pixels, uint8 0..255, channels first (batch, {c}, {h}, {w}), normalised inside: "
        f"an image file upright (its EXIF orientation applied), converted to {mode}, resized to {w}x{h} with "
        "PIL's bilinear filter when it is not that size (in Python smlt.load_model(RUN).serving_input(files))"
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
