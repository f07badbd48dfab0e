"""`smlt data prepare`: a source (smlt.runtime.data.sources) split, transformed with statistics from its
train split, and written as safetensors shards plus `manifest.json`, to a local folder or an
`s3://bucket/prefix/`. The shards come first and the manifest last, so a manifest always
describes shards that exist.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from smlt.runtime.data import arrays, tabular
from smlt.runtime.data.manifest import (
    ArraySpec,
    ColumnTransform,
    FeatureSpec,
    Manifest,
    ShardInfo,
    SplitInfo,
    TargetScaling,
    parse_manifest,
)
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.sources import Source, load_source
from smlt.runtime.errors import InvalidDataset

Writer = Callable[[str, bytes], object]


def prepare_dataset(
    source: str,
    dest: str,
    *,
    shards: int = 16,
    validation_fraction: float = 0.2,
    seed: int = 0,
    name: str | None = None,
    options: SourceOptions | None = None,
    replace: bool = False,
    features: FeatureSpec | None = None,
    generation: int | None = None,
) -> Manifest:
    """Shard a dataset into `dest` (a folder or s3:// prefix) and write its manifest. A `dest`
    holding an earlier dataset is refused, or with `replace` that dataset's files are removed first
    (never a stale shard beside the new manifest). With `features` (a pipeline's FeatureSpec) the
    source is transformed with them instead of with statistics of its own: its columns, encodings,
    statistics, shape, vocabulary and classes."""
    earlier = _earlier_dataset(dest)  # before the source is read: a refusal costs nothing
    if earlier and not replace:
        raise InvalidDataset(
            f"--out {dest} holds an earlier dataset ({_files(earlier)}): pass --replace to remove it and "
            "prepare this one in its place, or choose an empty --out folder"
        )
    if shards < 1:
        raise InvalidDataset(f"shards: need at least 1 shard, got {shards}")
    if not 0 < validation_fraction < 1:
        raise InvalidDataset(f"validation_fraction must be between 0 and 1, got {validation_fraction}")
    opts = options or SourceOptions()
    if features is not None:
        opts = _options_of(features, source, opts)
    src = load_source(source, opts)
    if src.table is not None and opts.missing == "refuse":  # the first empty cell in file order
        tabular.refuse_missing(src.table, src.features)
    if src.table is not None:  # NaN, Inf or beyond float32, named by its line before any split
        used = [t.name for t in features.columns] if features is not None and features.columns else src.features
        tabular.refuse_non_finite(src.table, [c for c in used if c in src.table.columns])
    elif src.x is not None:
        arrays.refuse_non_finite(src.x, source, rows=np.arange(len(src.x)))
    order = np.random.default_rng(seed).permutation(len(src))
    n_val = max(1, int(round(len(src) * validation_fraction)))
    if n_val >= len(src):
        raise InvalidDataset(f"{source}: {len(src)} rows leave none for training after the validation split")
    val, train = order[:n_val], order[n_val:]
    y, y_spec, outputs, target, classes = _labels(src, source, train, val, features)
    if features is None:
        stored, columns = _fit_x(src, source, train, val, opts)
    else:
        stored, columns = _apply_x(src, source, train, val, features)
    manifest = Manifest(
        name=name or src.name,
        source=source,
        task=src.task,
        x=stored.spec,
        y=y_spec,
        outputs=outputs,
        classes=classes,
        train=SplitInfo(rows=len(train), shards=[]),
        validation=SplitInfo(rows=len(val), shards=[]),
        normalization=stored.normalization,
        target=target,
        columns=columns,
        label=src.label,
        vocab_size=stored.vocab_size,
        generation=features.generation if features else generation,
    )
    if src.table is not None:  # validation rows go through the recorded transforms, as later data will
        stored.validation = tabular.apply_columns(manifest, src.table.take(val))
    # What the shards will hold, after standardisation (a pipeline's statistics too): never NaN or
    # Inf, which a worker could only turn into a diverged round.
    names = tabular.feature_names(columns) if columns else None
    for split, x, index in (("train", stored.train, train), ("validation", stored.validation, val)):
        rows, unit = (src.table.rows[index], src.table.unit) if src.table is not None else (index, "row")
        arrays.refuse_non_finite(x, f"{source} ({split} split, standardised)", names, rows, unit)
    out = _writer(dest)
    if earlier:
        _remove(dest, earlier)
    manifest = manifest.model_copy(
        update={
            "train": _write_split(out, "train", stored.train, y[train], min(shards, len(train))),
            "validation": _write_split(
                out, "validation", stored.validation, y[val], min(max(1, shards // 2), len(val))
            ),
        }
    )
    out("manifest.json", manifest.model_dump_json(indent=1).encode())
    return manifest


def _fit_x(
    src: Source, source: str, train: np.ndarray, val: np.ndarray, opts: SourceOptions
) -> tuple[arrays.StoredX, list[ColumnTransform] | None]:
    """Stored x with statistics from the train split; for a table also its column transforms (its
    validation x is left to `apply_columns`)."""
    if src.table is None:
        assert src.x is not None
        return arrays.store(src.x[train], src.x[val], source, src.vocab_size), None
    rows = src.table.take(train)
    columns = tabular.fit_columns(rows, src.features, impute=opts.missing == "impute")
    features = tabular.encode_columns(columns, rows)
    return arrays.store(features, features[:0], source), columns


def _options_of(features: FeatureSpec, source: str, opts: SourceOptions) -> SourceOptions:
    """The options that read a source as the pipeline's first version was read: its label,
    task, image size and vocabulary."""
    from smlt.runtime.data import images

    fixed: dict[str, object] = {"label": features.label, "task": features.task, "vocab_size": features.vocab_size}
    if images.is_image_folder(Path(source)) and len(features.x.shape) == 3:
        fixed.update(image_size=features.x.shape[-1], channels=features.x.shape[0])
    return opts.model_copy(update={k: v for k, v in fixed.items() if v is not None})


def _apply_x(
    src: Source, source: str, train: np.ndarray, val: np.ndarray, features: FeatureSpec
) -> tuple[arrays.StoredX, list[ColumnTransform] | None]:
    """Stored x transformed with a pipeline's features (no statistics of this source's own)."""
    gen = f"the pipeline's features (generation {features.generation})"
    if src.table is not None:
        if features.columns is None:
            raise InvalidDataset(f"{source}: a table, but {gen} are not from named columns")
        known = {t.name for t in features.columns}
        new = [c for c in src.features if c not in known]
        if new:
            from smlt.runtime.progress import notice

            notice.warning(
                f"{source}: column {', '.join(map(repr, new))} is not among {gen}: ignored "
                "(prepare with --new-features to start a generation that uses it)"
            )
        absent = [t.name for t in features.columns if t.name not in src.table.columns]
        if absent:
            raise InvalidDataset(
                f"{source}: no column {', '.join(map(repr, absent))}, which {gen} use; add it, or prepare "
                "with --new-features to start a generation without it"
            )
        norm = features.normalization
        x_train = arrays.standardise(tabular.encode_columns(features.columns, src.table.take(train)), norm)
        return arrays.StoredX(x_train, x_train[:0], features.x, norm), features.columns
    assert src.x is not None
    x = src.x
    if list(x.shape[1:]) != features.x.shape:
        raise InvalidDataset(
            f"{source}: one sample has shape {list(x.shape[1:])}, {gen} {features.x.shape}; "
            "prepare with --new-features to start a generation with this shape"
        )
    norm = features.normalization
    if features.x.dtype == "int64":
        high = int(x.max()) if x.size else 0
        if features.vocab_size is not None and high >= features.vocab_size:
            raise InvalidDataset(f"{source}: token id {high} is not below {gen}' vocabulary size {features.vocab_size}")
        return arrays.StoredX(x[train].astype(np.int64), x[val].astype(np.int64), features.x, norm), None
    if norm.applied == "on_load":  # raw uint8 images, normalised by the workers with these statistics
        return arrays.StoredX(x[train].astype(np.uint8), x[val].astype(np.uint8), features.x, norm), None
    xf = x.astype(np.float32, copy=False)
    arrays.refuse_non_finite(xf, source)
    return arrays.StoredX(
        arrays.standardise(xf[train], norm), arrays.standardise(xf[val], norm), features.x, norm
    ), None


def _labels(
    src: Source, source: str, train: np.ndarray, val: np.ndarray, features: FeatureSpec | None = None
) -> tuple[np.ndarray, ArraySpec, int, TargetScaling | None, list[str] | None]:
    """(stored y for every row, its spec, outputs, target scaling, classes): class indices, or
    regression targets standardised with the train split's mean and std (or the pipeline's)."""
    if src.task == "classification":
        if src.y.ndim != 1:
            raise InvalidDataset(f"{source}: class labels must be one per row, got y of shape {src.y.shape}")
        if features is not None and features.classes is not None:
            return _known_classes(src, source, features)
        classes, index = np.unique(src.y, return_inverse=True)
        if len(classes) < 2:
            raise InvalidDataset(
                f"{source}: every label is {classes[0].item()!r}: a classifier needs at least 2 classes "
                "(or pass --task regression)"
            )
        names = [_class_name(c) for c in classes]
        return index.astype(np.int64), ArraySpec(shape=[], dtype="int64"), len(classes), None, names
    try:
        y = src.y.astype(np.float64).reshape(len(src.y), -1)
    except ValueError:
        raise InvalidDataset(f"{source}: regression targets must be numbers") from None
    if not np.isfinite(y).all():
        raise InvalidDataset(f"{source}: regression targets contain NaN or Inf")
    if features is not None and features.target_mean is not None and features.target_std is not None:
        if y.shape[1] != len(features.target_mean):
            raise InvalidDataset(
                f"{source}: {y.shape[1]} regression targets, the pipeline's features {len(features.target_mean)}"
            )
        mean, std = np.asarray(features.target_mean), np.asarray(features.target_std)
    else:
        mean, std = y[train].mean(axis=0), y[train].std(axis=0)
        std = np.where(std < 1e-12, 1.0, std)
    target = TargetScaling(mean=mean.tolist(), std=std.tolist(), val_var=y[val].var(axis=0).tolist())
    stored = ((y - mean) / std).astype(np.float32)
    return stored, ArraySpec(shape=[int(y.shape[1])], dtype="float32"), int(y.shape[1]), target, None


def _class_name(value: object) -> str:
    """A class label as the manifest records it: whole numbers without a decimal point."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value.item() if isinstance(value, np.generic) else value)


