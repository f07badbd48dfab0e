"""The dataset manifest: what one sample is (shape, dtype), the shards, the split, and every
transform applied at prepare time, so workers and later data apply exactly the same ones."""

from __future__ import annotations

import math
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_serializer, model_validator

from smlt.runtime.errors import InvalidDataset
from smlt.runtime.validation import field_errors

# Final: mypy reads it as the Literal the `format` field requires.
FORMAT: Final = "smlt-dataset/2"


class ShardInfo(BaseModel):
    key: str  # relative to the dataset prefix
    rows: int
    bytes: int
    sha256: str  # checked on load: a corrupt shard is an error, never silent garbage


class SplitInfo(BaseModel):
    rows: int
    shards: list[ShardInfo]
    # Classification: rows per class index (to the highest index present; None: not recorded, a
    # dataset prepared before they were, or regression). training.class_weights reads the train split's.
    class_counts: list[int] | None = None


class ArraySpec(BaseModel):
    """One sample of an array as the shards store it (the leading row axis left out).

    x: `[F]` tabular features, `[C, H, W]` images, `[T]` token ids. y: `[]` a class index
    (int64), `[K]` regression targets (float32)."""

    model_config = ConfigDict(extra="forbid")

    shape: list[int]
    dtype: Literal["float32", "uint8", "int64"]


class Normalization(BaseModel):
    """How stored x becomes the model's float input (`model_input` applies it).

    - `stored`: the shards already hold standardised float32 (tabular data); nothing on load.
    - `on_load`: the shards hold raw values (uint8 images); on load `(x - mean) / std` with the
      statistics (in the stored units, 0..255 for uint8) broadcast along `axis`.
    - `none`: used as stored (token ids)."""

    model_config = ConfigDict(extra="forbid")

    applied: Literal["stored", "on_load", "none"]
    axis: Literal["feature", "channel"] = "feature"
    mean: list[float] = []
    std: list[float] = []


class TargetScaling(BaseModel):
    """Regression targets are stored standardised; a prediction p means `p * std + mean` in the
    user's units. `val_var` is the validation split's variance per target in the user's units
    (the denominator of R²)."""

    model_config = ConfigDict(extra="forbid")

    mean: list[float]
    std: list[float]
    val_var: list[float]


# How a date column's cells write dates when not ISO 8601 (table_reader.DATE_FORMS).
DateFormat = Literal[
    "m/d/yyyy",
    "m/d/yyyy h:mm AM/PM",
    "d/m/yyyy",
    "d/m/yyyy h:mm AM/PM",
    "m.d.yyyy",
    "m.d.yyyy h:mm AM/PM",
    "d.m.yyyy",
    "d.m.yyyy h:mm AM/PM",
    "m-d-yyyy",
    "m-d-yyyy h:mm AM/PM",
    "d-m-yyyy",
    "d-m-yyyy h:mm AM/PM",
    "d-mon-yyyy",
    "d-mon-yyyy h:mm AM/PM",
    "d mon yyyy",
    "d mon yyyy h:mm AM/PM",
    "mon d, yyyy",
    "mon d, yyyy h:mm AM/PM",
    "yyyy/m/d",
    "yyyy/m/d h:mm AM/PM",
    "yyyy.m.d",
    "yyyy.m.d h:mm AM/PM",
]


