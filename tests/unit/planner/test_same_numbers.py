"""The planner's fits computed with fewer arrays give the very numbers of the straightforward code
they replace (kept here as the reference), bit for bit, on the histories of a simulated run: the
timing model's compute features at every e at once, its regressions' prior terms and its
control-cost prior priced once (`timing._CONTROL`), the curve fit's features and sums in place, the
rounds forecast per config. The benchmark's records depend on every bit (a plan chosen on a tie)."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

from smlt.runtime.config import FunctionSizes
from smlt.runtime.planner import decide, progress, timing
from smlt.runtime.planner import priors as P
from smlt.runtime.planner.evaluate import fitted_timing, progress_model
from smlt.runtime.planner.progress import TAU0_GRID_EPOCHS, round_progress
from smlt.runtime.planner.timing import E_GRID, TimingModel
from smlt.runtime.prices import Prices
from smlt.sim.run import simulate
from smlt.sim.workloads import WORKLOADS

from .conftest import TIERS, make_job


# ----------------------------------------------------------------------------- the reference
def _grid_posterior(epochs_obs, d, prec_obs, prior_a, P):
    mu_a, sd_a = prior_a
    rows, inv = np.unique(epochs_obs, axis=0, return_inverse=True)
    x = rows[:, None, None, :] / TAU0_GRID_EPOCHS[None, :, None, None]
    phi = 1.0 - np.exp(-np.power(x, P.P_GRID[None, None, :, None]))
    s_pp = (phi**2 * prec_obs).sum(-1)[inv.ravel()]
    s_py = (phi * (d * prec_obs)).sum(-1)[inv.ravel()]
    s_yy = float((d**2 * prec_obs).sum())
    prec = s_pp + 1.0 / sd_a**2
    mean_a = (s_py + mu_a / sd_a**2) / prec
    logml = -0.5 * (s_yy + mu_a**2 / sd_a**2 - mean_a**2 * prec) - 0.5 * np.log(sd_a**2 * prec)
    tau0_med = P.EPOCHS_TO_TARGET_MEDIAN / 3.5
    lt = -0.5 * ((np.log(TAU0_GRID_EPOCHS) - math.log(tau0_med)) / math.log(8.0)) ** 2
    return logml + lt[None, :, None], mean_a, prec


def _rounds(self, n, k):
    n = np.asarray(n, dtype=float)[:, None]
    k = np.asarray(k, dtype=float)[:, None]
    i = self.cfg_idx
    dtau = round_progress(n, k, self.momentum, self.betas[i][None, :], self.drifts[i][None, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.ceil(np.maximum(self.tau_rem[None, :], 0.0) / np.maximum(dtau, 1e-12))
    return np.where(self.tau_rem[None, :] <= 0, 0.0, r) + 1.0


def _compute_x(self, memory_mb, e):
    s = self.shape
    return np.stack(
        [
            np.ones_like(np.asarray(memory_mb, dtype=float)),
            s.step_flops / (P.FLOPS_PER_VCPU * P.speed(memory_mb, e)),
        ],
        axis=-1,
    )


def _fit_compute(self, obs):
    self.steps_timed = len(obs.comp.y)
    if not obs.comp.y:
        return
    comp_m = np.array(obs.comp.x[0], dtype=float)
    y = np.array(obs.comp.y)
    sd = np.maximum(np.array(obs.comp.sd), timing.step_round_spread(comp_m, y) * y)
    logml = np.empty(len(E_GRID))
    for i, e in enumerate(E_GRID):
        logml[i] = self.compute[i].fit(_compute_x(self, comp_m, e), y, sd).logml
    lw = self.e_logprior + logml
    lw -= lw.max()
    w = np.exp(lw)
    self.e_weights = w / w.sum()


def _step_seconds(self, memory_mb):
    memory_mb = np.asarray(memory_mb, dtype=float)
    mus, vs = [], []
    for i, e in enumerate(E_GRID):
        mu, var = self.compute[i].predict(_compute_x(self, memory_mb.ravel(), e))
        mus.append(mu)
        vs.append(var)
    mu_a, v_a = np.array(mus), np.array(vs)
    w = self.e_weights[:, None]
    mean = (w * mu_a).sum(0)
    var = (w * (v_a + mu_a**2)).sum(0) - mean**2
    floor = P.STEP_OVERHEAD_S * 0.1
    return np.maximum(mean, floor).reshape(memory_mb.shape), np.sqrt(np.maximum(var, 0)).reshape(memory_mb.shape)


def _blr_fit(self, X, y, sd):
    X = np.atleast_2d(np.asarray(X, dtype=float))
    y = np.asarray(y, dtype=float)
    if y.size == 0:
        return self
    dinv = 1.0 / np.asarray(sd, dtype=float) ** 2
    p0 = 1.0 / self.s0**2
    A = np.diag(p0) + (X * dinv[:, None]).T @ X
    cov = np.linalg.inv(A)
    self.mean = cov @ (p0 * self.m0 + X.T @ (y * dinv))
    self.cov = cov
    r = y - X @ self.m0
    xr = X.T @ (r * dinv)
    quad = float(r @ (r * dinv) - xr @ cov @ xr)
    _, logdet_a = np.linalg.slogdet(A)
    logdet = float(logdet_a + np.sum(np.log(self.s0**2)) - np.sum(np.log(dinv)))
    self.logml = -0.5 * (quad + logdet + y.size * math.log(2 * math.pi))
    return self


def _control_prior(self):
    control = float(self._bill(1, plan_s=P.PLAN_S, aggregate_s=0.0).control_usd)
    agg_rate = float(self._bill(1, aggregate_s=1.0).control_usd - self._bill(1, aggregate_s=0.0).control_usd)
    return control, agg_rate


@contextlib.contextmanager
def reference():
    """Inside the block the planner computes as the reference code does."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(progress, "_grid_posterior", _grid_posterior)
        m.setattr(progress.RoundsForecast, "rounds", _rounds)
        m.setattr(TimingModel, "_fit_compute", _fit_compute)
        m.setattr(TimingModel, "step_seconds", _step_seconds)
        m.setattr(TimingModel, "_control_prior", _control_prior)
        m.setattr(timing.BLR, "fit", _blr_fit)
        yield


