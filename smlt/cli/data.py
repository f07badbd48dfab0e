"""`smlt data prepare`."""

from __future__ import annotations

import argparse
from typing import Any

from smlt.runtime.data.manifest import Manifest
from smlt.runtime.data.spool import SHARDS


def add_commands(sub: Any) -> None:
    data = sub.add_parser("data", help="dataset tools").add_subparsers(dest="data_cmd", required=True)
    prep = data.add_parser(
        "prepare",
        help="shard a CSV, Parquet, JSONL, NPZ, image folder, folder of a table's parts, sklearn:NAME or "
        "synthetic:... dataset",
        description="A CSV (.tsv, .txt: delimited text) or JSON Lines file is read as UTF-8, or as its byte-order mark "
        'says (UTF-16: Excel\'s "Unicode Text"); a file in another encoding, with no mark, is read with --encoding only.',
    )
    prep.add_argument(
        "source",
        help="a table file (.csv, .tsv, .txt, .parquet, .jsonl, .xlsx; a .csv, .tsv, .txt or .jsonl also .gz, .bz2, .xz), "
        "an .npz, a folder of one subfolder of images per class, a folder of a table's parts (two or more table files "
        "of one format, part-00000.csv, part-00001.csv, ... as Spark, Dask or `aws s3 sync` write them; _SUCCESS, .crc "
        "and dot-files aside: prepared part by part, each part its share of --shards), sklearn:NAME or "
        "synthetic:...",
    )
    prep.add_argument("--out", required=True, help="local folder or s3://bucket/prefix/")
    prep.add_argument(
        "--shards",
        type=int,
        default=SHARDS,
        help=f"train shards, at least (default {SHARDS}): a shard holds at most 64 MB, so a large source gets more "
        "(a folder of parts: shared out among the parts by their rows, each at least one)",
    )
    prep.add_argument("--validation-fraction", type=float, default=0.2)
    prep.add_argument("--seed", type=int, default=0)
    prep.add_argument("--label", help="CSV/Parquet/JSONL label column (default: label, target or y, else the last)")
    prep.add_argument("--task", choices=["classification", "regression"])
    prep.add_argument(
        "--missing",
        choices=["impute", "refuse"],
        default="impute",
        help="CSV/Parquet/JSONL empty cells (and NA, #N/A, NULL, ... in a number column): impute from the train "
        "split (with an indicator), or refuse",
    )
    prep.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="COLUMN",
        help="CSV/Parquet/JSONL: leave this column out of the features (an id, a row number); repeat for more",
    )
    prep.add_argument(
        "--date-order",
        choices=["month_first", "day_first"],
        help="CSV/Parquet/JSONL dates written 3/4/2024, 3.4.2024 or 3-4-2024 with no day above 12: read them so "
        "(default: month first with /, day first with . or -)",
    )
    prep.add_argument(
        "--encoding",
        type=encoding,
        metavar="NAME",
        help="CSV/TSV/TXT/JSONL not UTF-8 and without a byte-order mark: its encoding, e.g. cp1252 (Excel's \"CSV (Comma "
        'delimited)" on Windows), latin-1, shift_jis; without it such a file is refused (a BOM says UTF-8/16/32 itself)',
    )
    prep.add_argument("--image-size", type=_positive, help="image folders: resize every image to SIZE x SIZE")
    prep.add_argument("--channels", type=int, choices=[1, 3], help="image folders: 3 (RGB, default) or 1 (gray)")
    prep.add_argument("--vocab-size", type=_positive, help="token sequences: ids are below this (default: max id + 1)")
    prep.add_argument("--name")
    prep.add_argument(
        "--replace",
        action="store_true",
        help="--out holds an earlier dataset: remove its manifest and shards once the source is read and checked, before the first new shard (without it: refused)",
    )
    prep.add_argument(
        "--new-features",
        action="store_true",
        help="--out .../incoming/PIPELINE/VERSION/: fit new features (a new generation; its run starts cold) "
        "instead of applying the pipeline's",
    )
    prep.set_defaults(fn=prepare)


def encoding(text: str) -> str:
    """--encoding NAME: a text encoding Python's codecs know, as they name it."""
    from smlt.runtime.data.options import text_encoding

    try:
        return text_encoding(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


def prepare(args: argparse.Namespace) -> int:
    from smlt.runtime.data.options import SourceOptions
    from smlt.runtime.pipeline import prepare_version

    options = SourceOptions(
        label=args.label,
        task=args.task,
        missing=args.missing,
        drop=args.drop,
        date_order=args.date_order,
        encoding=args.encoding,
        image_size=args.image_size,
        channels=args.channels,
        vocab_size=args.vocab_size,
    )
    m, features = prepare_version(
        args.source,
        args.out,
        new_features=args.new_features,
        shards=args.shards,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        name=args.name,
        options=options,
        replace=args.replace,
    )
    print(
        f"prepared {m.name}: {m.train.rows} train rows in {len(m.train.shards)} shards, "
        f"{m.validation.rows} validation rows, {describe_samples(m)}, {m.outputs} "
        f"{'classes' if m.task == 'classification' else 'output' if m.outputs == 1 else 'outputs'} -> {args.out}"
    )
    if features:
        print(f"  {features}")
    return 0


def describe_samples(m: Manifest) -> str:
    """One sample as users read it: `1x8x8 float32`, `64 int64 tokens, vocab 1000`, `10 float32 features`."""
    shape = "x".join(str(d) for d in m.x.shape)
    if m.vocab_size is not None:
        return f"{shape} {m.x.dtype} tokens, vocab {m.vocab_size}"
    if len(m.x.shape) == 1:
        return f"{shape} {m.x.dtype} features"
    return f"{shape} {m.x.dtype}"
