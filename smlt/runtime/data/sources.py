"""Where a dataset comes from: a source spec read into samples and labels, before any split, or
for a table file its header, the rows left on disk to be streamed (smlt.runtime.data.prepare).

- `sklearn:NAME[?shape=CxHxW]`: a dataset scikit-learn ships (no download), its features optionally
  as images (`sklearn:digits?shape=1x8x8`)
- `synthetic:KIND?...` (smlt.runtime.data.synthetic)
- a `.npz` file with arrays `x` (any sample shape) and `y`
- a `.csv` (`.tsv`, `.txt`: delimited text), `.parquet` or `.jsonl`/`.ndjson` file with named columns
  (smlt.runtime.data.tabular),
  or an Excel workbook (`.xlsx`, `.xlsm`: its first sheet, read as its CSV)
- a folder of class subfolders holding images (smlt.runtime.data.images)
- a folder of the parts of one table (`part-00000.csv`, `part-00001.csv`, ... as Spark, Dask and
  `aws s3 sync` write one; `folder_parts`), prepared part by part as the pipeline prepares an
  upload in parts (smlt.runtime.data.parts)
- an archive (`.zip`, `.tar`, `.tar.gz`/`.tgz`, `.tar.bz2`, `.tar.xz`) of one of those: its
  contents read as the folder they hold (smlt.runtime.data.archives), by prepare_dataset
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from smlt.runtime.data import archives, images, synthetic, tabular
from smlt.runtime.data.arrays import sample_layout
from smlt.runtime.data.options import SourceOptions, Task
from smlt.runtime.data.table_reader import TableFile, is_compressed, table_suffix, unnamed
from smlt.runtime.data.tables import TABLE_SUFFIXES, open_table
from smlt.runtime.errors import InvalidDataset

SKLEARN_BUNDLED = {
    "digits": ("load_digits", "classification"),
    "iris": ("load_iris", "classification"),
    "wine": ("load_wine", "classification"),
    "breast_cancer": ("load_breast_cancer", "classification"),
    "diabetes": ("load_diabetes", "regression"),
}


@dataclass
class Source:
    """A source's rows in memory: `x` as sample arrays and their labels."""

    name: str
    y: np.ndarray
    task: Task
    x: np.ndarray
    vocab_size: int | None = None
    validation: np.ndarray | None = None  # the source's own split: True for its validation rows
    class_names: list[str] | None = None  # classification with labels 0..k-1: each one's name

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class TableSource:
    """A CSV, Parquet or JSON Lines file with named columns: its label column and feature columns (in the
    file's order). Its rows stay in the file, read in blocks."""

    name: str
    file: TableFile
    label: str
    features: list[str] = field(default_factory=list)


def is_source_path(path: Path) -> bool:
    """A file or folder `load_source` reads (a prepared dataset folder is not one)."""
    kind = table_suffix(path) if path.is_file() else ""
    if archives.is_archive_file(path):
        return True
    return kind in (".npz", *TABLE_SUFFIXES) or folder_parts(path) is not None or images.is_image_folder(path)


def folder_parts(path: Path) -> list[Path] | None:
    """A local folder holding the parts of one table, in name order (part i is the i-th): the
    pipeline's rule (smlt.runtime.steps.upload_parts.same_table: two or more table files of one
    format at its top, beside only names a source never includes: `_SUCCESS`, `.crc` checksums,
    dot-files, `_temporary/`), without the limits of what one function prepares. None for any
    other folder (one with a class subfolder is an image folder's)."""
    from smlt.runtime.steps.prepare_limits import ignored
    from smlt.runtime.steps.upload_parts import same_table

    if not path.is_dir() or (path / "manifest.json").exists():
        return None
    objects: dict[str, int] = {}
    for entry in path.iterdir():
        if entry.is_dir():
            if not ignored(entry.name):
                return None
        else:
            objects[entry.name] = entry.stat().st_size
    parts = same_table(objects)
    return None if parts is None else [path / name for name in parts.names]


