"""`smlt data prepare`: a source (smlt.runtime.data.sources) split, transformed with statistics from its
train split, and written as safetensors shards plus `manifest.json`, to a local folder or an
`s3://bucket/prefix/`. The shards come first and the manifest last, so a manifest always
describes shards that exist.

A CSV or Parquet file streams, in the same two passes whatever its size, so memory stays
bounded (about a block of the file and a shard, bench/README.md "Preparation memory"):

Rows without a label are left out as they are read, before the split, in both passes
(`LabelFit.labelled`): the rows left are split and prepared as a file without the others would be.

1. statistics: every block read once, split (smlt.runtime.data.split), its cells counted
   (smlt.runtime.data.table_fit) and refused by name; nothing is written.
2. shards: every block read again, encoded with the fitted transforms, its rows dealt to the
   shards and spooled to disk (smlt.runtime.data.spool) while the standardisation's moments and
   the imputed medians are settled. Values that would overflow float32 once standardised are
   refused here, before any shard is written; then each shard is shuffled, standardised and
   written, the manifest last.

Sources held in memory (NPZ arrays, which numpy loads whole; image folders; sklearn and
synthetic sets) are split and written by the same split, spool and shards.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smlt.runtime.data import archives, arrays, tabular
from smlt.runtime.data.manifest import (
    ArraySpec,
    ColumnTransform,
    FeatureSpec,
    Manifest,
    Normalization,
    SplitInfo,
    TargetScaling,
    dataset_warnings,
    parse_manifest,
)
from smlt.runtime.data.options import SourceOptions, Task
from smlt.runtime.data.parts import PartRows, described, merge_fits, merge_moments, part_manifest, settle
from smlt.runtime.data.sources import Source, TableSource, folder_parts, open_source, part_header
from smlt.runtime.data.split import Split, aligned
from smlt.runtime.data.spool import (
    MAX_SHARD_BYTES,
    SHARDS,
    ShardSpool,
    Transform,
    Writer,
    part_share,
    requested,
    shard_count,
)
from smlt.runtime.data.stats import Moments
from smlt.runtime.data.table_fit import ColumnFit, LabelFit, Labels, TableFit
from smlt.runtime.data.table_reader import Block
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.progress import progress

# A progress line at most this often while a file is read.
PROGRESS_S = 10.0


def prepare_dataset(
    source: str,
    dest: str,
    *,
    shards: int = SHARDS,
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
    statistics, shape, vocabulary and classes. `shards` is the fewest shards of the train split
    (half as many for validation): more when one would hold more than 64 MB; a folder of parts
    has them shared out among its parts (`spool.part_share`)."""
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
    with _readable(source) as (read, default_name):
        parts = folder_parts(Path(read))
        if parts is not None:
            return _prepare_folder(
                source,
                parts,
                dest,
                earlier,
                opts,
                features,
                shards,
                validation_fraction,
                seed,
                name or default_name,
                generation,
                read,
            )
        manifest = _prepare_read(
            source, read, dest, earlier, opts, features, shards, validation_fraction, seed, generation
        )
        manifest = manifest.model_copy(update={"name": name or default_name or manifest.name})
    for said in dataset_warnings(manifest):
        from smlt.runtime.progress import notice

        notice.warning(said)
    _writer(dest)("manifest.json", manifest.model_dump_json(indent=1).encode())
    return manifest


@contextlib.contextmanager
def _readable(source: str) -> Iterator[tuple[str, str | None]]:
    """(the path to read, a default name): the source itself, or for an archive the source it
    holds, extracted into a temporary folder for the block (smlt.runtime.data.archives), named
    by the archive's stem (`images.zip`: images)."""
    path = Path(source)
    if archives.is_archive_file(path):
        with archives.unpacked(path) as inner:
            yield str(inner), archives.stem(source)
        return
    yield source, None


