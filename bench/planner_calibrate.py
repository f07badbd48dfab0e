"""Measure the curves and step times the planner simulator is calibrated from.

Run:  .venv/bin/python bench/planner_calibrate.py   (about 2-3 minutes on 2 cores;
      --fit-only refits the stored measurements; --smoke: a tiny grid and one seed, printed, not written)

Writes smlt/sim/calibration.json with
  - `curves`: validation accuracy/loss per round of local SGD (the same semantics as smlt's workers:
    every worker starts each round from the global model with a fresh SGD-momentum optimizer,
    takes k steps of batch 32 on its own shard, deltas are averaged) for a grid of (n, k), on
    scikit-learn's digits (1,437 train / 360 val rows) and on a harder synthetic 10-class set
    (make_classification, 16,000 / 4,000 rows), 3 seeds each (the mean curve is stored);
  - `fit`: the progress model fitted to those curves (see smlt/sim/progress.py for the form);
  - `progress_check`: the planner's progress model forecasting these curves (coverage of its
    10-90 % interval, median forecast / truth);
  - `steps`: measured seconds per training step (batch 32, 1 and 2 threads) for models from 10k
    to 4M parameters, from which the simulator's per-step overhead and FLOP rate come.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import least_squares
from sklearn.datasets import load_digits, make_classification

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402
from smlt.runtime.planner.progress import round_progress, saturation  # noqa: E402

OUT = ROOT / "smlt" / "sim" / "calibration.json"
BATCH = 32
LR = 0.05
MOMENTUM = 0.9
HIDDEN = 128
SEEDS = (0, 1, 2)
GRID_N = (1, 2, 4, 8, 16)
GRID_K = (1, 2, 5, 10, 20, 50)


def datasets():
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(X))
    yield "digits", X[idx[:1437]], y[idx[:1437]], X[idx[1437:]], y[idx[1437:]], 10
    X, y = make_classification(
        n_samples=20000,
        n_features=40,
        n_informative=24,
        n_redundant=8,
        n_classes=10,
        n_clusters_per_class=2,
        class_sep=1.2,
        flip_y=0.03,
        random_state=0,
    )
    X = ((X - X.mean(0)) / X.std(0)).astype(np.float32)
    yield "synthetic20k", X[:16000], y[:16000], X[16000:], y[16000:], 10


class LocalSGD:
    """n workers' MLPs as batched tensors, so n workers cost about as much as one."""

    def __init__(self, Xt, yt, Xv, yv, classes):
        self.Xt, self.yt = torch.tensor(Xt), torch.tensor(yt, dtype=torch.long)
        self.Xv, self.yv = torch.tensor(Xv), torch.tensor(yv, dtype=torch.long)
        self.d, self.c = Xt.shape[1], classes

    def init(self, seed):
        g = torch.Generator().manual_seed(seed)
        return [
            torch.randn(self.d, HIDDEN, generator=g) / math.sqrt(self.d),
            torch.zeros(HIDDEN),
            torch.randn(HIDDEN, self.c, generator=g) / math.sqrt(HIDDEN),
            torch.zeros(self.c),
        ]

    @staticmethod
    def fwd(p, x):
        W1, b1, W2, b2 = p
        h = torch.relu(torch.bmm(x, W1) + b1[:, None, :])
        return torch.bmm(h, W2) + b2[:, None, :]

    def evaluate(self, p):
        with torch.no_grad():
            out = self.fwd([q[None] for q in p], self.Xv[None])[0]
            acc = (out.argmax(1) == self.yv).float().mean().item()
            loss = torch.nn.functional.cross_entropy(out, self.yv).item()
        return acc, loss

    def run(self, n, k, rounds, seed):
        g = np.random.default_rng(seed)
        p = self.init(seed)
        shards = np.array_split(g.permutation(len(self.Xt)), n)
        orders = [g.permutation(s) for s in shards]
        ptr = [0] * n
        acc, loss = [], []
        for _ in range(rounds):
            a, lo = self.evaluate(p)
            acc.append(a)
            loss.append(lo)
            lp = [q[None].repeat(n, *([1] * q.dim())).clone().requires_grad_(True) for q in p]
            buf = [torch.zeros_like(q) for q in lp]  # fresh optimizer every round (stateless worker)
            for _ in range(k):
                rows = []
                for w in range(n):
                    if ptr[w] + BATCH > len(orders[w]):
                        orders[w], ptr[w] = g.permutation(shards[w]), 0
                    rows.append(orders[w][ptr[w] : ptr[w] + BATCH])
                    ptr[w] += BATCH
                rows = np.stack(rows)
                out = self.fwd(lp, self.Xt[rows])
                lossv = torch.nn.functional.cross_entropy(out.reshape(-1, self.c), self.yt[rows].reshape(-1)) * n
                grads = torch.autograd.grad(lossv, lp)
                with torch.no_grad():
                    for q, gq, bq in zip(lp, grads, buf):
                        bq.mul_(MOMENTUM).add_(gq)
                        q.sub_(LR * bq)
            with torch.no_grad():
                p = [q.detach().mean(0) for q in lp]  # equal shards: sample-weighted mean = mean
        a, lo = self.evaluate(p)
        acc.append(a)
        loss.append(lo)
        return acc, loss