# ----------------------------------------------------------------------------- the inputs
@pytest.fixture(scope="module", params=["resnet18", "transformer"])
def histories(request):
    """Every history a simulated run's planner saw: the workload at 8x under a 400 s deadline (16-33
    rounds; ResNet-18: 1 and 4 workers, so 7 and 63 distinct curves; the transformer: four tiers)."""
    w = WORKLOADS[request.param].scaled(8)
    job = make_job(
        training__target_value=w.target,
        training__batch_size=w.batch,
        training__max_rounds=400,
        constraints__deadline_seconds=400.0,
    )
    seen = []

    def planner(j, h, tiers, prices, arch):
        seen.append(h.model_copy(update={"rounds": list(h.rounds)}))
        return decide(j, h, tiers, prices, arch)

    simulate(job, w, planner, TIERS, Prices(), seed=3)
    assert len(seen) >= 16
    return job, seen


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _timing(job, h):
    tm = fitted_timing(job, h, Prices(), "x86_64", FunctionSizes())
    n, m, k = (a.ravel() for a in np.meshgrid([1.0, 4.0, 16.0, 60.0], TIERS, [0.0, 5.0, 20.0, 160.0]))
    return tm, tm.forecast(n, m, k, h)


def test_the_timing_fits_and_forecasts_are_the_reference_bit_for_bit(histories):
    job, seen = histories
    timing._CONTROL.clear()
    ours = [_timing(job, h) for h in seen]
    with reference():
        ref = [_timing(job, h) for h in seen]
    for (tm, f), (tr, fr) in zip(ours, ref, strict=True):
        assert _same(tm.e_weights, tr.e_weights)
        for a, b in zip(
            [*tm.compute, tm.eval, tm.load, tm.upload, tm.overhead, tm.agg, tm.other_cost],
            [*tr.compute, tr.eval, tr.load, tr.upload, tr.overhead, tr.agg, tr.other_cost],
            strict=True,
        ):
            assert _same(a.mean, b.mean) and _same(a.cov, b.cov) and a.logml == b.logml
            assert _same(a.m0, b.m0) and _same(a.s0, b.s0)
        for name, value in vars(f).items():
            assert _same(value, getattr(fr, name)), name
    assert len({len(tm.compute[0].mean) for tm, _ in ours}) == 1 and ours[-1][0].steps_timed > 3