def _known_classes(
    src: Source, source: str, features: FeatureSpec
) -> tuple[np.ndarray, ArraySpec, int, None, list[str]]:
    """Class indices in the pipeline's order; a label it has never seen is refused by name."""
    assert features.classes is not None
    index_of = {name: i for i, name in enumerate(features.classes)}
    names = [_class_name(v) for v in src.y]
    unseen = sorted({n for n in names if n not in index_of})
    if unseen:
        raise InvalidDataset(
            f"{source}: label {unseen[0]!r} is not one of the pipeline's classes ({', '.join(features.classes)}); "
            "a new class changes the model's outputs: prepare with --new-features to start a new generation"
        )
    index = np.array([index_of[n] for n in names], np.int64)
    return index, ArraySpec(shape=[], dtype="int64"), len(features.classes), None, list(features.classes)


def _write_split(out: Writer, split: str, x: np.ndarray, y: np.ndarray, shards: int) -> SplitInfo:
    infos = []
    small, extra = divmod(len(x), shards)  # np.array_split's sizes: the first `extra` one row larger
    bounds = np.cumsum([0] + [small + 1] * extra + [small] * (shards - extra))
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        if hi == lo:
            continue
        blob = save({"x": np.ascontiguousarray(x[lo:hi]), "y": np.ascontiguousarray(y[lo:hi])})
        key = f"{split}-{i:05d}.safetensors"
        out(key, blob)
        infos.append(ShardInfo(key=key, rows=int(hi - lo), bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest()))
    return SplitInfo(rows=int(len(x)), shards=infos)