def measure_curves(smoke: bool = False):
    curves = []
    grid_n, grid_k, seeds = ((1, 4), (2, 10), SEEDS[:1]) if smoke else (GRID_N, GRID_K, SEEDS)
    for name, Xt, yt, Xv, yv, c in datasets():
        if smoke and name != "digits":
            continue
        trainer = LocalSGD(Xt, yt, Xv, yv, c)
        steps_cap = 300 if name == "digits" else 1500
        for n in grid_n:
            for k in grid_k:
                rounds = int(min(120, max(8, math.ceil(steps_cap / k))))
                accs, losses = [], []
                for s in seeds:
                    a, lo = trainer.run(n, k, rounds, seed=s)
                    accs.append(a)
                    losses.append(lo)
                curves.append(
                    {
                        "dataset": name,
                        "train_rows": len(Xt),
                        "val_rows": len(Xv),
                        "n": n,
                        "k": k,
                        "batch": BATCH,
                        "lr": LR,
                        "momentum": MOMENTUM,
                        "seeds": len(seeds),
                        "val_accuracy": np.round(np.mean(accs, 0), 4).tolist(),
                        "val_loss": np.round(np.mean(losses, 0), 4).tolist(),
                    }
                )
                print(f"  {name} n={n:2d} k={k:2d} rounds={rounds:3d} final acc={np.mean(accs, 0)[-1]:.3f}", flush=True)
    return curves


