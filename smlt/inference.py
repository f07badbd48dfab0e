"""Load a finished run's model and predict with it: `smlt.load_model`, `smlt.predict`, `smlt predict`.

A model is found by a path (model.safetensors, or the folder `smlt run --out` / `smlt fetch`
wrote), an `s3://.../model.safetensors` URI, a run id (a local run's saved state under
`--out`, else the deployed stack's artifacts bucket), or a retraining pipeline's
`PIPELINE@latest` (its champion) / `PIPELINE@VERSION` (smlt.runtime.pipeline.model_of): in the
deployed stack's artifacts bucket, else in the local console's saved state (`smlt local up`). Its model card (smlt.runtime.modelcard)
says how to build it and how new data becomes its input: the dataset manifest's recorded
transforms are applied as they are (smlt.runtime.data.tabular.apply_columns for CSV/Parquet rows,
the recorded standardisation for arrays, the recorded size and channels for images), never
refitted. Predictions come back as class names, or regression values in the user's units.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import io
import itertools
import json
import math
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO

import numpy as np
import torch
from safetensors.torch import load as load_state
from torch import nn

from smlt.runtime import keys
from smlt.runtime.data import archives, drift, images
from smlt.runtime.data.arrays import sample_layout, standardise
from smlt.runtime.data.inputs import model_input
from smlt.runtime.data.manifest import Manifest, class_name, parse_manifest
from smlt.runtime.data.sources import TABLE_SUFFIXES, folder_parts, part_header
from smlt.runtime.data.table_reader import table_suffix
from smlt.runtime.data.tabular import (
    Table,
    TableUnseen,
    apply_columns,
    missing,
    no_column,
    read_table,
    unseen_notices,
    unused_columns,
)
from smlt.runtime.errors import InvalidDataset, RunNotFinished, RunNotFound
from smlt.runtime.keys import final_model_key, parse_s3_uri
from smlt.runtime.modelcard import InvalidModel, ModelCard, card_key, parse_card, read_card
from smlt.runtime.store import NotFound, S3Store

BATCH = 512  # rows per forward pass


# --------------------------------------------------------------------------------------------
# finding the model


@dataclass(frozen=True)
class _Found:
    blob: bytes
    card_raw: bytes | None  # model.json beside it, if any
    code_zip: bytes | None  # the user's code beside it (code.zip, or in a local run's saved state)
    where: str


def _read_local(path: Path) -> _Found:
    folder = path if path.is_dir() else path.parent
    file = folder / "model.safetensors" if path.is_dir() else path
    if not file.is_file():
        raise InvalidModel(f"{path}: no model.safetensors here (a run's output folder holds one when the run trained)")
    card = folder / "model.json"
    code = folder / "code.zip"
    return _Found(
        file.read_bytes(),
        card.read_bytes() if card.is_file() else None,
        code.read_bytes() if code.is_file() else None,
        str(file),
    )


def _read_s3(uri: str, store: S3Store | None = None) -> _Found:
    try:
        bucket, key = parse_s3_uri(uri)
    except ValueError as e:
        raise InvalidModel(f"{uri}: {e}") from None
    store = store or S3Store(bucket)
    if not key.endswith(".safetensors"):
        key = key.rstrip("/") + "/model.safetensors"
    from smlt.aws_errors import user_get  # botocore: only for a model in S3

    try:
        blob = user_get(store, key, "model", InvalidModel)
    except NotFound:
        raise InvalidModel(f"s3://{bucket}/{key}: no such object") from None
    try:
        beside = key.rsplit("/", 1)[0] + "/model.json"
        card_raw: bytes | None = user_get(store, beside, "model", InvalidModel) if "/" in key else None
    except NotFound:
        card_raw = None
    return _Found(blob, card_raw, None, f"s3://{bucket}/{key}")


def _live(pid: int) -> str:
    return f"is still running ({f'pid {pid}' if pid else 'another process'} holds its lock)"


def _local_run(run_id: str, out: Path) -> _Found | None:
    """A local run's final model in its saved state (OUT/.state/runs/<run id>/s3/<bucket>/...),
    None when `out` saves no run of that id; RunNotFinished when the run is saved but has not
    succeeded (a model it stored is not its result): still running when a live process holds its
    state lock (`folderlock.holder`: wait, naming the pid), else stopped by a crash or Ctrl-C or
    failed (`smlt resume`); InvalidModel when its final model is not the one its saved META records."""
    from smlt.folderlock import holder
    from smlt.runner import resume_command
    from smlt.snapshot import find_state, saved_items, saved_status, state_dir

    folder = find_state(out, run_id)
    if not folder.is_dir():
        return None
    if not (folder / "items.json").exists():  # made when it starts; its state saved after its first round
        pid = holder(state_dir(out, run_id))  # a live run holds its state folder's lock (snapshot.run_lock)
        if pid is not None:
            raise RunNotFinished(
                f"run {run_id!r} in {out} {_live(pid)} and has no round saved yet: wait for it to finish, then use its model"
            )
        raise RunNotFinished(
            f"run {run_id!r} in {out} has no round saved yet and no process runs it (it stopped before its first "
            f"round ended): start it again (`smlt run --local JOB --out {out}`)"
        )
    try:  # read as it is (a live run's objects may be mid-copy); a state that does not parse: named below
        items = json.loads((folder / "items.json").read_text())
        status = saved_status(items, run_id)
    except (OSError, ValueError, AttributeError, TypeError):
        items = saved_items(run_id, out)  # RunNotFound / DamagedState, naming what is wrong
        status = saved_status(items, run_id)
    if status != "SUCCEEDED":
        pid = holder(state_dir(out, run_id))
        if pid is not None:
            raise RunNotFinished(
                f"run {run_id!r} in {out} {_live(pid)}: wait for it to finish, then use its model (its saved status "
                f"is {status}; a model it stored is not its result)"
            )
        raise RunNotFinished(
            f"run {run_id!r} in {out} has not finished and no process runs it (its saved status is {status}: "
            f"stopped by a crash or Ctrl-C, or failed; a model it stored is not its result): continue it with "
            f"`{resume_command(run_id, out)}`, then use its model"
        )
    meta = next(i for i in items if i.get("sk") == keys.META and i.get("pk") == keys.pk(run_id))
    want = (meta.get("final") or {}).get("model_sha256")
    for model in sorted((folder / "s3").glob(f"*/{final_model_key(run_id)}")):
        bucket = model.parents[len(Path(final_model_key(run_id)).parts) - 1]
        card = bucket / card_key(run_id)
        raw = card.read_bytes() if card.is_file() else None
        code = None
        if raw is not None:
            ref = parse_card(raw, str(card)).code
            zipped = bucket / "code" / f"{ref.sha256}.zip" if ref and ref.sha256 else None
            code = zipped.read_bytes() if zipped and zipped.is_file() else None
        found = _Found(model.read_bytes(), raw, code, str(model))
        if want:
            _same_model(found, want, f"the run's saved state ({folder / 'items.json'})")
        return found
    raise InvalidModel(f"run {run_id!r} in {out} succeeded, but its saved state holds no final model under {folder}/s3")


def _exported_model(path: Path) -> Path:
    """The model.safetensors beside an `smlt export` file that it was made from (said in a notice);
    InvalidModel when the file records no model, none is beside it, or the one beside it is another
    (a stale export: a later run's model written into its folder after it was made)."""
    from smlt.outputs import exported_from, file_sha256, folder_run
    from smlt.runtime.progress import notice

    recorded = exported_from(path)
    model = path.parent / "model.safetensors"
    use = "give the run's output folder, its run id or its model.safetensors"
    if recorded is None:
        raise InvalidModel(
            f"{path}: an exported file for a server, not a model smlt loads, and it records no model it was made "
            f"from (exported by an older smlt, or not smlt's): {use}"
        )
    have = file_sha256(model) if model.is_file() else None
    if have is None:
        raise InvalidModel(f"{path}: an export of model {recorded[:12]}, with no model.safetensors beside it: {use}")
    if have != recorded:
        run = folder_run(path.parent)
        raise InvalidModel(
            f"{path} was exported from model {recorded[:12]}, but {model} is {have[:12]}"
            + (f" (run {run})" if run else "")
            + ": the export is stale (made before another model was written into its folder) and does not serve "
            f"this folder's model: export again with `smlt export {path.parent}`"
        )
    notice.info(f"{path}: an export of {model}: using that model")
    return model


# PIPELINE@latest, PIPELINE@VERSION (pipeline and version names: smlt.runtime.pipeline.version_name)
_PIPELINE_REF = re.compile(r"(?P<pipeline>[A-Za-z0-9_.-]+)@(?P<version>[A-Za-z0-9_.-]+)")


class _SavedBucket:
    """A bucket as the local console saves it (STATE/s3/<bucket>/<key>), read as a store."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, key: str) -> bytes:
        path = self.root / key
        if not path.is_file():
            raise NotFound(str(path))
        return path.read_bytes()

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix.rstrip("/") if prefix.endswith("/") else self.root
        if not base.is_dir():
            return []
        found = (f.relative_to(self.root).as_posix() for f in base.rglob("*") if f.is_file())
        return sorted(k for k in found if k.startswith(prefix))


def _saved_artifacts(out: Path, pipeline: str) -> tuple[Path, _SavedBucket] | None:
    """The saved bucket holding the pipeline's records: in `out` when it is a console state
    folder, else in the console's default state folder (~/.cache/smlt/console)."""
    from smlt.console import default_state_dir

    for state in dict.fromkeys([out, default_state_dir()]):
        buckets = sorted(b for b in (state / "s3").glob("*") if (b / keys.PIPELINES).is_dir())
        for bucket in buckets:
            if (bucket / keys.PIPELINES / pipeline).is_dir():
                return state, _SavedBucket(bucket)
        if buckets:
            return state, _SavedBucket(buckets[0])  # names what it holds when the pipeline is not there
    return None


def _pipeline_model(pipeline: str, version: str, out: Path, stack: str | None) -> _Found:
    """The model `PIPELINE@latest` / `PIPELINE@VERSION` names, with its card and the user's code
    from the same bucket."""
    from smlt.runtime.pipeline import model_of

    if stack is not None:
        from smlt.cloud import Stack

        artifacts = Stack.lookup(stack).artifacts_bucket
        store: Any = S3Store(artifacts)
        _, uri = model_of(store, pipeline, version)
        bucket, key = parse_s3_uri(uri)
        return _stored(S3Store(bucket), key, f"s3://{bucket}/{key}")
    saved = _saved_artifacts(out, pipeline)
    if saved is None:
        raise RunNotFound(
            f"{pipeline}@{version}: no pipeline records in {out}/s3 or the local console's state "
            "(pass the console's --state folder as out= / --runs, or stack= / --stack for a deployed stack)"
        )
    state, store = saved
    _, uri = model_of(store, pipeline, version)
    bucket, key = parse_s3_uri(uri)
    return _stored(_SavedBucket(state / "s3" / bucket), key, str(state / "s3" / bucket / key))


def _stored(store: Any, key: str, where: str) -> _Found:
    """A final model in a bucket (S3 or a saved copy), its model.json and the user's code it names."""
    try:
        blob = store.get(key)
    except NotFound:
        raise InvalidModel(f"{where}: no such object (the pipeline's record names it)") from None
    try:
        card_raw: bytes | None = store.get(key.rsplit("/", 1)[0] + "/model.json")
    except NotFound:
        card_raw = None
    code = None
    if card_raw is not None:
        ref = parse_card(card_raw, where.rsplit("/", 1)[0] + "/model.json").code
        if ref is not None and ref.sha256:
            try:
                code = store.get(keys.code_key(ref.sha256))
            except NotFound:
                code = None
    return _Found(blob, card_raw, code, where)


def _find(ref: str | Path, out: Path, stack: str | None) -> _Found:
    from smlt.outputs import EXPORT_SUFFIX

    text = str(ref)
    if text.startswith("s3://"):
        return _read_s3(text)
    path = Path(text)
    if path.is_file() and path.suffix in EXPORT_SUFFIX.values():
        return _read_local(_exported_model(path))
    if path.exists():
        return _read_local(path)
    pipeline_ref = _PIPELINE_REF.fullmatch(text)
    if pipeline_ref is not None:
        return _pipeline_model(pipeline_ref["pipeline"], pipeline_ref["version"], out, stack)
    if "/" in text or text.endswith(".safetensors"):
        raise InvalidModel(f"{text}: no such file or folder")
    found = _local_run(text, out)
    if found is not None:
        return found
    if stack is None:
        raise RunNotFound(
            f"{text}: not a file, and no local run {text!r} is saved under {out}/.state "
            "(pass the run's --out folder, or stack= / --stack for a deployed stack)"
        )
    from smlt.cloud import Stack, succeeded

    deployed = Stack.lookup(stack)
    succeeded(text, deployed)  # a failed run's stored model is not its result
    try:
        return _read_s3(f"s3://{deployed.artifacts_bucket}/{final_model_key(text)}")
    except InvalidModel:
        raise RunNotFound(f"run {text!r} has no final model in stack {stack!r} (is it finished?)") from None


# --------------------------------------------------------------------------------------------
# the loaded model


@dataclass
class Predictions:
    """A model's predictions for some rows.

        `ids` name the rows (CSV line, Parquet row, image file, array index). Classification:
        `labels` (class names), `index` (class indices), `probability` (of the predicted class),
        `probabilities` (rows x classes). Regression: `values` (rows x targets) in the user's units.
        `truth` is the data's own labels when it had them (class indices or values), so `accuracy` /
        `rmse` say how the model did on it. `unseen` (a table with text columns): per row, its text
    columns holding a value the model never saw, written as the last column. `notes`: what reading the data told (a table's values the
        model never saw in training, a number column far from what it was trained on, its columns the
        model does not use, an image folder's unreadable images left out), as `smlt predict` prints them."""

    task: str
    ids: list[str]
    columns: list[str]  # the output columns' names: the classes, or the targets
    index: np.ndarray | None = None
    probabilities: np.ndarray | None = None
    values: np.ndarray | None = None
    truth: np.ndarray | None = None
    id_name: str = "id"  # the ids' column in the written table: the data's own id column when named
    notes: list[str] = field(default_factory=list)
    unseen: Unseen | None = None  # a table's: per row, its text cells the model never saw (column `unseen`)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def labels(self) -> list[str]:
        assert self.index is not None, "regression predictions have values, not labels"
        return [self.columns[i] for i in self.index]

    @property
    def probability(self) -> np.ndarray:
        assert self.probabilities is not None and self.index is not None
        return self.probabilities[np.arange(len(self.index)), self.index]

    @property
    def accuracy(self) -> float | None:
        if self.truth is None or self.index is None or not len(self.index):
            return None
        return float((self.index == self.truth).mean())

    @property
    def rmse(self) -> float | None:
        if self.truth is None or self.values is None or not len(self.values):
            return None
        return float(np.sqrt(((self.values - self.truth.reshape(self.values.shape)) ** 2).mean()))

    def rows(self) -> tuple[list[str], list[list[Any]]]:
        """(header, rows) of the predictions table written by `write`."""
        return self._header(), list(self._body())

    def _header(self) -> list[str]:
        return self._outputs_header() + ([UNSEEN_COLUMN] if self.unseen is not None else [])

    def _outputs_header(self) -> list[str]:
        if self.index is not None:
            return [self.id_name, "prediction", "probability"] + (["label"] if self.truth is not None else [])
        assert self.values is not None
        names = self._names()
        return [self.id_name, *names] + ([f"{n}_true" for n in names] if self.truth is not None else [])

    def _names(self) -> list[str]:
        assert self.values is not None
        return self.columns if len(self.columns) == self.values.shape[1] else ["prediction"]

    def _body(self) -> Iterator[list[Any]]:
        """The rows of `rows`, one at a time (a file of millions is written without them all in memory)."""
        if self.unseen is None:
            yield from self._outputs_body()
            return
        step = 65536
        rows = self._outputs_body()
        for start in range(0, len(self), step):
            for row, cell in zip(rows, self.unseen.cells(start, start + step)):
                row.append(cell)
                yield row

    def _outputs_body(self) -> Iterator[list[Any]]:
        if self.index is not None:
            labels = (self.columns[i] for i in self.index)
            body = ([i, label, round(float(p), 6)] for i, label, p in zip(self.ids, labels, self.probability))
            if self.truth is None:
                yield from body
                return
            for row, t in zip(body, self.truth):  # the data's own label beside the prediction
                row.append(self.columns[int(t)])
                yield row
            return
        assert self.values is not None
        values = ([i, *(float(v) for v in vs)] for i, vs in zip(self.ids, self.values))
        if self.truth is None:
            yield from values
            return
        for row, t in zip(values, self.truth.reshape(self.values.shape)):  # the data's own values, as a label is
            row.extend(float(v) for v in t)
            yield row

    def write(self, path: str | Path) -> Path:
        """The predictions as a .csv, .parquet or .xlsx table: one row per input row, the same
        columns and values in each (`_write_xlsx` has the workbook's). A CSV is written a row at a
        time and a Parquet file a row group at a time: the predictions' own memory, and little more."""
        path = predictions_target(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix.lower() == ".xlsx":
                _write_xlsx(path, *self.rows())
            elif path.suffix.lower() in (".parquet", ".pq"):
                _replace_whole(path, self._write_parquet)
            else:
                _replace_whole(path, self._write_csv_file)
        except OSError as e:  # a disk full, a folder that refuses files: named, nothing half-written left
            raise InvalidDataset(
                f"--out {path} cannot be written ({e.strerror or e}): {len(self):,} predictions not saved"
            ) from None
        return path

    def _write_csv_file(self, f: BinaryIO) -> None:
        text = io.TextIOWrapper(f, encoding="utf-8", newline="")
        self.write_csv(text)
        text.flush()
        text.detach()  # `f` stays open for `_replace_whole` to close

    def write_csv(self, stream: TextIO) -> None:
        """The predictions as CSV text on an open stream (the file `write` makes of a .csv; `smlt
        predict --out -` writes it to stdout)."""
        w = csv.writer(stream)
        w.writerow(self._header())
        w.writerows(self._body())

    def _write_parquet(self, path: BinaryIO) -> None:
        """The file `pq.write_table` makes of the whole table (its columns as pyarrow reads the rows'
        values: text, float64), written a row group (PARQUET_ROW_GROUP rows, pyarrow's) at a time."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        header = self._header()
        if not len(self):
            pq.write_table(pa.table({h: [] for h in header}), path)
            return
        columns = self._columns()
        writer = None
        try:  # into `_replace_whole`'s new file: a predict stopped part way leaves the earlier file as it was
            for start in range(0, len(self), PARQUET_ROW_GROUP):
                stop = start + PARQUET_ROW_GROUP
                # a dict, as the whole table's was: a name twice (an id column named `label`) is one column
                table = pa.table({h: pa.array(column(start, stop)) for h, column in zip(header, columns)})
                writer = writer or pq.ParquetWriter(path, table.schema)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()

    def _columns(self) -> list[Callable[[int, int], list[Any]]]:
        """Each column of `rows` (in `_header`'s order) as its rows `start:stop`' values."""
        found = self._outputs_columns()
        if self.unseen is not None:
            found.append(self.unseen.cells)
        return found

    def _outputs_columns(self) -> list[Callable[[int, int], list[Any]]]:
        ids = self.ids
        if self.index is not None:
            index, probability, classes = self.index, self.probability, self.columns
            found: list[Callable[[int, int], list[Any]]] = [
                lambda a, b: ids[a:b],
                lambda a, b: [classes[i] for i in index[a:b]],
                lambda a, b: [round(float(p), 6) for p in probability[a:b]],
            ]
            truth = self.truth
            if truth is not None:
                found.append(lambda a, b: [classes[int(t)] for t in truth[a:b]])
            return found
        assert self.values is not None
        values = self.values

        def of(array: np.ndarray, j: int) -> Callable[[int, int], list[Any]]:
            return lambda a, b: [float(v) for v in array[a:b, j]]

        found = [lambda a, b: ids[a:b]] + [of(values, j) for j in range(len(self._names()))]
        if self.truth is not None:
            found += [of(self.truth.reshape(values.shape), j) for j in range(len(self._names()))]
        return found


# The written predictions' column naming, per row, the text columns whose value the model never saw.
UNSEEN_COLUMN = "unseen"


# Rows of a Parquet file's row group: pyarrow's default, as `pq.write_table` cuts a whole table.
PARQUET_ROW_GROUP = 1024 * 1024


# An Excel sheet's size: its rows (the header's one too) and columns, and the characters of a cell.
XLSX_MAX_ROWS = 1_048_576
XLSX_MAX_COLUMNS = 16_384
XLSX_MAX_TEXT = 32_767


def _write_xlsx(path: Path, header: list[str], body: list[list[Any]]) -> None:
    """The predictions table as a workbook of one sheet, `predictions`: the header row, then a row
    per prediction with the values the CSV holds, numbers as numbers (a probability, a regression
    value: a float as the CSV writes it) and text as text (ids, as in the Parquet file; `=...` and
    `#N/A` too, never a formula or an error). A NaN is an empty cell, an infinity the text `inf` /
    `-inf` (as pandas' to_excel writes them). More rows or columns than a sheet holds, or a text a
    cell cannot hold, are refused before anything is written. Written by openpyxl's write-only
    mode, whole or not at all (`_replace_whole`)."""
    _refuse_what_a_sheet_cannot_hold(path, header, body)
    from openpyxl import Workbook
    from openpyxl.cell import WriteOnlyCell
    from openpyxl.cell.cell import ERROR_CODES

    wb = Workbook(write_only=True)
    ws = wb.create_sheet("predictions")

    def typed(text: str, data_type: str) -> Any:
        written = WriteOnlyCell(ws, text)
        written.data_type = data_type
        return written

    def cell(value: Any) -> Any:
        if isinstance(value, float):
            if math.isnan(value):
                return None
            if math.isinf(value):
                return "inf" if value > 0 else "-inf"
            # Its shortest exact text, as the CSV holds it (openpyxl's own "%.16g" can round a
            # double's last digit, and writes 2.0 as 2, read back as an int).
            return typed(repr(value), "n")
        if isinstance(value, str) and (value.startswith("=") or value in ERROR_CODES):
            return typed(value, "s")  # text, not a formula nor an error (#N/A)
        return value

    def write(f: BinaryIO) -> None:
        ws.append([cell(h) for h in header])
        for values in body:
            ws.append([cell(v) for v in values])
        wb.save(f)

    _replace_whole(path, write)


def _refuse_what_a_sheet_cannot_hold(path: Path, header: list[str], body: list[list[Any]]) -> None:
    """InvalidDataset for more rows or columns than an Excel sheet holds, or the first text no
    cell can hold (a control character, more than 32,767 characters), naming .csv and .parquet."""
    if len(body) + 1 > XLSX_MAX_ROWS:
        raise InvalidDataset(
            f"--out {path}: {len(body):,} predictions and the header are more rows than an Excel sheet holds "
            f"({XLSX_MAX_ROWS:,}): write them to a .csv or .parquet file"
        )
    if len(header) > XLSX_MAX_COLUMNS:
        raise InvalidDataset(
            f"--out {path}: {len(header):,} columns are more than an Excel sheet holds ({XLSX_MAX_COLUMNS:,}): "
            "write them to a .csv or .parquet file"
        )
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE

    for row, values in enumerate(itertools.chain([header], body), start=1):
        for value, column in zip(values, header):
            if isinstance(value, str) and (len(value) > XLSX_MAX_TEXT or ILLEGAL_CHARACTERS_RE.search(value)):
                what = f"{len(value):,} characters" if len(value) > XLSX_MAX_TEXT else "a control character"
                raise InvalidDataset(
                    f"--out {path}: row {row}, column {column!r}: {value[:40]!r} holds {what}, which an Excel "
                    "cell cannot hold: write the predictions to a .csv or .parquet file"
                )


PREDICTION_SUFFIXES = (".csv", ".parquet", ".pq", ".xlsx")


def predictions_target(path: str | Path) -> Path:
    """`path` as a predictions file to write (checked before any row is predicted): InvalidDataset
    for another suffix, a folder, or a file where a folder above it should be (its missing
    folders are made when it is written)."""
    path = Path(path)
    if path.is_dir():
        raise InvalidDataset(
            f"--out {path} is a folder: name the predictions file, e.g. --out {path / 'predictions.csv'}"
        )
    if path.suffix.lower() not in PREDICTION_SUFFIXES:
        raise InvalidDataset(
            f"--out {path}: write predictions to a .csv, .parquet or .xlsx file (smlt predict: --out - for CSV on stdout)"
        )
    for above in path.parents:
        if above.exists():
            if not above.is_dir():
                raise InvalidDataset(f"--out {path}: {above} is a file, not a folder: name a file in a folder")
            if not os.access(above, os.W_OK | os.X_OK):
                raise InvalidDataset(
                    f"--out {path}: {above} cannot be written: name a file in a folder you can write to"
                )
            break
    return path


def _replace_whole(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """`write` a new file beside `path` and rename it over `path` when whole: never a half-written
    file there. An existing file is replaced as an overwrite (the CSV's `open("w")`) treats it:
    through a symlink, its permissions kept, refused when it is not writable; a new one gets the
    umask's."""
    target = Path(os.path.realpath(path))
    mode = None
    if target.exists():
        if not os.access(target, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        mode = stat.S_IMODE(target.stat().st_mode)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            write(f)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass
class Inputs:
    """Rows ready for the model: `x` as the shards store it, with their ids and any labels, and
    what reading them told (`notes`, also logged as notices)."""

    x: np.ndarray
    ids: list[str]
    truth: np.ndarray | None = None
    id_name: str = "id"
    notes: list[str] = field(default_factory=list)
    unseen: Unseen | None = None  # a table's one-hot cells the model never saw, per row


@dataclass
class Unseen:
    """Per row, per one-hot text column of a table (`columns`), whether its cell holds a value the
    model never saw in training (`flags`, bool [rows, columns]): the cells the notice 'N of M rows
    hold values the model never saw' counts (tabular.unseen_values' rule), and the ONNX export's
    output `unseen`. Written beside the predictions as the column `unseen`: the flagged columns'
    names, `;` between them, empty for a row with none."""

    columns: list[str]
    flags: np.ndarray

    @staticmethod
    def of(columns: Any, table: Table) -> Unseen | None:
        """The one-hot columns of `columns` (the manifest's) that `table` holds, read as
        tabular.TableUnseen reads them (a missing cell is never unseen); None: it holds none."""
        import pyarrow as pa
        import pyarrow.compute as pc

        onehot = [t for t in columns or [] if t.kind == "onehot" and t.name in table.columns]
        if not onehot:
            return None
        flags = np.zeros((len(table), len(onehot)), bool)
        for j, t in enumerate(onehot):
            cells = table.columns[t.name]
            text = cells.astype(str) if cells.dtype.kind == "f" else cells  # as `_encode` reads them
            arr = pa.array(text, pa.string(), mask=missing(cells))
            new = pc.and_(pc.invert(pc.is_in(arr, value_set=pa.array(t.levels, pa.string()))), pc.is_valid(arr))
            flags[:, j] = new.fill_null(False).to_numpy(zero_copy_only=False)
        return Unseen([t.name for t in onehot], flags)

    @staticmethod
    def joined(parts: list[Unseen | None]) -> Unseen | None:
        """Blocks' (or parts') flags as one, in order; None when any block has none."""
        if not parts or any(u is None for u in parts):
            return None
        found = [u for u in parts if u is not None]
        if any(u.columns != found[0].columns for u in found):
            return None
        return Unseen(found[0].columns, np.concatenate([u.flags for u in found]))

    def cells(self, start: int, stop: int) -> list[str]:
        """Rows `start:stop`' cells of the written column: the flagged columns' names, `;` between them."""
        flags = self.flags[start:stop]
        cells = [""] * len(flags)
        for r in np.flatnonzero(flags.any(axis=1)).tolist():  # most rows flag none: only those that do are joined
            cells[r] = ";".join(n for n, f in zip(self.columns, flags[r].tolist()) if f)
        return cells


@dataclass
class LoadedModel:
    """A run's model, in eval mode, with its card and the transform new data goes through."""

    module: nn.Module
    card: ModelCard
    source: str
    _manifest: Manifest | None = field(default=None, repr=False)
    sha256: str = ""  # of the model.safetensors it was loaded from (an export records it)

    @property
    def manifest(self) -> Manifest:
        """The dataset's feature spec recorded in the card (the manifest without its shards)."""
        if self.card.features is None:
            raise InvalidModel(
                f"{self.source}: its model card records no feature spec (the dataset's manifest was unreadable "
                "when the run finished): predict on model-ready tensors with `module` directly"
            )
        return self.card.features

    @property
    def classes(self) -> list[str]:
        if self.card.classes:
            return self.card.classes
        return [str(i) for i in range(self.card.output_dim)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.module(x)

    def transform(self, data: Any) -> torch.Tensor:
        """New data (as `inputs` reads it) as the model's input tensor."""
        return torch.from_numpy(np.ascontiguousarray(model_input(self.manifest, self.inputs(data).x)))

    def inputs(
        self, data: Any, split: str = "validation", id_column: str | None = None, encoding: str | None = None
    ) -> Inputs:
        """Rows of `data` in the stored form: a .csv/.parquet file or DataFrame (the recorded column
        transforms), an .npz file or an array (the recorded standardisation), an image file or
        folder (resized to the recorded size), or a prepared dataset folder (its `split`'s shards).
        `id_column`: a table's column whose values name the rows (else its line or row number).
        `encoding`: a CSV's (.tsv, .txt) when it is not UTF-8 and has no byte-order mark (`cp1252`)."""
        return read_inputs(self.manifest, data, split, id_column, encoding)

    def serving_input(self, data: Any, split: str = "validation") -> np.ndarray:
        """`data` as the input of the model `smlt export` writes (smlt.serving): feature values and
        number columns in the data's own units (NaN for a missing cell), uint8 images, token ids,
        or, for a table with a text column, the rows with the card's column transforms applied."""
        return serving_input(self, data, split)

    def predict(
        self, data: Any, split: str = "validation", id_column: str | None = None, encoding: str | None = None
    ) -> Predictions:
        """Predictions on `data` (as `inputs` reads it). A table file or a DataFrame is read, transformed
        and predicted on block by block (`_predict_table`): its memory is a block's and the
        predictions', whatever the file's size; the predictions and notes are those of the rows read whole.
        An archive (.zip, .tar, .tar.gz, ...) is predicted on as the folder or file it holds."""
        if archives.is_archive_file(data):
            with archives.unpacked(Path(str(data))) as inner:
                return self.predict(inner, split, id_column, encoding)
        if not isinstance(data, Inputs) and self.card.features is not None and _streams(self.manifest, data):
            return self._predict_table(data, id_column, encoding)
        rows = data if isinstance(data, Inputs) else self.inputs(data, split, id_column, encoding)
        return self.predict_rows(rows)

    def _forward(self, x: np.ndarray) -> np.ndarray:
        """The model's outputs on stored rows, BATCH rows a forward pass."""
        outs = []
        with torch.no_grad():
            for s in range(0, len(x), BATCH):
                batch = torch.from_numpy(np.ascontiguousarray(model_input(self.manifest, x[s : s + BATCH])))
                outs.append(self.module(batch).float().numpy())
        return np.concatenate(outs) if outs else np.zeros((0, self.card.output_dim), np.float32)

    def predict_rows(self, rows: Inputs) -> Predictions:
        return self._predictions(self._forward(rows.x), rows)

    def _predict_table(self, data: Any, id_column: str | None, encoding: str | None = None) -> Predictions:
        """`predict` on a table file or DataFrame read block by block: each block's rows transformed
        (the recorded column transforms) and run through the model in the same BATCH-row forward
        passes as the rows read whole (the rows a pass holds carried from one block to the next),
        only the outputs, ids and labels kept; the notes gathered over all the blocks (`_Gathered`).
        A refused block is refused as the rows read whole are: the file is read whole then (only
        on that path), so the refusal is `read_inputs`' own, in its order."""
        manifest = self.manifest
        assert manifest.columns is not None
        outs: list[np.ndarray] = []
        carry = np.zeros((0, *manifest.x.shape), np.float32)
        refused = False
        with _table_blocks(manifest, data, id_column, encoding) as (where, header, tables):
            gathered = _Gathered(manifest, where, header, id_column)
            for table in tables:
                try:
                    if gathered.id_absent is not None:
                        raise gathered.id_absent
                    x = apply_columns(manifest, table)
                except InvalidDataset:
                    refused = True
                    break
                gathered.add(table)
                x = np.concatenate([carry, x]) if len(carry) else x
                whole = len(x) // BATCH * BATCH
                outs.append(self._forward(x[:whole]))
                carry = x[whole:]
            if gathered.read and not refused:
                outs.append(self._forward(carry))
                rows = gathered.inputs()
        if refused or not gathered.read:  # refused (or no rows) as the rows read whole are
            return self.predict_rows(read_inputs(manifest, data, id_column=id_column, encoding=encoding))
        return self._predictions(np.concatenate(outs), rows)

    def _predictions(self, out: np.ndarray, rows: Inputs) -> Predictions:
        if self.card.task == "classification":
            probs = torch.softmax(torch.from_numpy(out), dim=1).numpy()
            return Predictions(
                "classification",
                rows.ids,
                self.classes,
                out.argmax(1),
                probs,
                truth=rows.truth,
                id_name=rows.id_name,
                notes=list(rows.notes),
                unseen=rows.unseen,
            )
        target = self.manifest.target
        values = out.astype(np.float64)
        if target is not None:  # stored standardised: back to the user's units
            values = values * np.asarray(target.std) + np.asarray(target.mean)
        label = self.manifest.label
        names = [label] if label and values.shape[1] == 1 else [f"prediction_{j}" for j in range(values.shape[1])]
        if values.shape[1] == 1 and not label:
            names = ["prediction"]
        return Predictions(
            "regression",
            rows.ids,
            names,
            values=values,
            truth=rows.truth,
            id_name=rows.id_name,
            notes=list(rows.notes),
            unseen=rows.unseen,
        )


def load_model(
    ref: str | Path, *, out: str | Path = "out", stack: str | None = None, code: str | Path | None = None
) -> LoadedModel:
    """The model of a finished run, in eval mode: `ref` is a model.safetensors file or a run's
    output folder, an s3:// URI, a run id (a local run saved under `out`, else the deployed
    `stack`'s), or a retraining pipeline's `PIPELINE@latest` (its champion) or `PIPELINE@VERSION`
    (the deployed `stack`'s, else the local console's saved state: `out` or its default folder). A model built by the user's code imports it from the code stored with the run
    (code.zip beside the model, checked against the card's sha256), from `code` (a folder), or
    from the Python path."""
    found = _find(ref, Path(out), stack)
    card = read_card(found.blob, found.where)
    if found.card_raw is not None:  # model.json adds the final metrics and the file's sha256
        beside = found.where.rsplit("/", 1)[0] + "/model.json"
        card = parse_card(found.card_raw, beside)
        if card.model_sha256:
            _same_model(found, card.model_sha256, beside)
    if card is None:
        raise InvalidModel(
            f"{found.where}: the model has no model card (it was published before smlt wrote one): "
            "build it with smlt.runtime.train.models.build_model and load its state dict yourself"
        )
    module = build(card, found, Path(code) if code is not None else None)
    return LoadedModel(module, card, found.where, sha256=hashlib.sha256(found.blob).hexdigest())


def _same_model(found: _Found, want: str, said_by: str) -> None:
    """InvalidModel when the model file is not the one `said_by` (model.json, a local run's saved
    META) records: edited, cut short, or another run's file put in its place."""
    got = hashlib.sha256(found.blob).hexdigest()
    if got != want:
        raise InvalidModel(
            f"{found.where}: its sha256 is {got[:12]}, but {said_by} records the run's model as {want[:12]}: "
            "the file is not the model the run published (edited, cut short, or another run's file put in its "
            "place); fetch the run's outputs again (`smlt fetch RUN --out DIR`), or delete the model.json that "
            "does not belong to it"
        )


def build(card: ModelCard, found: _Found, code: Path | None) -> nn.Module:
    from smlt.runtime.train.models import build_model

    if not card.builtin:
        _activate_code(card, found, code)
    model = build_model(card.model, card.input_shape, card.output_dim, card.seed, vocab_size=card.vocab_size)
    try:
        state = load_state(found.blob)
        model.load_state_dict(state)
    except (RuntimeError, ValueError) as e:
        raise InvalidModel(
            f"{found.where}: the weights do not fit the model the card describes ({card.model.name}): "
            f"{str(e).splitlines()[0]}"
        ) from None
    return model.eval()


def _activate_code(card: ModelCard, found: _Found, folder: Path | None) -> None:
    """The user's code importable: from `folder`, from the stored zip (checked), or already on the path."""
    from smlt.runtime import usercode

    want = card.code.sha256 if card.code else None
    data = found.code_zip
    if folder is not None:
        package = usercode.package_code(folder)
        if want is not None and package.sha256 != want:
            from smlt.runtime.progress import notice

            notice.info(
                f"code: {folder} is not the code the model was trained with (sha256 {package.sha256[:12]}, "
                f"the card says {want[:12]}): using it all the same"
            )
        data, want = package.data, package.sha256
    if data is not None and want is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise InvalidModel(f"{found.where}: the stored code has sha256 {got[:12]}, the card says {want[:12]}")
        dest = usercode.code_root() / want
        if not dest.is_dir():
            dest.parent.mkdir(parents=True, exist_ok=True)
            usercode._extract(data, dest, found.where)
        usercode._put_first(want, dest)
    module = card.model.name.partition(":")[0]
    import importlib.util

    try:
        ok = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        ok = False
    if not ok:
        raise InvalidModel(
            f"model.name: {card.model.name!r} is the user's code and it is not here: pass the code's folder "
            "(code= / --code DIR), or keep code.zip beside the model (`smlt run` and `smlt fetch` write it)"
        )


# --------------------------------------------------------------------------------------------
# reading new data as the dataset's stored rows


def read_inputs(
    manifest: Manifest, data: Any, split: str = "validation", id_column: str | None = None, encoding: str | None = None
) -> Inputs:
    if archives.is_archive_file(data):  # read as the folder or file it holds
        with archives.unpacked(Path(str(data))) as inner:
            return _read_inputs(manifest, inner, split, id_column, encoding)
    return _read_inputs(manifest, data, split, id_column, encoding)


def _read_inputs(manifest: Manifest, data: Any, split: str, id_column: str | None, encoding: str | None) -> Inputs:
    if isinstance(data, Inputs):
        return data
    if id_column is not None and not (_is_frame(data) or table_suffix(str(data)) in TABLE_SUFFIXES or _parts(data)):
        raise InvalidDataset(
            f"id column {id_column!r}: {data if isinstance(data, (str, Path)) else 'the data'} is not a table"
        )
    if isinstance(data, torch.Tensor):
        data = data.numpy()
    if isinstance(data, np.ndarray):
        return _arrays(manifest, data, None, "array")
    if _is_frame(data):
        return _table(manifest, read_table_rows(manifest, data), id_column)
    path = Path(str(data))
    if str(data).startswith("s3://"):
        return _prepared_s3(manifest, str(data), split)
    if not path.exists():
        raise InvalidDataset(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / "manifest.json").is_file():
            return _prepared_local(manifest, path, split)
        parts = folder_parts(path)
        if parts is not None:
            return _parts_inputs(manifest, path, parts, id_column, encoding)
        return _images(manifest, path)
    suffix = path.suffix.lower()
    if table_suffix(path) in TABLE_SUFFIXES:
        return _table(manifest, read_table_rows(manifest, path, encoding), id_column)
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            if "x" not in z:
                raise InvalidDataset(f"{path}: an .npz to predict on needs an array 'x', found {list(z.keys())}")
            return _arrays(manifest, z["x"], z["y"] if "y" in z else None, str(path))
    if suffix in images.IMAGE_SUFFIXES:
        return _images(manifest, path)
    raise InvalidDataset(
        f"{path}: predict on a .csv, .tsv, .txt, .parquet, .jsonl, .xlsx or .npz file, an image (or a folder of them), "
        f"a folder of a table's parts, an archive of one of those ({archives.ARCHIVE_KINDS}) or a prepared dataset folder"
    )


def _truth_classes(manifest: Manifest, labels: np.ndarray, where: str) -> np.ndarray | None:
    """Labels as class indices, or None (with a note) when some are not the model's classes."""
    if manifest.task != "classification" or not manifest.classes:
        return None
    index = {c: i for i, c in enumerate(manifest.classes)}
    names = [class_name(v.item() if hasattr(v, "item") else v) for v in labels]
    unknown = sorted({n for n in names if n not in index})
    if unknown:
        _tell_unknown_labels(manifest, unknown, where)
        return None
    return np.array([index[n] for n in names], np.int64)


def _tell_unknown_labels(manifest: Manifest, unknown: list[str], where: str) -> None:
    """The notice that the data's labels (`unknown`: those not the model's classes, sorted) are not
    all the model's classes: no accuracy."""
    from smlt.runtime.progress import notice

    notice.info(
        f"{where}: label {unknown[0]!r}{f' (and {len(unknown) - 1} more)' if len(unknown) > 1 else ''} is not "
        f"one of the model's classes ({', '.join(manifest.classes or [])}): predictions without the data's labels "
        "or accuracy"
    )


def read_table_rows(manifest: Manifest, data: Any, encoding: str | None = None) -> Table:
    """A DataFrame or a .csv/.parquet/.jsonl/.xlsx file as `smlt predict` reads it (before its transforms);
    `encoding`: a delimited text file's (`LoadedModel.inputs`)."""
    numeric = {t.name for t in manifest.columns or [] if t.kind in ("numeric", "date")}
    if _is_frame(data):
        return _frame_table(data, numeric)
    return read_table(Path(str(data)), numeric, encoding)  # a missing marker (`NA`) in them is empty


def table_inputs(manifest: Manifest, table: Table) -> Inputs:
    """A table's rows as predict reads them: the recorded column transforms, the data's labels."""
    return _table(manifest, table)


def _table(manifest: Manifest, table: Table, id_column: str | None = None) -> Inputs:
    if manifest.columns is None:
        raise InvalidDataset(
            f"{table.path}: the model was trained on {manifest.source}, not on named columns: predict on an .npz, "
            "images or arrays shaped like its samples " + "x".join(map(str, manifest.x.shape))
        )
    x = apply_columns(manifest, table)
    if id_column is not None and id_column not in table.columns:
        raise no_column(f"{table.path}: id column (--id)", [id_column], list(table.columns))
    notes = _told(manifest, table, id_column)
    truth = None
    label = manifest.label
    if label and label in table.columns and not missing(table.columns[label]).any():
        cells = table.columns[label]
        if manifest.task == "classification":
            if cells.dtype.kind != "f":
                try:
                    cells = cells.astype(np.float64)
                except ValueError:
                    pass
            truth = _truth_classes(manifest, cells, table.path)
        else:
            try:
                truth = cells.astype(np.float64)
            except ValueError:
                truth = None
    unseen = Unseen.of(manifest.columns, table)
    if id_column is None:
        return Inputs(x, [f"{table.unit} {int(r)}" for r in table.rows], truth, notes=notes, unseen=unseen)
    cells = table.columns[id_column]
    ids = [_number_id(float(v)) for v in cells] if cells.dtype.kind == "f" else [str(v) for v in cells]
    return Inputs(x, ids, truth, id_column, notes, unseen)


def _parts(data: Any) -> list[Path] | None:
    """A folder of a table's parts (`part-00000.csv`, ...: smlt.runtime.data.sources.folder_parts) named by `data`."""
    if not isinstance(data, (str, Path)) or str(data).startswith("s3://"):
        return None
    return folder_parts(Path(str(data)))


def _parts_inputs(
    manifest: Manifest, folder: Path, parts: list[Path], id_column: str | None, encoding: str | None
) -> Inputs:
    """A folder of a table's parts read whole, part after part, each as its file is (`_table`),
    its headers checked first: the rows in the parts' order, each named by its part and line
    (`part-00001.csv line 2`) unless `id_column` names them; `predict` streams them instead."""
    part_header(parts, folder, encoding)
    read = [_table(manifest, read_table_rows(manifest, p, encoding), id_column) for p in parts]
    ids = [i if id_column is not None else f"{p.name} {i}" for p, rows in zip(parts, read) for i in rows.ids]
    truths = [r.truth for r in read if r.truth is not None]
    truth = np.concatenate(truths) if len(truths) == len(read) else None
    x = np.concatenate([r.x for r in read])
    unseen = Unseen.joined([r.unseen for r in read])
    return Inputs(x, ids, truth, read[0].id_name, [n for r in read for n in r.notes], unseen)


def _number_id(v: float) -> str:
    """An id read as a number (the column is one of the model's numbers too) as it was written:
    1234567, not `1.23457e+06`; 0.5 as 0.5; a missing cell empty."""
    if np.isnan(v):
        return ""
    return str(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


# Unused columns named in a notice.
UNUSED_NAMED = 10


def _told(manifest: Manifest, table: Table, id_column: str | None) -> list[str]:
    """What a table tells before it is predicted on, logged as notices (stderr in the CLI): a
    notice per one-hot column holding values the model never saw in training (the one rule of
    a pipeline's later versions, tabular.unseen_values), a notice per number column (and a
    regression's target) far from what the model was trained on (another unit, a broken column:
    the one rule of a pipeline's later versions, drift.far_notice), and one naming the columns the
    model does not use (its label and the id column aside)."""
    from smlt.runtime.progress import notice

    assert manifest.columns is not None
    notes = unseen_notices(manifest.columns, table) + drift.table_notices(manifest, table)
    notes += _unused_note(manifest, table, id_column)
    for note in notes:
        notice.warning(note)
    return notes


def _unused_note(manifest: Manifest, table: Table, id_column: str | None) -> list[str]:
    """The notice naming the table's columns the model does not use (its label and the id column aside)."""
    assert manifest.columns is not None
    also = [n for n in (manifest.label, id_column) if n]
    unused = unused_columns(manifest.columns, table, also)
    if not unused:
        return []
    more = len(unused) - UNUSED_NAMED
    names = ", ".join(unused[:UNUSED_NAMED]) + (f" and {more} more" if more > 0 else "")
    ids = [n for n in unused if _ID_NAME.search(n)] if id_column is None else []
    hint = f" (--id {ids[0]} names each prediction by its {ids[0]!r} instead of its line)" if ids else ""
    return [f"{table.path}: columns not used by the model: {names}{hint}"]


# A column named as ids are (`id`, `ID`, `customer_id`, `PassengerId`): the --id hint's guess.
_ID_NAME = re.compile(r"^(?i:id)$|[_\s-](?i:id)$|[a-z]Id$|[a-z]ID$")


def _is_frame(data: Any) -> bool:
    return type(data).__name__ == "DataFrame" and hasattr(data, "columns")


def _frame_table(df: Any, numeric: set[str]) -> Table:
    """A pandas DataFrame as the CSV `df.to_csv(index=False)` writes is read, one rule for both:
    booleans as `True`/`False` text, nullable and datetime columns as that file writes them, its
    column names as text; its rows named by position (`row 0` first), its index not read. The CSV
    goes through a temporary file, written and read in blocks, and named `DataFrame` in errors (as
    a workbook's is named by the workbook: smlt.runtime.data.workbook)."""
    with _frame_csv(df) as path:
        table = read_table(path, numeric)
    return Table("DataFrame", table.columns, np.arange(len(table)), "row")


@contextmanager
def _frame_csv(df: Any) -> Iterator[Path]:
    """`df.to_csv(index=False)` in a temporary file, deleted after; a dataset error naming the file
    inside names `DataFrame` (a column named twice, no rows)."""
    import tempfile

    from smlt.runtime.data.workbook import named_as

    with tempfile.TemporaryDirectory(prefix="smlt-frame-") as tmp:
        path = Path(tmp) / "DataFrame.csv"
        df.to_csv(path, index=False)
        with named_as(path, "DataFrame"):
            yield path


# --- a table read block by block (LoadedModel._predict_table) --------------------------------


def _streams(manifest: Manifest, data: Any) -> bool:
    """Whether `predict` reads `data` block by block: a table file or a DataFrame, for a model of
    named columns (another model refuses them as `read_inputs` does)."""
    if manifest.columns is None:
        return False
    if _is_frame(data):
        return True
    if not isinstance(data, (str, Path)) or str(data).startswith("s3://"):
        return False
    return (table_suffix(str(data)) in TABLE_SUFFIXES and Path(str(data)).is_file()) or _parts(data) is not None


# Cells of a block's columns predict reads turned into a Table at a time: a block (4 MB of CSV, a
# Parquet batch) is read as it is, then taken in slices of about this many cells, the most a Table's
# arrays then hold (a 4 MB block of 4 columns whole: 130 MB more at the peak).
SLICE_CELLS = 1 << 17


@contextmanager
def _table_blocks(
    manifest: Manifest, data: Any, id_column: str | None, encoding: str | None = None
) -> Iterator[tuple[str, list[str], Iterator[Table]]]:
    """A table file's or DataFrame's name in messages, its header, and its blocks' rows as Tables,
    each read as `read_table_rows` reads the whole file (`_block_cells`), with the columns predict
    reads: the model's, its label and any id column (the others are named, with no cells). A
    DataFrame goes through its CSV (`_frame_csv`), its rows named by position. A folder of a
    table's parts: the folder, the parts' one header (checked first), and every part's blocks in
    the parts' order, each Table named by its part. Progress lines as prepare prints them while a
    big file is read."""
    assert manifest.columns is not None
    from smlt.runtime.data.tables import open_table

    numeric = {t.name for t in manifest.columns if t.kind in ("numeric", "date")}
    wanted = {t.name for t in manifest.columns} | {manifest.label or "", id_column or ""}
    frame = _is_frame(data)
    parts = None if frame else _parts(data)
    if parts is not None:
        header = part_header(parts, Path(str(data)), encoding)
        tables = (t for p in parts for t in _file_tables(open_table(p, encoding), numeric, wanted, False))
        yield str(data), header, tables
        return
    with _frame_csv(data) if frame else _nothing(Path(str(data))) as path:
        file = open_table(path, encoding)
        yield "DataFrame" if frame else file.path, list(file.columns), _file_tables(file, numeric, wanted, frame)


def _file_tables(file: Any, numeric: set[str], wanted: set[str], frame: bool) -> Iterator[Table]:
    """A table file's blocks as Tables (`_table_blocks`), in slices of about SLICE_CELLS cells;
    a file's progress lines (not a DataFrame's)."""
    as_float = _parquet_numbers(file, numeric)
    where, unit = ("DataFrame", "row") if frame else (file.path, file.unit)
    reading = None
    if not frame:
        from smlt.runtime.data.prepare import _Reading

        reading = _Reading(where, "predicting", file.size, file.unit)
    done = 0
    step = max(1, SLICE_CELLS // max(1, len(wanted & set(file.columns))))
    for block in file.blocks(reading):
        for start in range(0, len(block), step):
            b = block.slice(start, start + step) if len(block) > step else block
            cells = {
                c: _block_cells(b, c, c in numeric, as_float.get(c, False)) if c in wanted else np.zeros(0)
                for c in file.columns
            }
            rows = np.arange(done, done + len(b)) if frame else b.rows
            done += len(b)
            yield Table(where, cells, rows, unit)
    if reading is not None:
        reading.done()


@contextmanager
def _nothing(path: Path) -> Iterator[Path]:
    yield path


def _parquet_numbers(file: Any, numeric: set[str]) -> dict[str, bool]:
    """The model's number columns a Parquet file's Table holds as float64 (`tabular._cells`: those
    whose every block is numbers: a number type, or text that is numbers in every block, found by
    reading the file once more); a CSV's hold their text."""
    from smlt.runtime.data.table_reader import _is_number_type, is_parquet

    names = [c for c in file.columns if c in numeric]
    if not names or not is_parquet(file.path):
        return {}
    import pyarrow as pa

    blocks = file.blocks()
    first = next(blocks, None)
    blocks.close()
    if first is None:
        return {}
    kinds = {c: first.cells[c].type for c in names}
    found = {c: _is_number_type(t) for c, t in kinds.items()}
    text = [c for c, t in kinds.items() if pa.types.is_string(t) or pa.types.is_large_string(t)]
    if text:
        found.update(dict.fromkeys(text, True))
        for b in file.blocks():
            for c in text:
                found[c] = found[c] and b.numbers(c) is not None
    return found


def _block_cells(block: Any, name: str, numeric: bool, as_float: bool) -> np.ndarray:
    """A block's column as `tabular._cells` reads it in the whole file."""
    if not numeric:
        return block.column(name, numeric=False)
    if as_float:
        parsed = block.numbers(name)
        assert parsed is not None
        return parsed[0]
    return np.asarray(block.number_text(name).fill_null("").to_numpy(zero_copy_only=False), dtype=str)


class _Gathered:
    """What `_table` tells of a table read whole, gathered block by block: the rows' ids, the
    data's labels (`_Labels`), and the notes (values a one-hot column never saw: tabular.TableUnseen;
    number columns far from training: drift.TableFar; the columns not used)."""

    def __init__(self, manifest: Manifest, where: str, header: list[str], id_column: str | None):
        assert manifest.columns is not None
        self.manifest, self.where, self.header, self.id_column = manifest, where, header, id_column
        self.id_absent = (
            no_column(f"{where}: id column (--id)", [id_column], header)
            if id_column is not None and id_column not in header
            else None
        )
        self.unseen = TableUnseen(manifest.columns, header)
        self.far = drift.TableFar(manifest, header)
        self.labels = _Labels(manifest, header)
        self.ids: list[str] = []
        self.flags: list[Unseen | None] = []
        self.read = 0
        self.parts = where != "DataFrame" and Path(where).is_dir()  # a folder of parts: each row named by its part too

    def add(self, table: Table) -> None:
        self.read += len(table)
        self.unseen.add(table)
        self.flags.append(Unseen.of(self.manifest.columns, table))
        self.far.add(table)
        self.labels.add(table)
        if self.id_column is None:
            part = f"{Path(table.path).name} " if self.parts else ""
            self.ids += [f"{part}{table.unit} {r}" for r in table.rows.tolist()]
            return
        cells = table.columns[self.id_column]
        self.ids += [_number_id(float(v)) for v in cells] if cells.dtype.kind == "f" else [str(v) for v in cells]

    def inputs(self) -> Inputs:
        """The rows' ids, labels and notes as `_table` gives them (the notes logged as it logs them);
        no features (they went through the model block by block)."""
        from smlt.runtime.progress import notice

        header = Table(self.where, dict.fromkeys(self.header, np.zeros(0)), np.zeros(0, np.int64))
        notes = self.unseen.notices(self.where) + self.far.notices(self.where)
        notes += _unused_note(self.manifest, header, self.id_column)
        for note in notes:
            notice.warning(note)
        truth = self.labels.truth(self.where)
        empty = np.zeros((0, *self.manifest.x.shape), np.float32)
        unseen = Unseen.joined(self.flags)
        if self.id_column is None:
            return Inputs(empty, self.ids, truth, notes=notes, unseen=unseen)
        return Inputs(empty, self.ids, truth, self.id_column, notes, unseen)


class _Labels:
    """A table's label column gathered block by block, as `_table` reads it whole: none when a cell
    is empty; a classification's class indices (read as numbers when every cell in the file is
    one, `_truth_classes`'s rule), none with its notice when some are not the model's classes; a
    regression's values, none when a cell is not a number."""

    def __init__(self, manifest: Manifest, header: list[str]):
        self.manifest = manifest
        self.label = manifest.label if manifest.label in header else None
        self.parts: list[Any] = []  # classification: each block's (distinct labels, inverse); regression: values
        self.numbers = True  # every label so far read as a number

    def add(self, table: Table) -> None:
        if self.label is None:
            return
        cells = table.columns[self.label]
        if missing(cells).any():
            self.label, self.parts = None, []
            return
        if self.manifest.task == "classification":
            uniques, inverse = np.unique(cells, return_inverse=True)
            if self.numbers and cells.dtype.kind != "f":
                try:
                    uniques.astype(np.float64)
                except ValueError:
                    self.numbers = False
            self.parts.append((uniques, inverse.reshape(-1).astype(np.min_scalar_type(len(uniques)))))
        elif self.numbers:
            try:
                self.parts.append(cells.astype(np.float64))
            except ValueError:
                self.numbers, self.parts = False, []

    def truth(self, where: str) -> np.ndarray | None:
        manifest = self.manifest
        if self.label is None or not self.parts:
            return None
        if manifest.task != "classification":
            return np.concatenate(self.parts) if self.numbers else None
        if not manifest.classes:
            return None
        index = {c: i for i, c in enumerate(manifest.classes)}
        unknown: set[str] = set()
        found = np.empty(sum(len(inverse) for _, inverse in self.parts), np.int64)
        at = 0
        for uniques, inverse in self.parts:
            values = uniques.astype(np.float64) if self.numbers and uniques.dtype.kind != "f" else uniques
            names = [class_name(v.item() if hasattr(v, "item") else v) for v in values]
            unknown.update(n for n in names if n not in index)
            found[at : at + len(inverse)] = np.array([index.get(n, -1) for n in names], np.int64)[inverse]
            at += len(inverse)
        if unknown:
            _tell_unknown_labels(manifest, sorted(unknown), where)
            return None
        return found


def _arrays(manifest: Manifest, x: np.ndarray, y: np.ndarray | None, where: str) -> Inputs:
    """Raw sample arrays as stored: standardised as prepare did (features, float images), raw
    uint8 images as they are, token ids as int64."""
    want = manifest.x.shape
    if list(x.shape[1:]) != want:
        x = sample_layout(x, where)
    if list(x.shape[1:]) != want:
        raise InvalidDataset(
            f"{where}: samples of shape {list(x.shape[1:])}, the model takes {want} (its dataset {manifest.name})"
        )
    norm = manifest.normalization
    if norm.applied == "stored":
        if not np.isfinite(x.astype(np.float64)).all():
            from smlt.runtime.data.arrays import non_finite

            flat = x.reshape(len(x), -1)  # an image array's values, counted along the row
            raise InvalidDataset(
                f"{where}: {non_finite(flat, rows=np.arange(len(x)))}: the model has no answer for such a row "
                "(an exported model gives it NaN outputs): fix or drop those rows and predict again"
            )
        stored = standardise(x.astype(np.float32), norm)
    elif norm.applied == "on_load":
        if x.dtype != np.uint8:
            raise InvalidDataset(f"{where}: the model takes uint8 images (0..255), got {x.dtype}")
        stored = x
    else:
        stored = _token_ids(x, manifest.vocab_size, where)
    truth = None
    if y is not None and len(y) == len(x):
        truth = _truth_classes(manifest, y, where) if manifest.task == "classification" else y.astype(np.float64)
    return Inputs(stored, [str(i) for i in range(len(x))], truth)


def _token_ids(x: np.ndarray, vocab_size: int | None, where: str) -> np.ndarray:
    """Token ids as int64, or InvalidDataset naming the first that is not a whole number in
    [0, vocab_size) (the model's embedding has no row for it)."""
    ids = x.astype(np.int64)
    bad = (ids != x) if x.dtype.kind == "f" else np.zeros(x.shape, bool)
    if vocab_size:
        bad |= (ids < 0) | (ids >= vocab_size)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        allowed = (
            f"one of the model's ids 0..{vocab_size - 1} (its vocabulary of {vocab_size})"
            if vocab_size
            else "a whole number"
        )
        raise InvalidDataset(f"{where}: row {row}, position {col}: token id {x[row, col].item()!r} is not {allowed}")
    return ids


def _images(manifest: Manifest, path: Path) -> Inputs:
    """Image files (a folder, searched recursively, or one file) at the recorded size and channels;
    a folder of class subfolders named like the model's classes gives the true labels. A folder's
    unreadable images are left out of the predictions and told (`notes`, and a notice); one
    unreadable file given alone, or a folder with no readable image, is an InvalidDataset."""
    if len(manifest.x.shape) != 3 or manifest.x.dtype != "uint8":
        raise InvalidDataset(f"{path}: the model was not trained on images (its samples are {manifest.x.shape})")
    c, h, w = manifest.x.shape
    files = (
        [path]
        if path.is_file()
        else sorted(f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in images.IMAGE_SUFFIXES)
    )
    if not files:
        raise InvalidDataset(f"{path}: no {images.IMAGE_KINDS} images here")
    x, kept, unreadable = images.read_images(files, "L" if c == 1 else "RGB", (w, h))
    notes = []
    if unreadable:
        if path.is_file():
            raise InvalidDataset(f"{path}: not a readable {images.IMAGE_KINDS} image ({unreadable[0][1]})")
        if not len(kept):
            raise InvalidDataset(
                images.unreadable_notice(path, len(files), unreadable, "no image left to predict on")
                + f"; predict on {images.IMAGE_KINDS} images Pillow reads"
            )
        from smlt.runtime.progress import notice

        notes.append(images.unreadable_notice(path, len(files), unreadable, "left out of the predictions"))
        notice.warning(notes[-1])
        files = [files[i] for i in kept]
    ids = [str(f.relative_to(path)) if path.is_dir() else f.name for f in files]
    truth = None
    if path.is_dir():
        parents = np.array([f.parent.name if f.parent != path else "" for f in files])
        truth = _truth_classes(manifest, parents, str(path))
    return Inputs(x, ids, truth, notes=notes)


def _split_rows(manifest: Manifest, read: Any, split: str, where: str) -> Inputs:
    if split not in ("train", "validation"):
        raise InvalidDataset(f"split: 'train' or 'validation', got {split!r}")
    info = manifest.train if split == "train" else manifest.validation
    xs, ys = [], []
    for shard in info.shards:
        x, y = read(shard)
        xs.append(x)
        ys.append(y)
    if not xs:
        raise InvalidDataset(f"{where}: the {split} split has no shards")
    y = np.concatenate(ys)
    return Inputs(np.concatenate(xs), [f"{split} {i}" for i in range(len(y))], y if y.ndim == 1 else y)


def _check_same_features(model: Manifest, data: Manifest, where: str) -> None:
    if (model.x, model.normalization, model.columns) != (data.x, data.normalization, data.columns):
        raise InvalidDataset(
            f"{where}: this prepared dataset stores its rows differently from the model's ({model.name}: "
            f"samples {model.x.shape} {model.x.dtype}); predict on its source files instead"
        )


def _prepared_local(model: Manifest, folder: Path, split: str) -> Inputs:
    from safetensors.numpy import load_file

    data = parse_manifest((folder / "manifest.json").read_bytes(), str(folder / "manifest.json"))
    _check_same_features(model, data, str(folder))

    def read(shard: Any) -> tuple[np.ndarray, np.ndarray]:
        arrays = load_file(folder / shard.key)
        return arrays["x"], arrays["y"]

    return _stored_truth(data, _split_rows(data, read, split, str(folder)))


def _prepared_s3(model: Manifest, uri: str, split: str) -> Inputs:
    from smlt.runtime.data.shards import load_manifest, load_shard

    data = load_manifest(uri)
    _check_same_features(model, data, uri)
    return _stored_truth(data, _split_rows(data, lambda shard: load_shard(uri, shard), split, uri))


def _stored_truth(data: Manifest, rows: Inputs) -> Inputs:
    """Stored labels in the user's terms: class indices as they are, regression targets unscaled."""
    if rows.truth is not None and data.task == "regression" and data.target is not None:
        rows.truth = rows.truth.astype(np.float64) * np.asarray(data.target.std) + np.asarray(data.target.mean)
    return rows


def card_summary(card: ModelCard) -> str:
    """One paragraph saying what the model is (for `smlt predict` / `smlt export`)."""
    what = card.model.name + (" (your code)" if not card.builtin else "")
    classes = (
        f", classes {', '.join(card.classes[:8])}{' ...' if len(card.classes) > 8 else ''}" if card.classes else ""
    )
    return f"{what}: {card.task}, input {'x'.join(map(str, card.input_shape))} {card.input_dtype}{classes}"


# --- rows in the served form (the input of the model `smlt export` writes: smlt.serving) ----------

Kind = Literal["features", "columns", "image", "token_ids", "encoded_features"]


def input_kind(manifest: Manifest) -> Kind:
    """What a served model of this dataset takes (smlt.serving's module docstring)."""
    norm = manifest.normalization
    if norm.applied == "none":
        return "token_ids"
    if manifest.columns is not None:
        return "columns" if all(t.kind == "numeric" for t in manifest.columns) else "encoded_features"
    return "image" if len(manifest.x.shape) == 3 else "features"


def serving_input(model: LoadedModel, data: Any, split: str = "validation") -> np.ndarray:
    """`data` (anything `smlt predict` takes) as the served model's input (raw=False export:
    smlt.serving)."""
    manifest = model.manifest
    kind = input_kind(manifest)
    if kind in ("features", "image") and _is_array(data):
        read_inputs(manifest, _array(data), split)  # its shape and values checked as predict checks them
        return _layout(_array(data), manifest)
    if kind == "columns" and _is_table(data):
        from smlt.runtime.data.tabular import encode_columns

        table = read_table_rows(manifest, data)
        nan_filled = [
            t.model_copy(update={"fill": math.nan if t.fill is not None else None, "indicator": False})
            for t in manifest.columns or []
        ]
        return encode_columns(nan_filled, table)
    stored = read_inputs(manifest, data, split).x
    if kind in ("features", "image") and manifest.normalization.applied == "stored":
        return _unstandardise(manifest, stored)  # a prepared dataset's rows back in the data's units
    if kind == "columns":
        return _columns_of(manifest, _unstandardise(manifest, stored))
    return stored


def value_features(manifest: Manifest) -> list[int]:
    """The stored feature index of each number column's value (its indicator follows it)."""
    at, i = [], 0
    for t in manifest.columns or []:
        at.append(i)
        i += 1 + int(t.indicator)
    return at


def _unstandardise(manifest: Manifest, stored: np.ndarray) -> np.ndarray:
    norm = manifest.normalization
    mean, std = np.asarray(norm.mean, np.float32), np.asarray(norm.std, np.float32)
    if norm.axis == "channel":
        shape = (1, len(mean)) + (1,) * (stored.ndim - 2)
        mean, std = mean.reshape(shape), std.reshape(shape)
    return (stored.astype(np.float32) * std + mean).astype(np.float32)


def _columns_of(manifest: Manifest, features: np.ndarray) -> np.ndarray:
    """Encoded number features back as one value per column, NaN where the indicator says missing."""
    at = value_features(manifest)
    x = features[:, at].copy()
    for j, t in enumerate(manifest.columns or []):
        if t.indicator:
            x[features[:, at[j] + 1] > 0.5, j] = np.nan
    return x


def _is_array(data: Any) -> bool:
    if isinstance(data, (np.ndarray, torch.Tensor)):
        return True
    return str(data).lower().endswith(".npz") and not _is_frame(data)


def _is_table(data: Any) -> bool:
    """A DataFrame or a table file (read as `smlt predict` reads it)."""
    from smlt.runtime.data.sources import TABLE_SUFFIXES
    from smlt.runtime.data.table_reader import table_suffix

    return _is_frame(data) or (isinstance(data, (str, Path)) and table_suffix(str(data)) in TABLE_SUFFIXES)


def _array(data: Any) -> np.ndarray:
    if isinstance(data, torch.Tensor):
        return data.numpy()
    if isinstance(data, np.ndarray):
        return data
    with np.load(str(data), allow_pickle=False) as z:
        if "x" not in z:
            raise InvalidDataset(f"{data}: an .npz to predict on needs an array 'x', found {list(z.keys())}")
        return np.asarray(z["x"])


def _layout(x: np.ndarray, manifest: Manifest) -> np.ndarray:
    from smlt.runtime.data.arrays import sample_layout

    if list(x.shape[1:]) != manifest.x.shape:
        x = sample_layout(x, "array")
    return np.ascontiguousarray(x, np.uint8 if manifest.normalization.applied == "on_load" else np.float32)