def _prepare_read(
    source: str,
    read: str,
    dest: str,
    earlier: list[str],
    opts: SourceOptions,
    features: FeatureSpec | None,
    shards: int,
    validation_fraction: float,
    seed: int,
    generation: int | None = None,
) -> Manifest:
    """`source` (read from `read`: itself, or what its archive holds) split, spooled and written
    to `dest` as shards, the manifest returned (written by the caller, last)."""
    if features is not None:
        opts = _options_of(features, read, opts)
    src = open_source(read, opts)
    plan = _Plan(source, shards, validation_fraction, seed, features)
    with _spool_folder(dest) as folder:
        if isinstance(src, TableSource):
            prepared = _stream_table(src, opts, plan, folder)
        else:
            prepared = _in_memory(src, plan, folder)
        manifest = Manifest(
            name=src.name,
            source=source,
            task=prepared.task,
            x=prepared.x,
            y=prepared.y,
            outputs=prepared.outputs,
            classes=prepared.classes,
            train=SplitInfo(rows=prepared.train.rows, shards=[]),
            validation=SplitInfo(rows=prepared.validation.rows, shards=[]),
            normalization=prepared.normalization,
            target=prepared.target,
            columns=prepared.columns,
            label=src.label if isinstance(src, TableSource) else None,
            vocab_size=prepared.vocab_size,
            generation=features.generation if features else generation,
        )
        out = _writer(dest)
        if earlier:
            _remove(dest, earlier)
        manifest = manifest.model_copy(
            update={
                "train": prepared.train.finish(out, prepared.transform, seed),
                "validation": prepared.validation.finish(out, prepared.transform, seed),
            }
        )
    return manifest


def _prepare_folder(
    source: str,
    parts: list[Path],
    dest: str,
    earlier: list[str],
    opts: SourceOptions,
    features: FeatureSpec | None,
    shards: int,
    validation_fraction: float,
    seed: int,
    name: str | None,
    generation: int | None,
    read: str | None = None,
) -> Manifest:
    """A folder of a table's parts (sources.folder_parts) prepared as the pipeline prepares an
    upload in parts: its headers checked first (a part with other columns refused by name), then
    `prepare_parts` itself, its three passes one part at a time, each
    part's split seeded by (seed, part), its shards named by the part (its share of `shards`,
    `spool.part_share`). An earlier dataset in `dest` is removed as one file's is: after the
    passes over every part that refuse a table (statistics, moments), before the first shard is
    written. `read`: the folder read, when it is not `source` (an archive's contents)."""
    from smlt.runtime.progress import notice

    part_header(parts, Path(read or source), opts.encoding)
    notice.info(
        f"{source}: {len(parts)} parts of one table ({parts[0].name} ... {parts[-1].name}): prepared part by part"
    )
    return prepare_parts(
        [str(p) for p in parts],
        dest,
        options=opts,
        features=features,
        shards=shards,
        before_shards=(lambda: _remove(dest, earlier)) if earlier else None,
        validation_fraction=validation_fraction,
        seed=seed,
        name=name or Path(source).name,
        generation=generation,
        source=source,
    )


@dataclass
class _Plan:
    source: str
    shards: int
    fraction: float
    seed: int
    features: FeatureSpec | None
    part: int | None = None  # one part of a table in many files: its split seeded by (seed, part)
    table: tuple[int, int] | None = None  # a part's: the whole table's (train, validation) rows

    def spools(self, folder: Path, train: int, validation: int, row_bytes: int) -> tuple[ShardSpool, ShardSpool]:
        """The splits' spools: `shards` train shards and half as many validation shards (at least
        one), more when a shard would pass MAX_SHARD_BYTES, never more than rows; a part of a
        table its share of them (`part_share`, by its rows in the split). Refused before a row is
        spooled when the disk cannot hold them (the spools, then a shard at a time)."""
        need = (train + validation) * row_bytes + 2 * MAX_SHARD_BYTES
        free = shutil.disk_usage(folder).free
        if need > free:
            raise InvalidDataset(
                f"{self.source}: its {train + validation:,} rows of {row_bytes:,} bytes each (every feature 4 bytes) "
                f"need about {need / 1e9:.1f} GB of disk to shard, and {folder} has {free / 1e9:.1f} GB free: free some "
                "space, leave wide columns out (--drop; a free-text column is 512 features), or on AWS upload the "
                "table in parts (docs/deploy.md), which are prepared one by one"
            )
        return (
            ShardSpool(folder, "train", shard_count(self.requested("train", train), train, row_bytes), self.part),
            ShardSpool(
                folder,
                "validation",
                shard_count(self.requested("validation", validation), validation, row_bytes),
                self.part,
            ),
        )

    def requested(self, split: str, rows: int) -> int:
        wanted = requested(self.shards, split)
        if self.table is None:
            return wanted
        return part_share(wanted, rows, self.table[split == "validation"])

    def too_few(self, rows: int, train: int) -> None:
        if not train:
            raise InvalidDataset(f"{self.source}: {rows} rows leave none for training after the validation split")


