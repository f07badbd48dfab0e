"""`smlt data prepare`."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(sub: Any) -> None:
    data = sub.add_parser("data", help="dataset tools").add_subparsers(dest="data_cmd", required=True)
    prep = data.add_parser("prepare", help="shard a CSV, NPZ, sklearn:NAME or synthetic:... dataset")
    prep.add_argument("source")
    prep.add_argument("--out", required=True, help="local folder or s3://bucket/prefix/")
    prep.add_argument("--shards", type=int, default=16)
    prep.add_argument("--validation-fraction", type=float, default=0.2)
    prep.add_argument("--seed", type=int, default=0)
    prep.add_argument("--label", help="CSV label column (default: the last)")
    prep.add_argument("--task", choices=["classification", "regression"])
    prep.add_argument("--name")
    prep.set_defaults(fn=prepare)


def prepare(args: argparse.Namespace) -> int:
    from smlt.data.prepare import prepare_dataset

    m = prepare_dataset(
        args.source,
        args.out,
        shards=args.shards,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        label=args.label,
        task=args.task,
        name=args.name,
    )
    print(
        f"prepared {m.name}: {m.train.rows} train rows in {len(m.train.shards)} shards, "
        f"{m.validation.rows} validation rows, {m.features} features, {m.outputs} "
        f"{'classes' if m.task == 'classification' else 'outputs'} -> {args.out}"
    )
    return 0
