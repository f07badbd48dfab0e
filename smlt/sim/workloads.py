"""Simulated workloads: the ground truth a simulated run follows (the planner never sees it).

Two workloads are fitted to curves measured here (smlt/sim/calibration.json, produced by
bench/planner_calibrate.py): `mlp-10k` (digits) and `mlp-1m` (the synthetic 20k-row set's
curve shape with a 1M-parameter MLP's cost). The convolutional ones keep the measured curve
family and extrapolate its parameters to CIFAR-sized training (more epochs, larger critical
batch, per McCandlish et al. 2018), with compute from their FLOPs and the measured FLOP rate.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

CALIBRATION = json.loads((Path(__file__).with_name("calibration.json")).read_text())
FIT = CALIBRATION["fit"]
# calibration "steps": FLOP rate of one thread of this machine; a Lambda vCPU is slower.
MEASURED_FLOPS = CALIBRATION["steps"]["flops_per_s_1thread"]
MEASURED_STEP_OVERHEAD = CALIBRATION["steps"]["overhead_s"]


@dataclass(frozen=True)
class Workload:
    name: str
    params: int
    flops_per_sample: float  # training FLOPs per sample
    sample_bytes: int
    train_rows: int
    val_rows: int
    # compute truth
    efficiency: float  # parallel efficiency of vCPUs beyond the first
    cpu_factor: float  # Lambda vCPU speed relative to this machine's measured thread
    mem_needed_mb: float  # below this tier the worker runs out of memory
    # progress truth (smlt.planner.progress forms, fitted or extrapolated)
    acc0: float
    acc_max: float
    tau_acc: float  # in steady steps of batch 32
    p_acc: float
    loss0: float
    loss_min: float
    tau_loss: float
    p_loss: float
    beta: float
    drift_k: float
    momentum_effective: float
    target: float  # default accuracy target for scenarios
    batch: int = 32

    @property
    def model_mb(self) -> float:
        return self.params * 4 / 1e6

    @property
    def dataset_bytes(self) -> int:
        return self.train_rows * self.sample_bytes

    def scaled(self, rows_factor: float) -> Workload:
        """A dataset rows_factor times larger: more steps to converge (tau ~ rows^0.5),
        fewer epochs; validation grows too (capped)."""
        f = rows_factor
        return replace(
            self,
            name=f"{self.name}-x{f:g}",
            train_rows=int(self.train_rows * f),
            val_rows=min(int(self.val_rows * f), 20000),
            tau_acc=self.tau_acc * f**0.5,
            tau_loss=self.tau_loss * f**0.5,
        )


def _fitted(name: str, fit: dict, **kw) -> Workload:
    return Workload(
        name=name,
        train_rows=fit["train_rows"],
        val_rows=fit["val_rows"],
        acc0=fit["acc0"],
        acc_max=fit["acc_max"],
        tau_acc=fit["tau_acc"],
        p_acc=fit["p_acc"],
        loss0=fit["loss0"],
        loss_min=fit["loss_min"],
        tau_loss=fit["tau_loss"],
        p_loss=fit["p_loss"],
        beta=fit["beta"],
        drift_k=fit["drift_k"],
        momentum_effective=fit["momentum_effective"],
        **kw,
    )


def _mem(params: int, activations_mb: float) -> float:
    return 420.0 + 20.0 * params / 2**20 + activations_mb


WORKLOADS: dict[str, Workload] = {
    # digits: 64 -> 128 -> 10 MLP, exactly what was measured
    "mlp-10k": _fitted(
        "mlp-10k",
        FIT["digits"],
        params=9738,
        flops_per_sample=6 * 9738,
        sample_bytes=64 * 4 + 8,
        efficiency=0.0,
        cpu_factor=0.75,
        mem_needed_mb=_mem(9738, 5),
        target=0.90,
    ),
    # the synthetic set's measured curve, a 1M-parameter MLP's cost, 40 features
    "mlp-1m": _fitted(
        "mlp-1m",
        FIT["synthetic20k"],
        params=1_050_000,
        flops_per_sample=6 * 1_050_000,
        sample_bytes=40 * 4 + 8,
        efficiency=0.12,
        cpu_factor=0.8,
        mem_needed_mb=_mem(1_050_000, 20),
        target=0.80,
    ),
    # CIFAR-sized CNN: 5M params, 0.9 GFLOP per training sample (3 x forward)
    "cnn-5m": Workload(
        name="cnn-5m",
        params=5_000_000,
        flops_per_sample=0.9e9,
        sample_bytes=3072 + 8,
        train_rows=50_000,
        val_rows=10_000,
        efficiency=0.7,
        cpu_factor=0.7,
        mem_needed_mb=_mem(5_000_000, 400),
        acc0=0.1,
        acc_max=0.90,
        tau_acc=3.0 * 50_000 / 32,
        p_acc=0.6,
        loss0=2.30,
        loss_min=0.35,
        tau_loss=3.0 * 50_000 / 32,
        p_loss=0.6,
        beta=8.0,
        drift_k=500.0,
        momentum_effective=0.80,
        target=0.80,
    ),
    # ResNet-50-sized: 25.6M params, CIFAR resolution, 3.9 GFLOP per training sample
    "resnet50-25m": Workload(
        name="resnet50-25m",
        params=25_600_000,
        flops_per_sample=3.9e9,
        sample_bytes=3072 + 8,
        train_rows=50_000,
        val_rows=10_000,
        efficiency=0.8,
        cpu_factor=0.7,
        mem_needed_mb=_mem(25_600_000, 900),
        acc0=0.1,
        acc_max=0.93,
        tau_acc=4.0 * 50_000 / 32,
        p_acc=0.6,
        loss0=2.30,
        loss_min=0.25,
        tau_loss=4.0 * 50_000 / 32,
        p_loss=0.6,
        beta=20.0,
        drift_k=300.0,
        momentum_effective=0.80,
        target=0.85,
    ),
}


def tau_target(w: Workload, metric: str = "val_accuracy", target: float | None = None) -> float:
    from smlt.planner.progress import tau_to_reach

    if metric == "val_accuracy":
        return tau_to_reach(w.target if target is None else target, w.acc0, w.acc_max, w.tau_acc, w.p_acc)
    if target is None:
        raise ValueError("a val_loss target needs its value")
    return tau_to_reach(target, w.loss0, w.loss_min, w.tau_loss, w.p_loss)


def describe(w: Workload) -> str:
    return (
        f"{w.name}: {w.params / 1e6:.2f}M params, {w.flops_per_sample / 1e9:.3g} GFLOP/sample, "
        f"{w.train_rows:,} rows, target acc {w.target} at tau {tau_target(w):.0f} "
        f"({tau_target(w) * w.batch / w.train_rows:.1f} epochs of sequential steps), beta {w.beta:g}"
    )


if __name__ == "__main__":
    for w in WORKLOADS.values():
        print(describe(w))
        print("  ", describe(w.scaled(4)), math.isfinite(tau_target(w)))