@dataclass
class _Prepared:
    """A source split, its rows spooled, with what the manifest says of them."""

    task: Task
    x: ArraySpec
    y: ArraySpec
    outputs: int
    classes: list[str] | None
    target: TargetScaling | None
    normalization: Normalization
    columns: list[ColumnTransform] | None
    vocab_size: int | None
    train: ShardSpool
    validation: ShardSpool
    transform: Transform  # spooled x -> stored x, shard by shard


@contextlib.contextmanager
def _spool_folder(dest: str) -> Iterator[Path]:
    """A temporary folder for the spool: inside a local `dest` (on its disk, which the shards need
    anyway; a dest folder made for it and left empty is removed), else the system's temp folder
    (a Lambda's /tmp)."""
    if dest.startswith("s3://"):
        with tempfile.TemporaryDirectory(prefix="smlt-prepare-") as tmp:
            yield Path(tmp)
        return
    folder = Path(dest)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix=".smlt-prepare-", dir=folder) as tmp:
            yield Path(tmp)
    except BaseException:
        if made and not any(folder.iterdir()):
            folder.rmdir()
        raise


def _same(x: np.ndarray) -> np.ndarray:
    return x


def _in_memory(src: Source, plan: _Plan, folder: Path) -> _Prepared:
    """A source held in memory (its arrays checked whole), split and spooled."""
    source, features = plan.source, plan.features
    arrays.refuse_non_finite(src.x, source, rows=np.arange(len(src.x)))
    if src.validation is None:
        val, train = Split(plan.fraction, plan.seed).take(len(src))
    else:  # the source's own split, each part shuffled as `Split` shuffles
        rng = np.random.default_rng(plan.seed)
        val, train = rng.permutation(np.flatnonzero(src.validation)), rng.permutation(np.flatnonzero(~src.validation))
    plan.too_few(len(src), len(train))
    y, y_spec, outputs, target, classes = _labels(src, source, train, val, features)
    if features is None:
        stored = arrays.store(src.x[train], src.x[val], source, src.vocab_size)
    else:
        stored = _apply_x(src, source, train, val, features)
    # What the shards will hold, after standardisation (a pipeline's statistics too): never NaN or
    # Inf, which a worker could only turn into a diverged round.
    for split, x, index in (("train", stored.train, train), ("validation", stored.validation, val)):
        arrays.refuse_non_finite(x, f"{source} ({split} split, standardised)", None, index, "row")
    row_bytes = stored.train[:1].nbytes + y[:1].nbytes
    spools = plan.spools(folder, len(train), len(val), row_bytes)
    for spool, x, index in zip(spools, (stored.train, stored.validation), (train, val)):
        spool.add(x, y[index], index)
    return _Prepared(
        src.task,
        stored.spec,
        y_spec,
        outputs,
        classes,
        target,
        stored.normalization,
        None,
        stored.vocab_size,
        *spools,
        _same,
    )


class _Reading:
    """Progress lines while a file is read: how far, how fast."""

    def __init__(self, source: str, what: str, size: int, unit: str):
        self.line = f"{source}: {what}"
        self.size, self.unit = size, unit
        self.start = self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_S:
            return
        self.last = now
        progress.info(f"{self.line}: {self._amount(done)} of {self._amount(self.size)} ({self._rate(done)})")

    def done(self) -> None:
        """The pass's last line, when it took long enough to have said anything."""
        took = time.monotonic() - self.start
        if took >= PROGRESS_S:
            progress.info(f"{self.line}: done, {self._amount(self.size)} in {took:,.0f} s ({self._rate(self.size)})")

    def _amount(self, n: int) -> str:
        return f"{n / 1e6:,.0f} MB" if self.unit == "line" else f"{n:,} rows"  # a CSV's bytes, a Parquet's rows

    def _rate(self, n: int) -> str:
        per_s = n / max(time.monotonic() - self.start, 1e-9)
        return f"{per_s / 1e6:.1f} MB/s" if self.unit == "line" else f"{per_s:,.0f} rows/s"