def part_header(parts: Sequence[Path], folder: Path, encoding: str | None = None) -> list[str]:
    """The parts' one header, read from each part (its header only, in `encoding` as its rows
    are): a part whose columns are not the first part's (names, order) is refused by name, as the
    pipeline refuses it (upload_parts.check_headers)."""
    from smlt.runtime.steps.upload_parts import check_headers

    headers = {p.name: list(open_table(p, encoding).columns) for p in parts}
    check_headers(headers, f"{folder}/", advice="prepare a table with other columns on its own")
    return headers[parts[0].name]


def load_source(source: str, opts: SourceOptions) -> Source:
    """A source held in memory (not a table file: `open_source`)."""
    src = open_source(source, opts)
    if isinstance(src, TableSource):
        raise InvalidDataset(f"{source}: a table file is read in blocks as it is prepared (open_source)")
    return src


def open_source(source: str, opts: SourceOptions) -> Source | TableSource:
    """The source's rows in memory, or for a table file (CSV, Parquet, JSON Lines) its header (rows read later)."""
    if source.startswith("sklearn:"):
        return _sklearn(source, opts)
    if source.startswith("synthetic:"):
        g = synthetic.generate(source)
        return Source(g.name, g.y, "classification", x=sample_layout(g.x, source), vocab_size=g.vocab_size)
    path = Path(source)
    if not path.exists():
        raise InvalidDataset(f"dataset source not found: {source}")
    if path.is_dir():
        if folder_parts(path) is not None:
            raise InvalidDataset(f"{source}: a table in parts is prepared part by part (prepare_dataset)")
        return _image_folder(path, opts)
    if archives.is_archive(path):
        raise InvalidDataset(f"{source}: an archive is unpacked as it is prepared (prepare_dataset)")
    if path.suffix.lower() == ".npz":
        return _npz(path, opts)
    if table_suffix(path) in TABLE_SUFFIXES:
        return _table(path, opts)
    hint = other_format(path)
    if hint:
        raise InvalidDataset(f"{source}: {hint}")
    raise InvalidDataset(
        f"unsupported dataset source {source!r}: use sklearn:NAME, synthetic:..., .csv, .tsv, .txt, .parquet, .jsonl, "
        ".xlsx "
        "(a CSV, TSV or JSON Lines file also gzip-, bzip2- or xz-compressed: .csv.gz), .npz "
        f"or a folder of class subfolders of images, or an archive of one of those ({archives.ARCHIVE_KINDS})"
    )


# Formats people save tables in that smlt does not read, and what to save them as.
_OTHER_FORMATS = {
    ".xls": "an Excel 97-2003 workbook, which smlt does not read: save it as .xlsx (Excel Workbook) or CSV UTF-8",
    ".ods": "an OpenDocument spreadsheet, which smlt does not read: save it as .xlsx or CSV UTF-8",
    ".numbers": "a Numbers spreadsheet, which smlt does not read: export it as .xlsx or CSV",
    ".feather": "an Arrow (Feather) file, which smlt does not read: write it as Parquet (pandas' to_parquet)",
    ".arrow": "an Arrow file, which smlt does not read: write it as Parquet (pandas' to_parquet)",
    ".pkl": "a pickle, which smlt never loads (it runs code): write the frame as Parquet (pandas' to_parquet)",
    ".pickle": "a pickle, which smlt never loads (it runs code): write the frame as Parquet (pandas' to_parquet)",
}


