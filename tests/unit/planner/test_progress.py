"""The progress model on curves like the ones recorded here (smlt/sim/curves): a large k is
discounted until the run has measured it, the drift K is learned once it has, a slow start then a
jump is not called out of reach, and the 80 % interval covers the truth on replayed curves."""

from __future__ import annotations

import math

import numpy as np

from smlt.runtime.planner import priors
from smlt.runtime.planner.progress import ProgressModel, round_progress, saturation
from smlt.runtime.planner.types import RoundRecord, RunHistory
from smlt.sim import curves


def _model(rows: int, val_rows: int, target: float, batch: int = 32) -> ProgressModel:
    return ProgressModel(
        metric="val_accuracy",
        target=target,
        momentum=0.9,
        batch=batch,
        train_rows=rows,
        val_rows=val_rows,
        quorum=1.0,
        max_rounds=4000,
        initial_workers=4,
        initial_steps=20,
    )


def _history(plans: list[tuple[int, int]], accs: list[float], rows: int, val_rows: int, batch: int = 32) -> RunHistory:
    rounds = [
        RoundRecord(round=i, workers=n, memory_mb=1769, local_steps=k, batch_size=batch, workers_ok=n, val_accuracy=a)
        for i, ((n, k), a) in enumerate(zip(plans, accs))
    ]
    return RunHistory(rounds=rounds, param_count=100_000, train_rows=rows, val_rows=val_rows)


def _k_mean(pm: ProgressModel) -> float:
    return float(np.exp((pm.cfg_post * np.log(pm.drifts)).sum() / pm.cfg_post.sum()))


def test_the_drift_is_learned_from_rounds_at_two_local_steps():
    """A curve of the model's own family, rounds alternating k = 20 and k = 200, two epochs in all:
    the posterior moves to a short K when long rounds bought little (2.4x the short ones' progress)
    and stays longer (by over 1.4x) when they bought ~10x: K falls by over 3x from its prior. (Slowly:
    the prior, nearly no drift, is what the decision loop needed; docs/planner.md Model 2.)"""
    mu_e = priors.MOMENTUM_EFFECTIVE_RATIO * 0.9
    plans = [(4, 20 if i % 2 else 200) for i in range(14)]
    found = {}
    for true_k in (30.0, 10_000.0):
        dt = [float(round_progress(n, k, mu_e, 2.0, true_k)) for n, k in plans]
        tau = np.concatenate([[0.0], np.cumsum(dt)])
        rows = int(tau[-1] * 32 / 2.0)  # the run is two epochs of steady steps long
        accs = [float(saturation(t, 0.1, 0.95, tau[-1] / 2, 0.8)) for t in tau[: len(plans)]]
        found[true_k] = _k_mean(_model(rows, 10_000, 0.93).fit(_history(plans, accs, rows, 10_000)))
    assert found[30.0] < priors.DRIFT_K_PRIOR_MEDIAN / 3 and found[10_000.0] > 1.4 * found[30.0], found


def test_a_recorded_slow_start_then_jump_is_not_called_out_of_reach():
    """The transformer recorded here (4 workers x 5 steps) sits at 0.50 for 13 rounds (0.7 epochs),
    then jumps to 0.65-0.69. Just before the jump the fitted family sees a plateau below the 0.70
    target; a plateau that young is not believed final."""
    data = curves.load("transformer")
    run = next(r for r in data["runs"] if r["workers"] == 4 and r["local_steps"] == 5)
    accs = [p[3] for p in run["curve"]]
    jump = next(i for i, a in enumerate(accs) if a >= 0.6)
    assert jump >= 15 and max(accs[3:jump]) < 0.55  # the plateau this test is about
    hist = _history([(4, 5)] * jump, accs[:jump], data["train_rows"], data["val_rows"], data["batch"])
    pm = _model(data["train_rows"], data["val_rows"], 0.70, data["batch"]).fit(hist)
    s = pm.forecast.summary(np.array([1, 4]), np.array([5, 20]))
    assert np.all(s["p_never"] < 0.6), s["p_never"]
    assert np.all(np.isfinite(s[0.9])), s


def _replayed_forecasts(name: str, plans: list[tuple[int, int]], seed: int) -> list[tuple[float, float, float]]:
    """(p10, p90, truth) of the rounds still needed at 20-60 % of a replayed recorded curve."""
    data = curves.load(name)
    c, b, target = curves.Curves(data), int(data["batch"]), 0.55 if name == "resnet18" else 0.97
    rng = np.random.default_rng(seed)
    out = []
    for n, k in plans:
        accs = [c.acc0]
        while accs[-1] < target and len(accs) < 2000:
            accs.append(c.advance(accs[-1], n, k, n * k * b))
        total = len(accs)  # rounds, the last one evaluating the model that reached the target
        seen = [float(np.clip(a + rng.normal() * math.sqrt(a * (1 - a) / data["val_rows"]), 0, 1)) for a in accs]
        for stage in (0.2, 0.3, 0.4, 0.5, 0.6):
            r = max(1, round(stage * total))
            pm = _model(data["train_rows"], data["val_rows"], target, b)
            pm.fit(_history([(n, k)] * r, seen[:r], data["train_rows"], data["val_rows"], b))
            s = pm.forecast.summary(np.array([n]), np.array([k]))
            out.append((float(s[0.1][0]), float(s[0.9][0]), float(total - r)))
    return out


def test_the_80_percent_interval_covers_replayed_recorded_curves():
    """On the digits CNN and ResNet-18 recorded here, replayed at two plans with the validation
    split's noise, the 80 % interval of the rounds still needed holds the truth in at least 60 %
    of forecasts (15 of 20; without the model error 8)."""
    f = _replayed_forecasts("digits-cnn", [(1, 5), (4, 20)], 0) + _replayed_forecasts("resnet18", [(1, 4), (4, 4)], 1)
    inside = sum(lo <= t <= hi for lo, hi, t in f)
    assert inside >= 0.6 * len(f), (inside, len(f), f)


def test_before_the_curve_the_prior_rules_out_a_target_the_last_evaluation_had_not_met():
    """The digits CNN at round 2 (1,438 rows): the initial model at 0.09, the model after 300 steps
    (~6.7 epochs) at 0.954 of a 0.97 target. Two points, so the epochs prior still stands in for the
    curve; its mass below the evaluated model's progress is ruled out by that evaluation (the last
    round's 200 steps are not evaluated yet, so the target may be met within them). Unconditioned,
    the prior counted that mass as "done now" (p_done 0.89), and the planner bought one short
    round for the last 2 points."""
    rows = 1438
    h = _history([(1, 300), (1, 200)], [0.09, 0.954], rows, 360)
    pm = _model(rows, 360, 0.97).fit(h)
    f = pm.forecast
    assert f is not None and pm.n_obs < 3  # the prior, not a curve
    tau_seen = pm._dtau_history(h)[:, 0]  # the progress of the model round 1 started from
    assert np.all(f.tau_rem + pm.tau_now[f.cfg_idx] > tau_seen[f.cfg_idx])
    assert f.p_done < 0.5, f.p_done
    assert float(f.summary(np.array([1]), np.array([200]))[0.5][0]) >= 2  # a training round, then the evaluation