def _split_blocks(
    src: TableSource, plan: _Plan, what: str, labels: LabelFit, count: bool
) -> Iterator[tuple[Block, np.ndarray, np.ndarray]]:
    """The file's rows that have a label in blocks, each with its (validation, train) positions;
    the rows without one are left out before the split (counted by `labels` when `count`)."""
    split = Split(plan.fraction, plan.seed if plan.part is None else (plan.seed, plan.part))
    reading = _Reading(plan.source, what, src.file.size, src.file.unit)
    for block in aligned(_labelled(src.file.blocks(reading), labels, count)):
        yield (block, *split.take(len(block)))
    reading.done()


def _labelled(blocks: Iterator[Block], labels: LabelFit, count: bool) -> Iterator[Block]:
    for block in blocks:
        kept = labels.labelled(block, count)
        if len(kept):
            yield kept


def _stream_table(src: TableSource, opts: SourceOptions, plan: _Plan, folder: Path) -> _Prepared:
    """A CSV or Parquet file in two passes (the module's docstring)."""
    fit = _fit_table(src, opts, plan)
    t = TableTransforms.of(fit)
    spools = plan.spools(folder, fit.train_rows, fit.rows - fit.train_rows, t.row_bytes)
    moments = _spool_table(src, plan, fit, t.columns, t.medians, spools)
    _check_rows(spools, fit.train_rows, fit.rows - fit.train_rows, plan.source)
    norm, transform = t.settle(moments, (fit.train_rows, fit.rows - fit.train_rows), plan.features)
    for spool, m in zip(spools, moments):
        _refuse_overflow(spool, m, norm, transform, t.names, plan.source, src.file.unit)
    return t.prepared(norm, plan.features, spools, transform)


@dataclass
class TableTransforms:
    """What pass 1's statistics make of a table: its labels, its columns' transforms and the
    numeric and date columns whose imputed median pass 2 settles (`pending`: (first feature,
    column, fit))."""

    labels: Labels
    columns: list[ColumnTransform]
    names: list[str]
    pending: list[tuple[int, int, ColumnFit]]

    @classmethod
    def of(cls, fit: TableFit) -> TableTransforms:
        fit.refuse_totals()
        labels = fit.labels.finish()
        fit.labels.refuse_a_row_per_class(labels, fit.rows)
        kept = [(c, t) for c, t in zip(fit.columns, fit.transforms(labels.task)) if not fit.empty(c)]
        columns = [t for _, t in kept]
        if not columns:
            raise InvalidDataset(
                f"{fit.path}: every feature column is empty in the train split's rows: no features besides the "
                f"label {fit.labels.name!r}"
            )
        at = np.cumsum([0] + [tabular.width(t) for t in columns])
        pending = [
            (int(at[i]), i, c) for i, (c, t) in enumerate(kept) if isinstance(t.fill, float) and math.isnan(t.fill)
        ]
        for _, _, c in pending:
            if c.median.needs_second_pass:
                c.median.start_second_pass()
        return cls(labels, columns, tabular.feature_names(columns), pending)

    @property
    def medians(self) -> list[ColumnFit]:
        return [c for _, _, c in self.pending]

    @property
    def row_bytes(self) -> int:
        return 4 * len(self.names) + (8 if self.labels.task == "classification" else 4)

    def settle(
        self, moments: tuple[Moments, Moments], rows: tuple[int, int], features: FeatureSpec | None
    ) -> tuple[Normalization, Transform]:
        """After pass 2: the imputed medians in the columns, the (train, validation) moments with the
        imputed cells (`rows` in each split), the normalization and the spooled x -> stored x."""
        fills = []
        for j, i, c in self.pending:
            fill = c.median.value()
            self.columns[i] = t = self.columns[i].model_copy(update={"fill": fill})
            # a date's fill is its median date's features, every one imputed where the date is empty
            values = tabular.date_features(np.array([fill]), t.levels)[0] if t.kind == "date" else [fill]
            for k, value in enumerate(values):
                fills.append((j + k, np.float32(value)))
                for m, n in zip(moments, rows):  # the imputed cells, as the shards will hold them
                    m.add_constant(j + k, float(np.float32(value)), n - int(m.n[j + k]))
        self.pending = []
        norm = features.normalization if features is not None else arrays.normalization(moments[0].mean, moments[0].std)

        def transform(x: np.ndarray) -> np.ndarray:
            for j, fill in fills:
                x[np.isnan(x[:, j]), j] = fill
            return arrays.standardise(x, norm, out=x)

        return norm, transform

    def prepared(
        self,
        norm: Normalization,
        features: FeatureSpec | None,
        spools: tuple[ShardSpool, ShardSpool],
        transform: Transform,
    ) -> _Prepared:
        labels = self.labels
        x_spec = features.x if features is not None else ArraySpec(shape=[len(self.names)], dtype="float32")
        return _Prepared(
            labels.task,
            x_spec,
            labels.y,
            labels.outputs,
            labels.classes,
            labels.target,
            norm,
            self.columns,
            None,
            *spools,
            transform,
        )