class ColumnTransform(BaseModel):
    """What prepare did to one tabular source column (CSV, Parquet), in output-feature order."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Literal["numeric", "onehot", "hash", "date", "text"]
    # onehot: one feature per level, in this order; date: its features (tabular.DATE_FEATURES)
    levels: list[str] = []
    # hash: features from a stable hash of the value; text: of each word (tabular.text_features)
    buckets: int = 0
    # the imputed value (from the train split) for a missing cell: a date's is its days since 1970-01-01
    fill: float | str | None = None
    indicator: bool = False  # one more feature: 1 where the cell was missing
    # date: how its cells write dates, a table_reader.DATE_FORMS entry (`m/d/yyyy`, `d.m.yyyy`,
    # `m/d/yyyy h:mm AM/PM`, `d mon yyyy`, `mon d, yyyy`, ...);
    # None: ISO 8601 (or a Parquet date or timestamp column), as every date column before smlt read others
    date_format: DateFormat | None = None

    @model_serializer(mode="wrap")
    def _iso_unsaid(self, handler: Any) -> Any:
        """ISO dates (and every other kind) without a `date_format` key: manifests and model cards
        as before smlt read other dates."""
        out = handler(self)
        if self.date_format is None and isinstance(out, dict):
            out.pop("date_format", None)
        return out


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["smlt-dataset/2"] = FORMAT
    name: str
    source: str
    task: Literal["classification", "regression"]
    x: ArraySpec
    y: ArraySpec
    # Number of classes (classification) or of regression targets.
    outputs: int
    # Classification: the name of each class index, in order (image subfolders, CSV label levels,
    # numbers as written); None in manifests prepared before smlt recorded them.
    classes: list[str] | None = None
    train: SplitInfo
    validation: SplitInfo
    normalization: Normalization
    target: TargetScaling | None = None  # regression only
    columns: list[ColumnTransform] | None = None  # tabular sources only
    label: str | None = None  # the source's label column, when it had named columns
    vocab_size: int | None = None  # token sequences: ids are in [0, vocab_size)
    generation: int | None = None  # a pipeline's feature generation (FeatureSpec) it was prepared with

    @model_validator(mode="before")
    @classmethod
    def _from_format_1(cls, raw: Any) -> Any:
        """smlt-dataset/1 (flat float32 features, stored normalised) reads as its /2 equivalent."""
        if not isinstance(raw, dict) or raw.get("format") != "smlt-dataset/1":
            return raw
        raw = dict(raw)
        raw["format"] = FORMAT
        features = raw.pop("features", None)
        if isinstance(features, int):
            raw["x"] = {"shape": [features], "dtype": "float32"}
        regression = raw.get("task") == "regression"
        raw["y"] = {
            "shape": [raw.get("outputs", 1)] if regression else [],
            "dtype": "float32" if regression else "int64",
        }
        stats = raw.get("normalization") or {}
        raw["normalization"] = {"applied": "stored", "mean": stats.get("mean", []), "std": stats.get("std", [])}
        return raw

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample as the model receives it (after `model_input`)."""
        return tuple(self.x.shape)

    @property
    def features(self) -> int:
        """Values per sample (flat models such as mlp and logreg take this many inputs)."""
        return math.prod(self.x.shape)


def class_name(label: object) -> str:
    """A class label as `Manifest.classes` records it, as the user wrote it: `3` for a label read as
    3.0, the text of a text label."""
    if isinstance(label, float) and label.is_integer():
        return str(int(label))
    return str(label)


class FeatureSpec(BaseModel):
    """What a retraining pipeline fixes with its first version (its feature generation): every
    later version is transformed with it, so the model of one version fits the data of the next.
    The columns and their encodings, the statistics, the sample shape (an image size), the
    vocabulary, the classes and the regression targets' scaling; not the rows or the shards."""

    model_config = ConfigDict(extra="forbid")

    generation: int = 1
    task: Literal["classification", "regression"]
    x: ArraySpec
    y: ArraySpec
    outputs: int
    normalization: Normalization
    target_mean: list[float] | None = None  # regression: TargetScaling.mean/std (val_var is per version)
    target_std: list[float] | None = None
    columns: list[ColumnTransform] | None = None
    label: str | None = None
    vocab_size: int | None = None
    classes: list[str] | None = None

    def digest(self) -> str:
        """The features' identity, generation included: equal digests, interchangeable models."""
        import hashlib

        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


def feature_spec(m: Manifest, generation: int | None = None) -> FeatureSpec:
    """The features a manifest was prepared with, as a pipeline keeps them."""
    return FeatureSpec(
        generation=generation or m.generation or 1,
        task=m.task,
        x=m.x,
        y=m.y,
        outputs=m.outputs,
        normalization=m.normalization,
        target_mean=m.target.mean if m.target else None,
        target_std=m.target.std if m.target else None,
        columns=m.columns,
        label=m.label,
        vocab_size=m.vocab_size,
        classes=m.classes,
    )


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """A manifest from its bytes, or InvalidDataset naming `where` and the first bad field."""
    try:
        return Manifest.model_validate_json(raw)
    except ValidationError as e:
        err = field_errors(e, "manifest")[0]
        if err.type == "json_invalid":
            problem = f"not valid JSON ({err.message})"
        else:
            problem = f"not an smlt dataset manifest: {err}"
        raise InvalidDataset(
            f"{where} is {problem}; prepare the dataset again with `smlt data prepare SOURCE --out FOLDER`"
        ) from None


# A class with fewer rows than this, in a dataset whose largest class has RARE_CLASS_RATIO times
# as many, is likely a typo in the label column (`2` among 0s and 1s): said, not changed.
RARE_CLASS_ROWS = 5
RARE_CLASS_RATIO = 20


# A validation split of fewer rows than this measures too coarsely to stop a run or judge a gate on
# (its accuracy moves in steps of 1/rows): said, not changed.
SMALL_VALIDATION_ROWS = 30


