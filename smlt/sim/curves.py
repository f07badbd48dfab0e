"""The simulator's learning curves: replayed from runs recorded here (bench/record_curves.py,
data in smlt/sim/curves/ for the four the planner was tuned on, bench/curves/held-out/ and
bench/curves/held-out-2/ (the fresh set) for the held-out ones), never from the planner's progress model. A curve file carries what its workload
needs beside the curves (`Recording`: family, target, rows, bytes, FLOPs, step time).

A recording holds, per (workers n, local steps k) of a small grid, the validation loss and
accuracy of the global model after every round of local SGD, against the samples trained.
How a setting between (or beyond) the recorded ones is replayed:

- Each recorded run's accuracy is made monotone (its running best: the global model the planner
  would keep), and read as "samples needed to reach accuracy a", S_g(a), linear between points.
- For (n, k), log S(a) is interpolated bilinearly in (log n, log k) between the four recorded
  settings around it; beyond the grid it is extended along the last recorded segment, its slope
  held to [0, 1] (more workers or steps never need fewer samples, nor more than proportionally).
  A run that ended on a plateau stays there (a level it never reached is not reached near it); a
  run the recording cut short while it was still learning is continued along the nearest run
  that went further, parallel in log samples from the last level both reached.
- The world's state is the global model's accuracy. A round of S_r samples at (n, k) moves it
  from a to A(S(a) + S_r) on (n, k)'s curve, so a run that changes its plan mid-way continues from
  where it stands. Loss is read off the accuracy (all recorded (accuracy, loss) points pooled).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from smlt.runtime.validation import field_errors
from smlt.sim.world import EFFICIENCY

CURVES = Path(__file__).with_name("curves")  # the four the planner's constants were tuned on
LEVELS = 80  # accuracy levels the interpolation works on
RECORD = "bench/record_curves.py"


class CurveDataError(ValueError):
    """A curve file is missing or malformed."""


class Run(BaseModel):
    """One recorded setting: its curve's points are [round, samples, val_loss, val_accuracy]."""

    workers: PositiveInt
    local_steps: PositiveInt
    curve: list[Annotated[list[float], Field(min_length=4, max_length=4)]] = Field(min_length=1)
    step_s_per_sample: PositiveFloat | None = None


class Recording(BaseModel):
    """What a curve file must carry for the simulator to replay it as a workload (the fields
    bench/record_curves.py writes; others are kept as recorded)."""

    model_config = ConfigDict(extra="allow")

    name: str
    family: str  # one of smlt/sim/world.py's EFFICIENCY: the world's multi-thread speed-up
    target: float = Field(gt=0.0, le=1.0)  # the scenarios' val_accuracy target
    model: dict[str, Any]  # the recorded job's model (a ModelSpec)
    source: str  # the dataset source (its sample shape, when the file does not say it)
    batch: PositiveInt
    train_rows: PositiveInt
    val_rows: PositiveInt
    sample_bytes: PositiveInt
    params: PositiveInt
    flops_per_sample: PositiveFloat
    activation_bytes_per_sample: NonNegativeFloat = 0.0
    step_s_per_sample: PositiveFloat | None = None
    sample_shape: list[PositiveInt] | None = None
    outputs: PositiveInt | None = None
    vocab_size: PositiveInt | None = None
    runs: list[Run] = Field(min_length=1)

    @field_validator("family")
    @classmethod
    def _known_family(cls, v: str) -> str:
        if v not in EFFICIENCY:
            raise ValueError(f"unknown family {v!r}: use one of {', '.join(EFFICIENCY)}")
        return v

    @model_validator(mode="after")
    def _complete(self) -> Recording:
        if self.step_s_per_sample is None and any(r.step_s_per_sample is None for r in self.runs):
            raise ValueError("field 'step_s_per_sample': give it for the recording or for every run")
        have = {(r.workers, r.local_steps) for r in self.runs}
        grid = {(n, k) for n in {r.workers for r in self.runs} for k in {r.local_steps for r in self.runs}}
        if have != grid:
            missing = ", ".join(f"{n} x {k}" for n, k in sorted(grid - have))
            raise ValueError(f"field 'runs': the grid of (workers, local steps) is not full: none at {missing}")
        return self