def _check_rows(spools: tuple[ShardSpool, ShardSpool], train: int, validation: int, source: str) -> None:
    if spools[0].rows != train or spools[1].rows != validation:
        raise InvalidDataset(f"{source} changed while it was being prepared: prepare it again")


def _fit_table(src: TableSource, opts: SourceOptions, plan: _Plan) -> TableFit:
    """Pass 1: the file's statistics and refusals."""
    if plan.features is not None:
        _check_columns(src, plan.features)
    text: set[str] = set()
    while True:  # a column read as numbers until a later block held text: its levels are read again
        fit = _fit_blocks(src, opts, plan, text)
        if not fit.flipped:
            break
        text |= fit.flipped
    fit.refuse_unlabelled()
    fit.refuse_non_finite()
    plan.too_few(fit.rows, fit.train_rows)
    return fit


def _fit_blocks(src: TableSource, opts: SourceOptions, plan: _Plan, text: set[str]) -> TableFit:
    """Pass 1's blocks, until a column read as numbers holds text (`fit.flipped`)."""
    fit = TableFit(src.file.path, src.label, src.features, opts, plan.features, text)
    for block, val, train in _split_blocks(src, plan, "statistics (pass 1 of 2)", fit.labels, True):
        fit.add(block, val, train)
        if fit.flipped:
            break
    return fit


def fit_part(
    path: str,
    part: int,
    *,
    options: SourceOptions | None = None,
    features: FeatureSpec | None = None,
    text: set[str] | frozenset[str] = frozenset(),
    validation_fraction: float = 0.2,
    seed: int = 0,
) -> TableFit:
    """Pass 1 over one part of a table in many files (the `part`-th, its split seeded by (seed,
    part)), `text` the columns read as text: its statistics, to be merged with the other parts'
    (`TableFit.merge`, smlt.runtime.data.parts). Named refusals of its cells come from here; the
    ones about the whole table (too few rows, a bad number's count) come after the merge."""
    src, opts = _part(path, options, features)
    plan = _Plan(path, 1, validation_fraction, seed, features, part)
    if features is not None:
        _check_columns(src, features)
    return _fit_blocks(src, opts, plan, set(text))


def _spool_table(
    src: TableSource,
    plan: _Plan,
    fit: TableFit,
    columns: list[ColumnTransform],
    medians: list[ColumnFit],
    spools: tuple[ShardSpool, ShardSpool] | None,
) -> tuple[Moments, Moments]:
    """Pass 2: every row encoded (a numeric column's empty cells NaN until its median is known)
    and spooled (unless `spools` is None); returns the (train, validation) features' moments, the
    medians settled."""
    numeric = {t.name for t in columns if t.kind == "numeric"}
    width = sum(tabular.width(t) for t in columns)
    moments = (Moments(width), Moments(width))
    for block, val, train in _split_blocks(src, plan, "shards (pass 2 of 2)", fit.labels, False):
        table = tabular.Table(block.path, {t.name: _cells(block, t, numeric) for t in columns}, block.rows, block.unit)
        x = tabular.encode_columns(columns, table)
        y = fit.labels.encode(block)
        in_train = np.zeros(len(block), bool)
        in_train[train] = True
        for c in medians:
            if c.median.needs_second_pass:
                parsed = c.values(block)
                assert parsed is not None
                c.median.again(parsed[0][in_train & ~parsed[1]])
        for m, index in zip(moments, (train, val)):
            m.add(x[index])
        for spool, index in zip(spools or (), (train, val)):
            spool.add(x[index], y[index], block.rows[index])
    return moments


