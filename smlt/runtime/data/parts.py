"""A table uploaded as many files of the same columns (`part-00000.csv`, `part-00001.csv`, ...),
prepared part by part in three passes, each part's split seeded by the seed and the part's index:

1. statistics: each part's pass 1 (`prepare.fit_part`), merged in the parts' order
   (`TableFit.merge`) into the statistics of the whole table, which fix its transforms
   (`prepare.TableTransforms`);
2. moments: each part encoded with them (`prepare.part_moments`): the standardisation's moments
   and the imputed medians' second pass, merged (`Moments.merge`, `Median.merge_again`) and
   settled (`TableTransforms.settle`);
3. shards: each part encoded, standardised and written as its own shards (`prepare.part_shards`:
   named by the part, shuffled within); the manifest, written last, lists them all. The table
   gets the shards one file of it would (`--shards`, 16, train shards at least, half as many
   for validation), shared out among its parts: a part's share is ceil(shards x its rows / the
   table's rows) in each split, at least one, more when a shard would pass 64 MB
   (`spool.part_share`); it depends on the part's and the table's rows alone, so the same parts
   and seed give the same shards, and a Distributed Map's child computes it on its own.

Each pass over one part is what one child of a Distributed Map computes; `prepare.prepare_parts`
runs them one after another: a machine's `smlt data prepare` of a folder of parts (and a job's
`dataset.uri` naming one: `prepare.prepare_dataset`), and the tests' reference. This module holds
what joins the parts' passes (their statistics, moments and shards), for both."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from smlt.runtime.data.manifest import (
    ArraySpec,
    ColumnTransform,
    FeatureSpec,
    Manifest,
    Normalization,
    ShardInfo,
    SplitInfo,
    dataset_warnings,
)
from smlt.runtime.data.spool import add_counts
from smlt.runtime.data.stats import Moments
from smlt.runtime.data.table_fit import Labels, TableFit
from smlt.runtime.errors import InvalidDataset


@dataclass(frozen=True)
class PartRows:
    """A part's rows in each split (from its pass 1): what its pass 3 must find again."""

    train: int
    validation: int


def merge_fits(fits: Sequence[TableFit], source: str | None = None) -> TableFit:
    """The parts' pass 1 merged in their order (the first part's fit, with the others added),
    named `source` (the parts' folder the user gave; default: `described`): what it tells about
    the whole table (a column that gives the label away, NA markers, a label's classes) names the
    table, not its first part."""
    if not fits:
        raise InvalidDataset("a table in parts needs at least one part")
    whole, *rest = fits
    first = whole.path
    for fit in rest:
        whole.merge(fit)
    whole.path = whole.labels.path = source or described([first, *(f.path for f in rest)])
    return whole


def merge_moments(moments: Sequence[tuple[Moments, Moments]]) -> tuple[Moments, Moments]:
    train, validation = moments[0]
    for t, v in moments[1:]:
        train.merge(t)
        validation.merge(v)
    return train, validation


def settle(fit: TableFit, source: str) -> TableFit:
    """The refusals about the whole table, after the merge: too few rows with a label, its first
    bad number (in the parts' order, with the count) and a table with no train rows."""
    fit.refuse_unlabelled()
    fit.refuse_non_finite()
    if not fit.train_rows:
        raise InvalidDataset(f"{source}: {fit.rows} rows leave none for training after the validation split")
    return fit


def described(paths: Sequence[str]) -> str:
    return paths[0] if len(paths) == 1 else f"{paths[0]} and {len(paths) - 1} more parts"


class Transforms(Protocol):
    """What part_manifest reads of the table's transforms (prepare.TableTransforms)."""

    labels: Labels
    columns: list[ColumnTransform]
    names: list[str]


def part_manifest(
    fit: TableFit,
    t: Transforms,
    norm: Normalization,
    splits: Sequence[tuple[SplitInfo, SplitInfo]],
    *,
    name: str,
    source: str,
    features: FeatureSpec | None,
    generation: int | None = None,
) -> Manifest:
    """The manifest of a table prepared in parts: every part's shards, in the parts' order."""
    labels = t.labels

    def joined(i: int) -> SplitInfo:
        shards: list[ShardInfo] = [s for split in splits for s in split[i].shards]
        counts = [np.asarray(split[i].class_counts) for split in splits if split[i].class_counts is not None]
        total = functools.reduce(add_counts, counts) if counts else None
        return SplitInfo(
            rows=sum(split[i].rows for split in splits),
            shards=shards,
            class_counts=None if total is None else [int(c) for c in total],
        )

    manifest = Manifest(
        name=name,
        source=source,
        task=labels.task,
        x=features.x if features is not None else ArraySpec(shape=[len(t.names)], dtype="float32"),
        y=labels.y,
        outputs=labels.outputs,
        classes=labels.classes,
        train=joined(0),
        validation=joined(1),
        normalization=norm,
        target=labels.target,
        columns=t.columns,
        label=fit.labels.name,
        vocab_size=None,
        generation=features.generation if features is not None else generation,
    )
    for said in dataset_warnings(manifest):
        from smlt.runtime.progress import notice

        notice.warning(said)
    return manifest