def read(path: Path) -> dict[str, Any]:
    """A curve file's recording, checked: a CurveDataError naming the file and the field otherwise."""
    if not path.is_file():
        raise CurveDataError(f"{path}: no such curve file (record one with {RECORD} --out {path.parent})")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CurveDataError(f"{path}: not JSON ({e}); re-record it with {RECORD}") from None
    if not isinstance(data, dict):
        raise CurveDataError(f"{path}: a curve file holds one JSON object (bench/record_curves.py's format)")
    try:
        rec = Recording.model_validate(data)
    except ValidationError as e:
        err = field_errors(e)[0]
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise CurveDataError(
            f"{path}: {f'field {err.path!r}: ' if err.path else ''}{err.message}{more}; "
            f"fix it or re-record the file with {RECORD}"
        ) from None
    if rec.name != path.stem:
        raise CurveDataError(f"{path}: field 'name' is {rec.name!r}: it must be the file's name, {path.stem!r}")
    return data


def load(name: str, folder: Path = CURVES) -> dict[str, Any]:
    return read(folder / f"{name}.json")


def load_folder(folder: Path) -> dict[str, dict[str, Any]]:
    """Every recording in a folder of curve files (NAME.json), by name."""
    if not folder.is_dir():
        raise CurveDataError(f"{folder}: no such folder of curve files")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise CurveDataError(f"{folder}: no curve files (NAME.json, written by {RECORD} --out {folder})")
    return {f.stem: read(f) for f in files}