def _cells(block: Block, t: ColumnTransform, numeric: set[str]) -> np.ndarray:
    """A column's cells as `tabular.encode_columns` takes them; a date column's as days (parsed in pass 1)."""
    if t.kind == "date":
        parsed = block.dates(t.name, t.date_format)
        if parsed is None:  # every cell was a date in pass 1
            raise InvalidDataset(f"{block.path} changed while it was being prepared: prepare it again")
        return parsed[0]
    return block.column(t.name, t.name in numeric)


def _part(path: str, options: SourceOptions | None, features: FeatureSpec | None) -> tuple[TableSource, SourceOptions]:
    opts = options or SourceOptions()
    if features is not None:
        opts = _options_of(features, path, opts)
    src = open_source(path, opts)
    if not isinstance(src, TableSource):
        raise InvalidDataset(f"{path}: a part of a table is a .csv or .parquet file")
    return src, opts


def part_moments(
    path: str,
    part: int,
    fit: TableFit,
    t: TableTransforms,
    *,
    options: SourceOptions | None = None,
    features: FeatureSpec | None = None,
    validation_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[Moments, Moments]:
    """Pass 2's statistics of one part of a table in many files, without spooling: its (train,
    validation) features' moments; the second pass of `t`'s pending medians is added to them."""
    src, _ = _part(path, options, features)
    plan = _Plan(path, 1, validation_fraction, seed, features, part)
    return _spool_table(src, plan, fit, t.columns, t.medians, None)


def part_shards(
    path: str,
    part: int,
    fit: TableFit,
    t: TableTransforms,
    norm: Normalization,
    dest: str,
    rows: tuple[int, int],
    *,
    shards: int = SHARDS,
    options: SourceOptions | None = None,
    features: FeatureSpec | None = None,
    validation_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[SplitInfo, SplitInfo]:
    """One part of a table in many files read a third time, with the whole table's transforms
    (`t`, its medians settled) and normalization: its rows spooled, its shards (named by the
    part, shuffled within) written to `dest`; `rows` is the part's (train, validation) rows from
    pass 1. Its share of the table's `shards` (`fit`'s rows: the whole table's), as one file of
    the table would be sharded: ceil(shards x its train rows / the table's), at least one, more
    when a shard would pass 64 MB; half as many for validation. Its (train, validation) splits."""
    if t.pending:
        raise ValueError("part_shards: settle the medians first (TableTransforms.settle)")
    src, _ = _part(path, options, features)
    table = (fit.train_rows, fit.rows - fit.train_rows)
    plan = _Plan(path, shards, validation_fraction, seed, features, part, table)
    with _spool_folder(dest) as folder:
        spools = plan.spools(folder, *rows, t.row_bytes)
        moments = _spool_table(src, plan, fit, t.columns, [], spools)
        _check_rows(spools, *rows, path)

        def transform(x: np.ndarray) -> np.ndarray:
            return arrays.standardise(x, norm, out=x)

        for spool, m in zip(spools, moments):
            _refuse_overflow(spool, m, norm, transform, t.names, path, src.file.unit)
        out = _writer(dest)
        return spools[0].finish(out, transform, seed), spools[1].finish(out, transform, seed)


def _check_columns(src: TableSource, features: FeatureSpec) -> None:
    """A pipeline's columns against the file's: a new one ignored (said), a missing one refused."""
    source = src.file.path
    gen = f"the pipeline's features (generation {features.generation})"
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
    absent = [t.name for t in features.columns if t.name not in src.file.columns]
    for name in absent:
        # a header written another way (`Rooms`, `rooms `): the column to rename, said first
        written = tabular.same_but_case(name, new)
        if written is not None:
            raise InvalidDataset(
                f"{source}: no column {name!r}, which {gen} use; its column {written!r} differs from it only "
                f"in letter case or spacing: rename that header {name!r} and upload the version again (or "
                "prepare with --new-features to start a generation that reads it as a column of its own)"
            )
    if absent:
        # a renamed column is one missing and one new: name the new ones beside the missing ones
        renamed = f" (its columns new to them: {', '.join(map(repr, new))}: renamed?)" if new else ""
        raise InvalidDataset(
            f"{source}: no column {', '.join(map(repr, absent))}, which {gen} use{renamed}; add it (or "
            "give it back its name), or prepare with --new-features to start a generation without it"
        )


def _refuse_overflow(
    spool: ShardSpool,
    moments: Moments,
    norm: Normalization,
    transform: Transform,
    names: list[str],
    source: str,
    unit: str,
) -> None:
    """Refuse a split whose standardised values would not be finite (a pipeline version beyond its
    first version's scale), before any shard is written. Standardising is monotone, so each
    feature's smallest and largest values tell; only then are the spooled rows read again, for
    the message's columns, rows and first lines."""
    seen = moments.n > 0
    ends = np.stack([moments.low, moments.high])[:, seen].astype(np.float32)
    probe = np.zeros((2, len(names)), np.float32)
    probe[:, seen] = ends
    with np.errstate(over="ignore", invalid="ignore"):
        ok = np.isfinite(arrays.standardise(probe, norm)).all()
    if ok:
        return
    found = arrays.NonFinite()
    for j in range(spool.shards):
        x, _, rows = spool.read(j)
        found.add(transform(x), names, rows)
    problem = found.describe(unit)
    if problem is not None:
        raise InvalidDataset(f"{source} ({spool.split} split, standardised): {problem}; {arrays.FIX_ROWS}")


def _options_of(features: FeatureSpec, source: str, opts: SourceOptions) -> SourceOptions:
    """The options that read a source as the pipeline's first version was read: its label,
    task, image size and vocabulary."""
    from smlt.runtime.data import images

    fixed: dict[str, object] = {"label": features.label, "task": features.task, "vocab_size": features.vocab_size}
    if images.is_image_folder(Path(source)) and len(features.x.shape) == 3:
        fixed.update(image_size=features.x.shape[-1], channels=features.x.shape[0])
    return opts.model_copy(update={k: v for k, v in fixed.items() if v is not None})


def _apply_x(src: Source, source: str, train: np.ndarray, val: np.ndarray, features: FeatureSpec) -> arrays.StoredX:
    """Stored x of a source in memory transformed with a pipeline's features (no statistics of its own)."""
    gen = f"the pipeline's features (generation {features.generation})"
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
        return arrays.StoredX(x[train].astype(np.int64), x[val].astype(np.int64), features.x, norm)
    if norm.applied == "on_load":  # raw uint8 images, normalised by the workers with these statistics
        return arrays.StoredX(x[train].astype(np.uint8), x[val].astype(np.uint8), features.x, norm)
    xf = x.astype(np.float32, copy=False)
    arrays.refuse_non_finite(xf, source)
    return arrays.StoredX(arrays.standardise(xf[train], norm), arrays.standardise(xf[val], norm), features.x, norm)


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
        names = [src.class_names[int(c)] if src.class_names else _class_name(c) for c in classes]
        return index.astype(np.int64), ArraySpec(shape=[], dtype="int64"), len(classes), None, names
    try:
        y = src.y.astype(np.float64).reshape(len(src.y), -1)
    except ValueError:
        raise InvalidDataset(f"{source}: regression targets must be numbers") from None
    bad = ~np.isfinite(y).all(axis=1)
    if bad.any():
        first = int(np.argmax(bad))
        raise InvalidDataset(
            f"{source}: {int(bad.sum()):,} of {len(y):,} regression targets are NaN or Inf (the first: row {first}, "
            f"{y[first].tolist()}): {arrays.FIX_ROWS}"
        )
    if features is not None and features.target_mean is not None and features.target_std is not None:
        if y.shape[1] != len(features.target_mean):
            raise InvalidDataset(
                f"{source}: {y.shape[1]} regression targets, the pipeline's features {len(features.target_mean)}"
            )
        mean, std = np.asarray(features.target_mean), np.asarray(features.target_std)
    else:
        mean = y[train].mean(axis=0)
        std = arrays.target_std(y[train].std(axis=0), source, mean)
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


@contextlib.contextmanager
def _staged(dest: str, staging: bool) -> Iterator[str]:
    """Where the parts' shards are written: `dest` itself, or (`staging`) a temporary folder,
    inside a local `dest` (the same disk: the move is a rename), else the system's temp folder."""
    if not staging:
        yield dest
        return
    local = not dest.startswith("s3://")
    if local:
        Path(dest).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".smlt-staged-", dir=dest if local else None) as tmp:
        yield tmp


def _move_in(staged: str, dest: str, names: list[str]) -> None:
    """The staged shards moved into `dest` (renamed in a local folder, uploaded to S3)."""
    if staged == dest:
        return
    if dest.startswith("s3://"):
        out = _writer(dest)
        for name in names:
            out(name, (Path(staged) / name).read_bytes())
        return
    for name in names:
        os.replace(Path(staged) / name, Path(dest) / name)


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


# --- a table in parts, one pass over one part at a time (smlt.runtime.data.parts) -------------


def fit_parts(
    paths: Sequence[str],
    *,
    options: SourceOptions | None = None,
    features: FeatureSpec | None = None,
    validation_fraction: float = 0.2,
    seed: int = 0,
    source: str | None = None,
) -> tuple[TableFit, list[PartRows]]:
    """Pass 1 of a table in parts, part by part then merged (named `source`, the parts' folder;
    default: the first part and their count), with each part's rows; a column that
    is text in one part and numbers in another is read again as text in every part (as one
    file's pass 1 starts again)."""
    text: set[str] = set()
    while True:
        fits = [
            fit_part(
                p, i, options=options, features=features, text=text, validation_fraction=validation_fraction, seed=seed
            )
            for i, p in enumerate(paths)
        ]
        rows = [PartRows(f.train_rows, f.rows - f.train_rows) for f in fits]
        whole = merge_fits(fits, source)
        if not whole.flipped:
            return settle(whole, whole.path), rows
        text |= whole.flipped


def prepare_parts(
    paths: Sequence[str],
    dest: str,
    *,
    options: SourceOptions | None = None,
    features: FeatureSpec | None = None,
    shards: int = SHARDS,
    validation_fraction: float = 0.2,
    seed: int = 0,
    name: str = "parts",
    generation: int | None = None,
    source: str | None = None,
    before_shards: Callable[[], object] | None = None,
) -> Manifest:
    """A table in parts prepared into `dest` (a folder or s3:// prefix, empty), one pass over one
    part at a time (the module's docstring), `shards` the table's fewest train shards; the
    manifest last, its `source` the parts' folder when given (else the first part's path and
    their count). `before_shards` runs after every pass that refuses a table (statistics,
    moments, the shards pass: its shards are staged in a temporary folder first, then moved into
    `dest`), before the manifest is written (`smlt data prepare --replace` removes the earlier
    dataset there: a refusal leaves it as it was)."""
    if shards < 1:
        raise InvalidDataset(f"shards: need at least 1 shard, got {shards}")
    fit, rows = fit_parts(
        paths, options=options, features=features, validation_fraction=validation_fraction, seed=seed, source=source
    )
    t = TableTransforms.of(fit)
    kw = dict(options=options, features=features, validation_fraction=validation_fraction, seed=seed)
    moments = merge_moments([part_moments(p, i, fit, t, **kw) for i, p in enumerate(paths)])  # type: ignore[arg-type]
    norm, _ = t.settle(moments, (fit.train_rows, fit.rows - fit.train_rows), features)
    with _staged(dest, before_shards is not None) as into:
        splits = [
            part_shards(p, i, fit, t, norm, into, (r.train, r.validation), shards=shards, **kw)  # type: ignore[arg-type]
            for i, (p, r) in enumerate(zip(paths, rows))
        ]
        if before_shards is not None:  # every pass has refused what it refuses: the earlier dataset goes now
            before_shards()
            _move_in(into, dest, [shard.key for pair in splits for split in pair for shard in split.shards])
    manifest = part_manifest(
        fit, t, norm, splits, name=name, source=source or described(paths), features=features, generation=generation
    )
    _writer(dest)("manifest.json", manifest.model_dump_json(indent=1).encode())
    return manifest