def dataset_warnings(m: Manifest) -> list[str]:
    """What prepare warns of in a dataset it wrote: classes with almost no rows, a validation split
    too small to measure on."""
    return [w for w in (absent_classes(m), rare_classes(m) or untrained_classes(m), small_validation(m)) if w]


def _class_rows(m: Manifest) -> tuple[list[int], list[int]] | None:
    """A classification's train and validation rows per class, each as long as its classes (a
    split's counts end at its last class present: a bincount), else None."""
    train, val = m.train.class_counts, m.validation.class_counts
    if m.task != "classification" or m.classes is None or train is None or val is None:
        return None
    k = len(m.classes)
    return train + [0] * (k - len(train)), val + [0] * (k - len(val))


def _first_five(said: list[str]) -> str:
    """Up to five items of a message's list, and how many more."""
    return ", ".join(said[:5]) + (f" and {len(said) - 5} more" if len(said) > 5 else "")


def untrained_classes(m: Manifest) -> str | None:
    """What to say when classes have validation rows and no train row (a class of one row, dealt to the
    validation split): the model never learns them and the validation counts them wrong, else None."""
    counts = _class_rows(m)
    if counts is None or m.classes is None:
        return None
    alone = [(c, v) for c, t, v in zip(m.classes, *counts) if t == 0 and v > 0]
    if not alone:
        return None
    said = _first_five([f"{c!r} ({v:,} row{'s' * (v > 1)})" for c, v in alone])
    one = len(alone) == 1
    return (
        f"{m.source}: {'class' if one else 'classes'} {said} {'has' if one else 'have'} rows in the validation split "
        f"only: a model never learns {'it' if one else 'them'}, and the validation counts {'its' if one else 'their'} "
        "rows wrong; bring more rows of it, or another --seed deals them otherwise"
    )


def absent_classes(m: Manifest) -> str | None:
    """What to say when classes of the dataset have no row in it: a pipeline's later version whose
    upload lacks a class its features fix (filtered by mistake, or the class gone), else None."""
    counts = _class_rows(m)
    if counts is None or m.classes is None:
        return None
    k = len(m.classes)
    rows = [a + b for a, b in zip(*counts)]
    absent = [c for c, n in zip(m.classes, rows) if n == 0]
    if not absent:
        return None
    said = _first_five([repr(c) for c in absent])
    one = len(absent) == 1
    return (
        f"{m.source}: {'class' if one else 'classes'} {said} {'has' if one else 'have'} no row in this dataset, of the "
        f"{k} classes its features fix ({', '.join(m.classes[:10])}{', ...' if k > 10 else ''}): a model trained on it "
        f"never learns {'it' if one else 'them'} and its validation cannot measure {'it' if one else 'them'}; if the "
        "rows were left out by mistake (a filtered export), upload or prepare it again with them"
    )


def small_validation(m: Manifest) -> str | None:
    """What to say when the validation split holds fewer than SMALL_VALIDATION_ROWS rows, else None."""
    n = m.validation.rows
    if n >= SMALL_VALIDATION_ROWS:
        return None
    step = f"its accuracy moves in steps of {1 / n:.0%}" if m.task == "classification" and n else "a noisy measure"
    return (
        f"{m.source}: the validation split holds {n:,} row{'s' * (n != 1)}: the metric a run stops on and a "
        f"pipeline's gate compares is measured on {'it' if n == 1 else 'them'} ({step}); more rows, or `smlt data prepare` "
        "with a larger --validation-fraction, measure better"
    )


def rare_classes(m: Manifest) -> str | None:
    """What to say about a classification's classes with almost no rows (train and validation
    together), else None. A pipeline's later version (its classes fixed) says nothing: a class
    may be rare in one upload."""
    counts = _class_rows(m)
    if counts is None or m.classes is None or m.generation:
        return None
    rows = [a + b for a, b in zip(*counts)]
    rare = [(c, n) for c, n in zip(m.classes, rows) if 0 < n < RARE_CLASS_ROWS and n * RARE_CLASS_RATIO <= max(rows)]
    if not rare:
        return None
    said = _first_five([f"{c!r} {n:,} row{'s' * (n > 1)}" for c, n in rare])
    return (
        f"{m.source}: {'a class has' if len(rare) == 1 else f'{len(rare)} classes have'} almost no rows ({said}, "
        f"of {sum(rows):,}): too few to learn or to measure; a typo in the label column? They stay classes of the "
        "model: fix or drop those rows to leave them out"
    )