def _samples_to_reach(curve: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """log samples at which the run's running-best accuracy first reaches each level (inf: never)."""
    s, acc = curve[:, 1], np.maximum.accumulate(curve[:, 3])
    out = np.full(len(levels), np.inf)
    for j, a in enumerate(levels):
        hit = int(np.argmax(acc >= a)) if acc[-1] >= a else -1
        if hit < 0:
            continue
        if hit == 0:
            out[j] = 0.0
            continue
        a0, a1 = acc[hit - 1], acc[hit]
        x = s[hit - 1] + (s[hit] - s[hit - 1]) * ((a - a0) / (a1 - a0) if a1 > a0 else 1.0)
        out[j] = math.log1p(x)
    return out


def _still_rising(curve: np.ndarray) -> bool:
    """Whether a run ended while still learning (its recording cut it short) rather than on a
    plateau: a plateau is at least 6 evaluations whose second half gained under 1 point."""
    acc = np.maximum.accumulate(curve[:, 3])
    return len(acc) < 6 or bool(acc[-1] - acc[len(acc) // 2] >= 0.01)


def _continue_truncated(table: np.ndarray, rising: np.ndarray) -> np.ndarray:
    """Continue each run its recording cut short along the nearest run that went further,
    keeping their ratio of samples at the last level both reached (parallel in log samples)."""
    out = table.copy()
    cells = [(i, j) for i in range(table.shape[0]) for j in range(table.shape[1])]
    for i, j in cells:
        last = int(np.isfinite(table[i, j]).sum()) - 1
        if not rising[i, j] or last + 1 == table.shape[2]:
            continue
        donors = [c for c in cells if np.isfinite(table[c][last + 1 :]).any()]
        if not donors:
            continue
        d = min(donors, key=lambda c: (abs(c[0] - i) + abs(c[1] - j), -np.isfinite(table[c]).sum()))
        shift = table[i, j, last] - table[d][last]
        out[i, j, last + 1 :] = table[d][last + 1 :] + shift
    return out


def _axis_weights(grid: np.ndarray, x: float) -> tuple[int, int, float]:
    """Neighbours (i, i+1) on a sorted log grid and the weight of i+1 (outside: beyond [0, 1])."""
    if len(grid) == 1:
        return 0, 0, 0.0
    i = int(np.clip(np.searchsorted(grid, x) - 1, 0, len(grid) - 2))
    return i, i + 1, float((x - grid[i]) / (grid[i + 1] - grid[i]))


@dataclass(frozen=True)
class Curves:
    """A workload's recorded curves and the replay of any (n, k) from them."""

    data: dict[str, Any]
    samples_scale: float = 1.0  # a dataset f times larger needs f times the samples (same epochs)

    @cached_property
    def _grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        runs = self.data["runs"]
        ns = np.array(sorted({r["workers"] for r in runs}), float)
        ks = np.array(sorted({r["local_steps"] for r in runs}), float)
        first = np.array([np.array(r["curve"], float)[0, 3] for r in runs])
        best = np.array([np.array(r["curve"], float)[:, 3].max() for r in runs])
        levels = np.linspace(float(first.max()), float(best.max()), LEVELS)
        table = np.full((len(ns), len(ks), LEVELS), np.inf)
        rising = np.zeros((len(ns), len(ks)), bool)
        for r in runs:
            i, j = int(np.searchsorted(ns, r["workers"])), int(np.searchsorted(ks, r["local_steps"]))
            curve = np.array(r["curve"], float)
            table[i, j] = _samples_to_reach(curve, levels)
            rising[i, j] = _still_rising(curve)
        if np.isinf(table[..., 0]).any():
            raise CurveDataError(f"curves of {self.data.get('name')!r}: the grid of (workers, local steps) is not full")
        return np.log(ns), np.log(ks), levels, _continue_truncated(table, rising)

    @cached_property
    def _loss_of_acc(self) -> tuple[np.ndarray, np.ndarray]:
        pts = np.concatenate([np.array(r["curve"], float)[:, 2:4] for r in self.data["runs"]])
        order = np.argsort(pts[:, 1])
        acc, loss = pts[order, 1], pts[order, 0]
        bins = np.array_split(np.arange(len(acc)), max(1, min(40, len(acc) // 5)))
        xa = np.array([acc[b].mean() for b in bins])
        yl = np.minimum.accumulate(np.array([np.median(loss[b]) for b in bins]))  # falls as accuracy rises
        return xa, yl

    @property
    def acc0(self) -> float:
        return float(self._grid[2][0])

    @property
    def acc_best(self) -> float:
        return float(self._grid[2][-1])

    def log_samples(self, n: float, k: float) -> np.ndarray:
        """log(1 + samples) to reach each level at (n, k), inf where it is never reached."""
        gn, gk, _, table = self._grid
        i0, i1, wn = _axis_weights(gn, math.log(max(n, 1.0)))
        j0, j1, wk = _axis_weights(gk, math.log(max(k, 1.0)))

        def along_k(i: int) -> np.ndarray:
            return _blend(table[i, j0], table[i, j1], wk, gk[j1] - gk[j0])

        return _blend(along_k(i0), along_k(i1), wn, gn[i1] - gn[i0]) + math.log(self.samples_scale)

    def levels(self) -> np.ndarray:
        return self._grid[2]

    def advance(self, acc: float, n: float, k: float, samples: float) -> float:
        """The accuracy after `samples` more at (n, k) from accuracy `acc`."""
        ls = self.log_samples(n, k)
        lv = self._grid[2]
        ok = np.isfinite(ls)
        if samples <= 0 or not ok.any():
            return acc
        ls, lv = np.maximum.accumulate(ls[ok]), lv[ok]
        s0 = float(np.exp(np.interp(acc, lv, ls))) if acc > lv[0] else float(np.exp(ls[0]))
        s1 = math.log(s0 + samples)
        return max(acc, float(np.interp(s1, ls, lv)))  # beyond its last level: the plateau

    def samples_to(self, target: float, n: float, k: float, acc: float | None = None) -> float:
        """Samples from accuracy `acc` (default: the start) to `target` at (n, k); inf if never."""
        ls = self.log_samples(n, k)
        lv = self._grid[2]
        ok = np.isfinite(ls)
        if not ok.any() or target > lv[ok][-1]:
            return math.inf
        ls, lv = np.maximum.accumulate(ls[ok]), lv[ok]
        s = float(np.exp(np.interp(target, lv, ls)))
        s0 = 1.0 if acc is None or acc <= lv[0] else float(np.exp(np.interp(acc, lv, ls)))
        return max(0.0, s - s0)

    def loss(self, acc: float) -> float:
        xa, yl = self._loss_of_acc
        return float(np.interp(acc, xa, yl))


def _blend(a: np.ndarray, b: np.ndarray, w: float, span: float) -> np.ndarray:
    """Linear in the log grid between a (w=0) and b (w=1); beyond, along the segment, its slope per
    unit of log n (or log k) held to [0, 1]; inf when either side is inf."""
    if span <= 0:
        return a.copy()
    if w in (0.0, 1.0):
        return (a if w == 0.0 else b).copy()
    both = np.isfinite(a) & np.isfinite(b)
    if 0.0 < w < 1.0:
        with np.errstate(invalid="ignore"):
            return np.where(both, a + w * (b - a), np.inf)
    with np.errstate(invalid="ignore"):
        slope = np.clip((b - a) / span, 0.0, 1.0)
        out = np.where(w > 1.0, b + slope * (w - 1.0) * span, a + slope * w * span)
    return np.where(both, out, np.inf)