def other_format(path: Path) -> str | None:
    """What a file of a format smlt does not prepare is, and what to save it as; None when its name
    says nothing known. A `.json` file is looked into: one JSON array of records, or JSON Lines
    under another name."""
    suffix = path.suffix.lower()
    if suffix in _OTHER_FORMATS:
        return _OTHER_FORMATS[suffix]
    if suffix != ".json" or not path.is_file():
        return None
    with path.open("rb") as f:
        head = f.read(1 << 16).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"["):
        return (
            "one JSON array, which smlt does not read: write one JSON object per line as JSON Lines (.jsonl: "
            "pandas' to_json(orient='records', lines=True), or jq -c '.[]')"
        )
    if head.startswith(b"{") and b"}\n{" in head.replace(b"\r\n", b"\n"):
        return "JSON Lines (one JSON object per line) under a .json name: name it .jsonl"
    return "a JSON document, which smlt does not read: write its records as JSON Lines (.jsonl, one object per line)"


def _sklearn(source: str, opts: SourceOptions) -> Source:
    name, _, query = source.split(":", 1)[1].partition("?")
    if name not in SKLEARN_BUNDLED:
        raise InvalidDataset(f"unknown scikit-learn dataset {name!r}; bundled: {', '.join(SKLEARN_BUNDLED)}")
    import sklearn.datasets

    loader, kind = SKLEARN_BUNDLED[name]
    task: Task = "regression" if kind == "regression" else "classification"
    ds = getattr(sklearn.datasets, loader)()
    x = ds.data.astype(np.float32)
    if query:
        x = x.reshape(len(x), *_shape(source, query, x.shape[1]))
    names = [str(n) for n in ds.target_names] if task == "classification" else None  # iris: setosa, ...
    return Source(name, ds.target, opts.task or task, x=sample_layout(x, source), class_names=names)


def _shape(source: str, query: str, features: int) -> list[int]:
    key, _, value = query.partition("=")
    try:
        if key != "shape":
            raise ValueError
        dims = [int(d) for d in value.split("x")]
    except ValueError:
        raise InvalidDataset(f"{source}: the only parameter is shape=CxHxW (e.g. shape=1x8x8)") from None
    if math.prod(dims) != features or len(dims) not in (1, 3):
        raise InvalidDataset(f"{source}: shape {value} does not hold its {features} features as F or CxHxW")
    return dims


def _npz(path: Path, opts: SourceOptions) -> Source:
    with np.load(path, allow_pickle=False) as z:
        if "x" not in z or "y" not in z:
            raise InvalidDataset(f"{path}: an .npz dataset needs arrays 'x' and 'y', found {list(z.keys())}")
        x, y = z["x"], z["y"]
        vocab = int(z["vocab_size"]) if "vocab_size" in z else opts.vocab_size
    if len(x) != len(y):
        raise InvalidDataset(f"{path}: x has {len(x)} rows and y {len(y)}: they must match")
    if opts.task != "regression" and _one_hot(y):
        from smlt.runtime.progress import notice

        notice.info(f"{path}: y of shape {y.shape} is one-hot: read as {y.shape[1]} classes (its argmax per row)")
        y = y.argmax(axis=1)
        kind: Task = "classification"
    else:
        kind = opts.task or ("regression" if np.issubdtype(y.dtype, np.floating) else "classification")
    return Source(path.stem, y, kind, x=sample_layout(x, str(path)), vocab_size=vocab)


def _one_hot(y: np.ndarray) -> bool:
    """Labels as one-hot rows (Keras' to_categorical): 0s and one 1 in each row, 2 columns or more."""
    if y.ndim != 2 or y.shape[1] < 2 or not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):
        return False
    ones = y == 1
    return bool(((y == 0) | ones).all() and (ones.sum(axis=1) == 1).all())