def _is_dataset_file(name: str) -> bool:
    return name == "manifest.json" or (name.startswith(("train-", "validation-")) and name.endswith(".safetensors"))


def _earlier_dataset(dest: str) -> list[str]:
    """The files of a dataset prepared earlier into `dest` (its manifest and shards), manifest first."""
    if dest.startswith("s3://"):
        found = [k for k in _store(dest).list("") if "/" not in k and _is_dataset_file(k)]
    else:
        folder = Path(dest)
        if folder.exists() and not folder.is_dir():
            raise InvalidDataset(f"--out {dest} is a file: name a folder (it is created if missing)")
        found = sorted(p.name for p in folder.iterdir() if _is_dataset_file(p.name)) if folder.is_dir() else []
    return sorted(found, key=lambda k: k != "manifest.json")


def _files(names: list[str]) -> str:
    shards = sum(n != "manifest.json" for n in names)
    return ("manifest.json and " if "manifest.json" in names else "") + f"{shards} shard{'s' * (shards != 1)}"


def _remove(dest: str, names: list[str]) -> None:
    """The earlier dataset's files, its manifest first: at no point does a manifest name a missing shard."""
    if dest.startswith("s3://"):
        store = _store(dest)
        for name in names:
            store.delete(name)
    else:
        for name in names:
            (Path(dest) / name).unlink(missing_ok=True)
    from smlt.runtime.progress import notice  # local-only (not in the Lambda layer), as preparing is

    notice.info(f"--replace: removed the earlier dataset in {dest} ({_files(names)})")


def _store(dest: str):  # noqa: ANN202 - S3Store, imported only for s3:// destinations
    from smlt.runtime.keys import parse_s3_uri
    from smlt.runtime.store import S3Store

    bucket, prefix = parse_s3_uri(dest)
    return S3Store(bucket, prefix.rstrip("/") + "/" if prefix else "")


def _writer(dest: str) -> Writer:
    if dest.startswith("s3://"):
        store = _store(dest)
        return lambda key, blob: store.put(key, blob)
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    return lambda key, blob: (folder / key).write_bytes(blob)


def read_local_manifest(folder: str | Path) -> Manifest:
    path = Path(folder) / "manifest.json"
    if not path.exists():
        raise InvalidDataset(f"no manifest.json in {folder}")
    return parse_manifest(path.read_bytes(), str(path))
