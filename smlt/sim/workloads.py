"""Simulated workloads: the model zoo as recorded here (bench/record_curves.py): the four the
planner was tuned on (smlt/sim/curves/, `WORKLOADS`) or any folder of curve files (`load_workloads`).

Each workload is one recording, and everything it needs is in its file (smlt.sim.curves.Recording):
its curves, its model family and accuracy target, the parameters and training FLOPs per sample
that smlt's workers measure (smlt.runtime.train.measure), the step time per sample measured on one
thread of this machine, the dataset's rows and bytes. `scaled(f)` is the same model on a
dataset f times larger, needing f times the samples (the same epochs) and f times the bytes.
The planner never sees any of this but what the deployed system records.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from smlt.runtime.capacity import memory_needed_mb, shard_bytes_held
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.sources import load_source
from smlt.runtime.job import ModelSpec
from smlt.sim.curves import CURVES, Curves, load_folder

SHARDS = 16  # the CLI's default shards per dataset; a worker holds ~3 shards' bytes at once


@dataclass(frozen=True)
class Workload:
    name: str
    data: dict[str, Any] = field(repr=False)
    scale: float = 1.0

    @property
    def family(self) -> str:
        """The model family (smlt/sim/world.py's EFFICIENCY: its multi-thread speed-up)."""
        return str(self.data["family"])

    @cached_property
    def curves(self) -> Curves:
        return Curves(self.data, self.scale)

    @property
    def model(self) -> ModelSpec:
        """The recorded job's model (what a job of this workload names)."""
        return ModelSpec.model_validate(self.data["model"])

    @cached_property
    def sample_shape(self) -> tuple[tuple[int, ...], int, int | None]:
        """(sample shape, outputs, vocab size) of the recorded dataset, as its manifest says (the
        recording's own fields; else read off its source)."""
        d = self.data
        if d.get("sample_shape") and d.get("outputs"):
            return tuple(int(x) for x in d["sample_shape"]), int(d["outputs"]), d.get("vocab_size")
        src = load_source(self.data["source"], SourceOptions())
        assert src.x is not None, "the recordings' sources are arrays"
        return tuple(int(d) for d in src.x.shape[1:]), int(len(np.unique(src.y))), src.vocab_size

    @property
    def params(self) -> int:
        return int(self.data["params"])

    @property
    def flops_per_sample(self) -> float:
        return float(self.data["flops_per_sample"])

    @property
    def batch(self) -> int:
        return int(self.data["batch"])

    @property
    def train_rows(self) -> int:
        return int(self.data["train_rows"] * self.scale)

    @property
    def val_rows(self) -> int:
        return int(self.data["val_rows"])

    @property
    def sample_bytes(self) -> int:
        return int(self.data["sample_bytes"])

    @property
    def dataset_bytes(self) -> int:
        return self.train_rows * self.sample_bytes

    @property
    def model_mb(self) -> float:
        return self.params * 4 / 1e6

    @property
    def step_s_per_sample(self) -> float:
        """Training CPU seconds per sample on one thread of this machine (the recording's own
        measurement; else the median of its runs')."""
        if "step_s_per_sample" in self.data:
            return float(self.data["step_s_per_sample"])
        return float(statistics.median(r["step_s_per_sample"] for r in self.data["runs"]))

    @property
    def mem_needed_mb(self) -> float:
        """What the worker's own check asks (smlt.runtime.capacity.memory_needed_mb): the
        parameters, the shards it holds, a batch's activations, the runtime."""
        acts = float(self.data.get("activation_bytes_per_sample", 0.0)) * self.batch / 2**20
        return memory_needed_mb(
            self.params, data_bytes=shard_bytes_held(self.dataset_bytes / SHARDS), activation_mb=acts
        )

    @property
    def target(self) -> float:
        """The scenarios' accuracy target (val_accuracy), as the recording says."""
        return float(self.data["target"])

    def scaled(self, factor: float) -> Workload:
        return replace(self, name=f"{self.name}-x{factor:g}", scale=self.scale * factor)

    def fits(self, memory_mb: float) -> bool:
        return memory_mb >= self.mem_needed_mb

    def smallest_tier(self, tiers: list[int]) -> int:
        return next((t for t in sorted(tiers) if self.fits(t)), max(tiers))


def load_workloads(folder: Path = CURVES) -> dict[str, Workload]:
    """Every recording in a folder of curve files as a workload, by name (a CurveDataError naming
    the file and the field when one lacks something)."""
    return {name: Workload(name, data) for name, data in load_folder(folder).items()}


WORKLOADS: dict[str, Workload] = load_workloads()  # the four the planner's constants were tuned on


def describe(w: Workload) -> str:
    s = w.curves.samples_to(w.target, 4, 20)
    return (
        f"{w.name}: {w.params / 1e6:.2f}M params, {w.flops_per_sample / 1e9:.3g} GFLOP/sample, "
        f"{w.step_s_per_sample * 1e3:.3g} ms/sample, {w.train_rows:,} rows, needs {w.mem_needed_mb:,.0f} MB, "
        f"target {w.target} in {s:,.0f} samples at 4 x 20 ({s / w.train_rows:.1f} epochs)"
    )


if __name__ == "__main__":
    for w in WORKLOADS.values():
        print(describe(w))
        print("  ", describe(w.scaled(8)), np.isfinite(w.curves.samples_to(w.target, 64, 200)))
