"""The local bench's jobs and their datasets.

The jobs are files in examples/ (bench-digits.json, bench-synthetic.json, bench-overhead.json), so
`smlt run --local examples/bench-digits.json` runs what the bench measures. Their dataset URI is
the source (`sklearn:...`, `synthetic:...`); the bench prepares it once into its cache with its own
split (`Split`), shares the folder between smlt and the baselines, and points the job at it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CACHE = Path(os.environ.get("SMLT_BENCH_CACHE", "/tmp/smlt-bench"))


@dataclass(frozen=True)
class Split:
    """How the bench shards a dataset. `smlt run --local` prepares a source with the CLI's
    defaults (16 shards, 20 % validation); `smlt data prepare --shards --validation-fraction`
    gives the bench's split."""

    shards: int = 16
    validation_fraction: float = 0.2


def example_job(file: str) -> dict[str, Any]:
    """examples/FILE as written (what `smlt run --local` reads), checked against the Job model."""
    from smlt.runtime.job import parse_job

    raw: dict[str, Any] = json.loads((EXAMPLES / file).read_text())
    parse_job(raw)  # raises InvalidJob naming the field
    return raw


def prepare(key: str, source: str, split: Split) -> Path:
    """The cache folder holding `source` prepared with `split` (prepared on first use)."""
    from smlt.runtime.data.prepare import prepare_dataset

    folder = CACHE / "datasets" / re.sub(r"[^A-Za-z0-9]+", "-", f"{key}-{source}-{split.validation_fraction}")
    if not (folder / "manifest.json").exists():
        tmp = folder.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        prepare_dataset(source, str(tmp), shards=split.shards, validation_fraction=split.validation_fraction)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    return folder