def fit_dataset(curves, name):
    """Fit the progress model to all (n, k) curves of one dataset (least squares).

    Shared across the curves: the effective momentum mu_e of a round that starts with a fresh
    optimizer, beta (averaging benefit), K (drift); per metric: the saturation curve in tau.
    Accuracy is fitted where it is above 0.5 (the region targets live in); the loss curve is then
    fitted with (mu_e, beta, K) held.
    """
    cs = [c for c in curves if c["dataset"] == name]
    a0 = float(np.mean([c["val_accuracy"][0] for c in cs]))
    l0 = float(np.mean([c["val_loss"][0] for c in cs]))

    def taus(c, mu, beta, drift):
        return round_progress(c["n"], c["k"], mu, beta, drift) * np.arange(len(c["val_accuracy"]))

    def resid_acc(x):
        acc_max, lt0, p, mu, lb, lk = x
        out = []
        for c in cs:
            a = np.array(c["val_accuracy"])
            pred = saturation(taus(c, mu, math.exp(lb), math.exp(lk)), a0, acc_max, math.exp(lt0), p)
            out.append((pred - a) * (a > 0.5))
        return np.concatenate(out)

    best = None
    for mu0 in (0.0, 0.5, 0.8):
        r = least_squares(
            resid_acc,
            [0.95, math.log(20.0), 0.7, mu0, 0.0, math.log(10.0)],
            bounds=([0.3, -3, 0.05, 0.0, -5, -1], [1.0, 15, 5, 0.95, 8, math.log(1e4)]),
        )
        if best is None or r.cost < best.cost:
            best = r
    acc_max, lt0, p, mu, lb, lk = best.x
    beta, drift = math.exp(lb), math.exp(lk)

    def resid_loss(x):
        lmin, lt, q = x
        out = []
        for c in cs:
            lv = np.array(c["val_loss"])
            pred = saturation(taus(c, mu, beta, drift), l0, lmin, math.exp(lt), q)
            out.append((pred - lv) * (lv < 0.5 * l0))
        return np.concatenate(out)

    rl = least_squares(resid_loss, [0.2 * l0, math.log(20.0), 0.7], bounds=([0.0, -3, 0.05], [l0, 15, 5]))
    lmin, lt, q = rl.x
    out = dict(
        acc0=a0,
        acc_max=acc_max,
        tau_acc=math.exp(lt0),
        p_acc=p,
        loss0=l0,
        loss_min=lmin,
        tau_loss=math.exp(lt),
        p_loss=q,
        momentum=MOMENTUM,
        momentum_effective=mu,
        beta=beta,
        drift_k=drift,
        rms_acc=float(np.sqrt(np.mean(best.fun[best.fun != 0] ** 2))),
        rms_loss=float(np.sqrt(np.mean(rl.fun[rl.fun != 0] ** 2))),
        train_rows=cs[0]["train_rows"],
        val_rows=cs[0]["val_rows"],
        batch=BATCH,
    )
    # tau and epochs until 90 % of the accuracy gain
    out["tau_90"] = out["tau_acc"] * (-math.log(0.10)) ** (1.0 / p)
    out["epochs_90"] = out["tau_90"] * BATCH / out["train_rows"]
    return {k: (round(float(v), 6) if isinstance(v, (float, np.floating)) else v) for k, v in out.items()}


def check_progress_model(curves):
    """How well the planner's online progress model forecasts the measured curves: for every curve
    that reaches the target, forecast the rounds still needed from 30, 50 and 70 % of the way and
    compare with when the curve really got there (coverage of the 10-90 % interval, median ratio)."""
    from smlt.runtime.planner.progress import ProgressModel
    from smlt.runtime.planner.types import RoundRecord, RunHistory

    targets = {"digits": 0.95, "synthetic20k": 0.80}
    cover, ratios = [], []
    for c in curves:
        t = targets[c["dataset"]]
        acc = np.array(c["val_accuracy"])
        if not (acc >= t).any() or int(np.argmax(acc >= t)) < 6:
            continue
        hit = int(np.argmax(acc >= t))
        for frac in (0.3, 0.5, 0.7):
            upto = max(4, int(hit * frac))
            rounds = [
                RoundRecord(
                    round=i,
                    workers=c["n"],
                    memory_mb=2048,
                    local_steps=c["k"],
                    batch_size=BATCH,
                    workers_ok=c["n"],
                    val_accuracy=float(acc[i]),
                )
                for i in range(upto)
            ]
            hist = RunHistory(rounds=rounds, train_rows=c["train_rows"], val_rows=c["val_rows"])
            pm = ProgressModel(
                metric="val_accuracy",
                target=t,
                momentum=MOMENTUM,
                batch=BATCH,
                train_rows=c["train_rows"],
                val_rows=c["val_rows"],
                quorum=0.5,
                max_rounds=3000,
                initial_workers=4,
                initial_steps=20,
            ).fit(hist)
            s = pm.forecast.summary(np.array([c["n"]]), np.array([c["k"]]))
            true = hit - upto + 1
            cover.append(bool(s[0.1][0] <= true <= s[0.9][0]))
            ratios.append(float(s[0.5][0] / true))
    return {
        "forecasts": len(cover),
        "coverage_p10_p90": round(float(np.mean(cover)), 3),
        "median_forecast_over_truth": round(float(np.median(ratios)), 3),
        "forecast_over_truth_p10_p90": [round(float(x), 3) for x in np.percentile(ratios, [10, 90])],
    }


