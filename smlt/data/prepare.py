"""`smlt data prepare`: CSV, NPZ, scikit-learn bundled datasets or a synthetic set → shards.

Output: `manifest.json` plus safetensors shards (`x` float32, `y` int64 or float32), to a local
folder or an `s3://bucket/prefix/`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from smlt.data.manifest import ArraySpec, Manifest, Normalization, ShardInfo, SplitInfo, parse_manifest
from smlt.errors import InvalidDataset

SKLEARN_BUNDLED = {
    "digits": ("load_digits", "classification"),
    "iris": ("load_iris", "classification"),
    "wine": ("load_wine", "classification"),
    "breast_cancer": ("load_breast_cancer", "classification"),
    "diabetes": ("load_diabetes", "regression"),
}


def load_source(source: str, label: str | None = None, task: str | None = None):
    """Return (x, y, task, name) for a source spec.

    - `sklearn:NAME` — a dataset scikit-learn ships (no download)
    - `synthetic:classification?rows=200000&features=64&classes=10&seed=0`
    - a `.npz` file with arrays `x` and `y`; a `.csv` file with a header (label = last column
      unless `label` names one)
    """
    if source.startswith("sklearn:"):
        name = source.split(":", 1)[1]
        if name not in SKLEARN_BUNDLED:
            raise InvalidDataset(f"unknown scikit-learn dataset {name!r}; bundled: {', '.join(SKLEARN_BUNDLED)}")
        import sklearn.datasets

        loader, kind = SKLEARN_BUNDLED[name]
        ds = getattr(sklearn.datasets, loader)()
        return ds.data.astype(np.float32), ds.target, kind, name
    if source.startswith("synthetic:"):
        return _synthetic(source)
    path = Path(source)
    if not path.exists():
        raise InvalidDataset(f"dataset source not found: {source}")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            if "x" not in z or "y" not in z:
                raise InvalidDataset(f"{source}: an .npz dataset needs arrays 'x' and 'y', found {list(z.keys())}")
            x, y = z["x"], z["y"]
        kind = task or ("classification" if np.issubdtype(y.dtype, np.integer) else "regression")
        return x.astype(np.float32).reshape(len(x), -1), y, kind, path.stem
    if path.suffix == ".csv":
        return _read_csv(path, label, task)
    raise InvalidDataset(f"unsupported dataset source {source!r}: use sklearn:NAME, synthetic:..., .csv or .npz")


# More distinct labels than this and a CSV's task must be named: integer-valued prices or counts
# would otherwise become hundreds of one-row classes. Labels written as decimals ("151.0") look
# like a quantity sooner, but "0.0"/"1.0" flags are still classes.
MAX_INFERRED_CLASSES = 100
MAX_INFERRED_DECIMAL_CLASSES = 10


def _read_csv(path: Path, label: str | None, task: str | None):
    import csv

    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as e:
        raise InvalidDataset(f"{path}: not UTF-8 text (byte {e.start}); save the CSV as UTF-8") from None
    if len(rows) < 2:
        raise InvalidDataset(f"{path}: a CSV dataset needs a header and at least one row")
    header, body = rows[0], rows[1:]
    if label is not None and label not in header:
        raise InvalidDataset(f"{path}: no label column {label!r}; the columns are {', '.join(header)}")
    col = header.index(label) if label else len(header) - 1
    for line, r in enumerate(body, start=2):
        if len(r) != len(header):
            raise InvalidDataset(f"{path}: line {line} has {len(r)} values, the header {len(header)}")
    try:
        data = np.array([[float(v) for v in r] for r in body], dtype=np.float64)
    except ValueError as e:
        raise InvalidDataset(f"{path}: non-numeric value ({e})") from None
    y = data[:, col]
    x = np.delete(data, col, axis=1).astype(np.float32)
    return x, y, task or _infer_task(path, header[col], [r[col] for r in body], y), path.stem


def _infer_task(path: Path, column: str, texts: list[str], y: np.ndarray) -> str:
    """Regression for fractional labels, classification for whole numbers with few distinct values
    (fewer still when written as decimals); anything in between is refused rather than guessed."""
    if not np.all(y == np.round(y)):
        return "regression"
    n = len(np.unique(y))
    written_as_floats = any(not t.strip().lstrip("+-").isdigit() for t in texts)
    if n > (MAX_INFERRED_DECIMAL_CLASSES if written_as_floats else MAX_INFERRED_CLASSES):
        raise InvalidDataset(
            f"{path}: label column {column!r} has {n} distinct whole-number values"
            + (" written as decimals" if written_as_floats else "")
            + ": pass --task regression for a quantity, or --task classification if each value is a class"
        )
    return "classification"


def _synthetic(source: str):
    spec = dict(re.findall(r"(\w+)=([\w.]+)", source))
    kind = source.split(":", 1)[1].split("?", 1)[0] or "classification"
    rows, feats = int(spec.get("rows", 10000)), int(spec.get("features", 32))
    classes, seed = int(spec.get("classes", 10)), int(spec.get("seed", 0))
    from sklearn.datasets import make_classification

    if kind != "classification":
        raise InvalidDataset(f"synthetic dataset kind {kind!r} not supported (use classification)")
    x, y = make_classification(
        n_samples=rows,
        n_features=feats,
        n_informative=max(2, feats // 2),
        n_redundant=feats // 8,
        n_classes=classes,
        n_clusters_per_class=2,
        class_sep=1.5,
        flip_y=0.01,
        random_state=seed,
    )
    return x.astype(np.float32), y, "classification", f"synthetic-{rows}x{feats}"


def _write_split(out, split: str, x: np.ndarray, y: np.ndarray, shards: int) -> SplitInfo:
    infos = []
    for i, (xs, ys) in enumerate(zip(np.array_split(x, shards), np.array_split(y, shards))):
        if len(xs) == 0:
            continue
        blob = save({"x": np.ascontiguousarray(xs), "y": np.ascontiguousarray(ys)})
        key = f"{split}-{i:05d}.safetensors"
        out(key, blob)
        infos.append(ShardInfo(key=key, rows=len(xs), bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest()))
    return SplitInfo(rows=int(len(x)), shards=infos)


def prepare_dataset(
    source: str,
    dest: str,
    *,
    shards: int = 16,
    validation_fraction: float = 0.2,
    seed: int = 0,
    label: str | None = None,
    task: str | None = None,
    name: str | None = None,
) -> Manifest:
    """Shard a dataset into `dest` (a folder or s3:// prefix) and write its manifest."""
    if shards < 1:
        raise InvalidDataset(f"shards: need at least 1 shard, got {shards}")
    if not 0 < validation_fraction < 1:
        raise InvalidDataset(f"validation_fraction must be between 0 and 1, got {validation_fraction}")
    x, y, kind, default_name = load_source(source, label=label, task=task)
    if x.ndim != 2 or len(x) != len(y):
        raise InvalidDataset(
            f"{source}: expected x of shape (rows, features) and y of the same length, "
            f"got x {x.shape} and y {np.shape(y)}"
        )
    if not np.isfinite(x).all():
        raise InvalidDataset(f"{source}: features contain NaN or Inf")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    x, y = x[order], np.asarray(y)[order]
    if kind == "classification":
        classes, y = np.unique(y, return_inverse=True)
        y, outputs = y.astype(np.int64), len(classes)
        if outputs < 2:
            raise InvalidDataset(
                f"{source}: every label is {classes[0].item()!r}: a classifier needs at least 2 classes "
                "(or pass --task regression)"
            )
    else:
        y = y.astype(np.float32).reshape(len(y), -1)
        outputs = y.shape[1]
    n_val = max(1, int(round(len(x) * validation_fraction)))
    xt, yt, xv, yv = x[n_val:], y[n_val:], x[:n_val], y[:n_val]
    mean, std = xt.mean(axis=0), xt.std(axis=0)
    std = np.where(std < 1e-8, 1.0, std)
    xt, xv = ((xt - mean) / std).astype(np.float32), ((xv - mean) / std).astype(np.float32)

    out = _writer(dest)
    manifest = Manifest(
        name=name or default_name,
        source=source,
        task=kind,
        x=ArraySpec(shape=[int(x.shape[1])], dtype="float32"),
        y=ArraySpec(
            shape=[] if kind == "classification" else [int(outputs)],
            dtype="int64" if kind == "classification" else "float32",
        ),
        outputs=int(outputs),
        train=_write_split(out, "train", xt, yt, min(shards, len(xt))),
        validation=_write_split(out, "validation", xv, yv, min(max(1, shards // 2), len(xv))),
        normalization=Normalization(applied="stored", mean=mean.astype(float).tolist(), std=std.astype(float).tolist()),
    )
    out("manifest.json", manifest.model_dump_json(indent=1).encode())
    return manifest


def _writer(dest: str):
    if dest.startswith("s3://"):
        from smlt.keys import parse_s3_uri
        from smlt.store import S3Store

        bucket, prefix = parse_s3_uri(dest)
        store = S3Store(bucket, prefix.rstrip("/") + "/" if prefix else "")
        return lambda key, blob: store.put(key, blob)
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    return lambda key, blob: (folder / key).write_bytes(blob)


def read_local_manifest(folder: str | Path) -> Manifest:
    path = Path(folder) / "manifest.json"
    if not path.exists():
        raise InvalidDataset(f"no manifest.json in {folder}")
    return parse_manifest(path.read_bytes(), str(path))