def test_the_control_prior_is_priced_again_for_other_prices_or_sizes():
    """`timing._CONTROL` keeps the last prices, sizes and shards: another of any is priced anew."""
    from smlt.runtime.planner.timing import JobShape

    shape = JobShape(100_000, 1e6, True, 32, 0.4, 0.4, 10.0, 100, 1000)
    cheap = Prices(lambda_gb_second={"x86_64": 1e-6, "arm64": 1e-6})
    big = FunctionSizes(planner_memory_mb=3008)
    for prices, sizes, s in [(Prices(), None, shape), (cheap, None, shape), (Prices(), big, shape)] * 2 + [
        (Prices(), None, JobShape(10**9, 1e6, True, 32, 4000.0, 4000.0, 10.0, 100, 1000))
    ]:
        tm = TimingModel(s, prices, sizes=sizes)
        assert tm._control_prior() == _control_prior(tm)
        assert _same(tm.other_cost.m0, np.asarray(_control_prior(tm)))


def test_the_progress_fits_and_forecasts_are_the_reference_bit_for_bit(histories):
    job, seen = histories
    n, k = (a.ravel() for a in np.meshgrid([1.0, 2.0, 4.0, 16.0, 60.0], [1.0, 5.0, 20.0, 160.0]))
    qs = (0.1, 0.2, 0.5, 0.7, 0.9)

    def fits():
        out = []
        for h in seen:
            pm = progress_model(job, h, fitted_timing(job, h, Prices(), "x86_64", FunctionSizes()).shape)
            out.append((pm, pm.forecast.summary(n, k, qs)))
        return out

    ours = fits()
    with reference():
        ref = fits()
    curves = 0
    for (pm, s), (pr, sr) in zip(ours, ref, strict=True):
        curves += pm.n_obs >= progress.MIN_OBS_FOR_CURVE
        assert _same(pm.cfg_post, pr.cfg_post)
        for name in ("cfg_idx", "tau_rem", "w"):
            assert _same(getattr(pm.forecast, name), getattr(pr.forecast, name)), name
        assert pm.forecast.p_done == pr.forecast.p_done
        assert s.keys() == sr.keys() and all(_same(s[q], sr[q]) for q in s)
    assert curves >= 5  # the curve fit ran, not only the prior


def test_the_round_at_k_0_once_per_n_and_m_is_the_reference_bit_for_bit(monkeypatch):
    """`levels.round_length_hedge` forecasts the round at k = 0 once per distinct (n, m): every
    candidate's is the forecast's over all candidates, bit for bit (and the hedge's choice too)."""
    from smlt.runtime.planner import adaptive, levels

    checked = []

    def hedge(x):
        cand = x.cand
        full = x.tm.forecast(cand.n, cand.m, np.zeros_like(cand.k), x.history)
        nm, pair = np.unique(np.stack([cand.n, cand.m], 1), axis=0, return_inverse=True)
        once = x.tm.forecast(nm[:, 0], nm[:, 1], np.zeros(len(nm)), x.history)
        for field in ("round_s_warm", "cost_warm"):
            assert _same(getattr(once, field)[pair.ravel()], getattr(full, field)), field
        checked.append(len(nm) < len(cand.n))
        return levels.round_length_hedge(x)

    monkeypatch.setattr(adaptive, "round_length_hedge", hedge)
    w = WORKLOADS["transformer"].scaled(8)  # four tiers
    job = make_job(
        training__target_value=w.target,
        training__batch_size=w.batch,
        training__max_rounds=400,
        constraints__deadline_seconds=400.0,
    )
    simulate(job, w, decide, TIERS, Prices(), seed=3)
    assert len(checked) >= 10 and all(checked)