def step_times(smoke: bool = False):
    """Seconds per training step (batch 32, SGD) of MLPs and a small CNN at 1 and 2 threads."""
    out = []
    configs = [("mlp", 64, 128), ("mlp", 256, 512), ("mlp", 784, 1024), ("mlp", 1024, 2048), ("cnn", 32, 0)]
    if smoke:
        configs = [configs[0], configs[1], configs[-1]]
    for kind, d, h in configs:
        if kind == "mlp":
            model = torch.nn.Sequential(
                torch.nn.Linear(d, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 10)
            )
            x = torch.randn(BATCH, d)
            flops_fwd = 2 * sum(p.numel() for p in model.parameters())
        else:
            model = torch.nn.Sequential(
                torch.nn.Conv2d(3, 32, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(32, 64, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(64, 128, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(),
                torch.nn.Linear(128, 10),
            )
            x = torch.randn(BATCH, 3, d, d)
            flops_fwd = 2 * (32 * 32 * 32 * 27 + 16 * 16 * 64 * 32 * 9 + 8 * 8 * 128 * 64 * 9) + 2 * 1280
        params = sum(p.numel() for p in model.parameters())
        y = torch.randint(0, 10, (BATCH,))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        row = {"kind": kind, "params": params, "train_flops_per_sample": 3 * flops_fwd}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for _ in range(5):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            reps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < (0.05 if smoke else 1.0):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                reps += 1
            row[f"step_s_{threads}t"] = (time.perf_counter() - t0) / reps
        out.append(row)
        print(
            f"  step {kind} params={params:>9,d} 1t={row['step_s_1t'] * 1e3:.2f} ms 2t={row['step_s_2t'] * 1e3:.2f} ms",
            flush=True,
        )
    torch.set_num_threads(1)
    # least squares: step_s_1t = overhead + flops * batch / rate
    A = np.array([[1.0, r["train_flops_per_sample"] * BATCH] for r in out])
    t = np.array([r["step_s_1t"] for r in out])
    w = 1.0 / t
    coef, *_ = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)
    overhead = max(float(coef[0]), 1e-5)
    rate = 1.0 / max(float(coef[1]), 1e-13)
    speedups = [r["step_s_1t"] / r["step_s_2t"] for r in out]
    return {
        "rows": out,
        "overhead_s": overhead,
        "flops_per_s_1thread": rate,
        "two_thread_speedup": [round(s, 3) for s in speedups],
    }


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--fit-only", action="store_true", help="refit the stored measurements")
    smoke.add_flag(ap)
    a = ap.parse_args()
    is_smoke = a.smoke
    t0 = time.time()
    if a.fit_only:
        old = json.loads(OUT.read_text())
        steps, curves = old["steps"], old["curves"]
    else:
        print("step times ...", flush=True)
        steps = step_times(is_smoke)
        print("curves ...", flush=True)
        curves = measure_curves(is_smoke)
    fits = {name: fit_dataset(curves, name) for name in sorted({c["dataset"] for c in curves})}
    for name, f in fits.items():
        print(f"  fit {name}: {f}")
    check = check_progress_model(curves)
    print(f"  progress model on the measured curves: {check}")
    if is_smoke:
        smoke.report({"steps": steps, "fit": fits, "progress_check": check, "curves": len(curves)})
        return
    OUT.write_text(
        json.dumps(
            {
                "about": "measured by bench/planner_calibrate.py; see the docstring there",
                "torch": torch.__version__,
                "seconds": round(time.time() - t0, 1),
                "steps": steps,
                "fit": fits,
                "progress_check": check,
                "curves": curves,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {OUT} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