def _table(path: Path, opts: SourceOptions) -> TableSource:
    file = open_table(path, opts.encoding)
    label = tabular.pick_label(file.path, file.columns, opts.label)
    unknown = [c for c in opts.drop if c not in file.columns]
    if unknown:
        raise tabular.no_column(f"{path}: drop", unknown, file.columns)
    if label in opts.drop:
        raise InvalidDataset(
            f"{path}: drop: {label!r} is the label column, which cannot be left out; name the label with --label "
            "(the job's dataset.label), or drop another column"
        )
    features = [c for c in file.columns if c != label and c not in opts.drop]
    index = file.columns[0]
    if index in tabular.INDEX_NAMES and index in features:
        from smlt.runtime.progress import notice

        features.remove(index)
        notice.info(
            f"{path}: the first column {'has no name' if not index else f'is named {index!r}'}: an index or row "
            "names, as pandas' to_csv and R's "
            "write.csv write them, which a model can only memorise: left out (name it in the header to use it)"
        )
    blank = [c for c in features if unnamed(c)]
    if blank:
        from smlt.runtime.progress import notice

        features = [c for c in features if c not in blank]
        at = [file.columns.index(c) for c in blank]
        trailing = at == list(range(len(file.columns) - len(at), len(file.columns)))
        many = len(blank) > 1
        notice.info(
            f"{path}: column{'s' * many} {', '.join(str(i + 1) for i in at)} (counting from 1) "
            f"{'have' if many else 'has'} no name in the header"
            + (" (a delimiter at the end of each line, as spreadsheets write one)" if trailing else "")
            + f": left out (name {'them' if many else 'it'} in the header to use {'them' if many else 'it'})"
        )
    if not features:
        raise InvalidDataset(f"{path}: no feature columns besides the label {label!r}")
    name = Path(path.stem).stem if is_compressed(path) else path.stem  # houses.csv.gz: houses
    return TableSource(name, file, label, features)


def _image_folder(path: Path, opts: SourceOptions) -> Source:
    if (path / "manifest.json").exists():
        raise InvalidDataset(f"{path} is a prepared dataset (it has manifest.json): use it as the dataset directly")
    if not images.is_image_folder(path):
        raise InvalidDataset(f"{path}: {folder_found(path)}")
    x, y, classes, validation = images.read_image_folder(path, opts.image_size, opts.channels)
    return Source(path.name, np.asarray(classes)[y], "classification", x=x, validation=validation)


# Names of a folder's entries a message shows at most.
FOUND_NAMED = 5


def folder_found(path: Path) -> str:
    """Why a folder is no source: what a folder may be (class subfolders of images, or the parts
    of one table), then what this one holds (its top, names a source never includes left out)."""
    from smlt.runtime.steps.prepare_limits import ignored
    from smlt.runtime.steps.upload_parts import part_format

    may = (
        f"a folder is a source when it holds one subfolder of {images.IMAGE_KINDS} images per class, or the "
        "parts of one table (two or more table files of one format: .csv, .csv.gz, .tsv, .parquet, .jsonl, .xlsx, "
        "... such as part-00000.csv, part-00001.csv, ..., beside nothing but _SUCCESS, .crc and dot-files)"
    )
    entries = sorted(e for e in path.iterdir() if not ignored(e.name))
    if not entries:
        return f"{may}; it holds nothing (or only those)"
    names = [e.name + "/" * e.is_dir() for e in entries]
    more = len(names) - FOUND_NAMED
    shown = ", ".join(names[:FOUND_NAMED]) + (f" and {more} more" if more > 0 else "")
    tables = [e for e in entries if e.is_file() and part_format(e.name) is not None]
    kinds = sorted({str(part_format(t.name)) for t in tables})
    why = ""
    if len(tables) == 1 and len(entries) == 1:
        why = f": one table file, a source on its own (give {tables[0]})"
    elif len(kinds) > 1:
        why = f": table files of {len(kinds)} formats ({', '.join(kinds)}); the parts of one table share one"
    elif tables and len(tables) < len(entries):
        others = [n for n, e in zip(names, entries) if e not in tables]
        why = (
            f": beside its table file{'s' * (len(tables) > 1)}, {', '.join(others[:FOUND_NAMED])}, which a folder of "
            "parts does not hold (move it out)"
        )
    return f"{may}; it holds {shown}{why}"
