"""Progress model: how much a round of local SGD moves training, and how far the target is.

Progress is measured in tau, "steady-state steps": one step of batch b with fully built-up
momentum on one worker. A round of n workers x k local steps adds

    dtau(n, k) = k_eff(k) * h(k) * s(n)

- k_eff(k) = k - mu (1 - mu^k) / (1 - mu): workers start every round with a fresh optimizer, so
  momentum builds up again each round (k = 1 with mu = 0.9 is worth 0.1 of a steady step).
- s(n) = (1 + beta) / (1 + beta / n): averaging n workers' steps is like one step with an n-times
  larger batch, which is worth at most 1 + beta small-batch steps (beta = B_noise / b, the
  critical-batch model of McCandlish et al. 2018). n workers are never worth n sequential steps.
- h(k) = 1 / (1 + (k - 1) / K): the longer a round, the less each of its k steps is worth (the
  workers drift apart, the optimizer restarts); k * h(k) grows with k but saturates at K. K is
  learned per run (a grid with a wide prior): on the recorded ResNet-18 and transformer curves a
  round of 800 steps is worth ~3 of 20, on digits ~25, so a large k is discounted until measured.
  (Before, h only eroded the averaging benefit, K = 1000 fixed: 800 steps were worth ~800.)

The metric follows a stretched-exponential saturation in tau,
    metric(tau) = m_inf - (m_inf - m_0) * exp(-(tau / tau_0) ** p),
fitted online to the validation curve (p > 1: a slow start, then a jump). Both forms were fitted
to local-SGD curves measured on digits and a synthetic 20k-row set (bench/planner_calibrate.py,
smlt/sim/calibration.json). The family is not the truth: the tau still needed carries a log-normal
model error, and a plateau below the target is believed final only as it lasts; the constants
were measured on the recorded curves (bench/progress_calibration.py).
numpy only: this module runs in the planner Lambda.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from smlt.runtime.evaluation import PROPORTIONS, lower_is_better, metric_reaches
from smlt.runtime.planner.stats import norm_ppf
from smlt.runtime.planner.types import noise_rows


def k_effective(k, momentum: float):
    k = np.asarray(k, dtype=float)
    if momentum <= 0.0:
        return k
    return k - momentum * (1.0 - momentum**k) / (1.0 - momentum)


def round_progress(n, k, momentum: float, beta: Any, drift_k: Any):
    """dtau of one round with n workers and k local steps (broadcasts over arrays)."""
    n = np.asarray(n, dtype=float)
    k = np.asarray(k, dtype=float)
    s = (1.0 + beta) / (1.0 + beta / np.maximum(n, 1.0))
    h = 1.0 / (1.0 + np.maximum(k - 1.0, 0.0) / drift_k)
    return k_effective(k, momentum) * h * s


def saturation(tau, m0: float, m_inf: float, tau0: float, p: float):
    tau = np.maximum(np.asarray(tau, dtype=float), 0.0)
    return m_inf - (m_inf - m0) * np.exp(-((tau / tau0) ** p))


def tau_to_reach(target: float, m0: float, m_inf: float, tau0: float, p: float) -> float:
    """tau at which the saturation curve reaches target (inf if it never does)."""
    gap0 = m_inf - m0
    gap = m_inf - target
    if gap0 == 0 or gap / gap0 <= 0.0:
        return math.inf
    frac = gap / gap0
    if frac >= 1.0:
        return 0.0
    return tau0 * (-math.log(frac)) ** (1.0 / p)


# ------------------------------------------------------------------------------------------
# The online model: a grid posterior over (beta, K, tau0, p) with the amplitude integrated out.

# Gauss-Hermite nodes/weights for an expectation over a standard normal (5 and 3 points).
_GH_X = np.array([-2.856970, -1.355626, 0.0, 1.355626, 2.856970])
_GH_W = np.array([0.011257, 0.222076, 0.533333, 0.222076, 0.011257])
_GH3_X = np.array([-math.sqrt(3.0), 0.0, math.sqrt(3.0)])
_GH3_W = np.array([1.0, 4.0, 1.0]) / 6.0
TAU0_GRID_EPOCHS = np.exp(np.linspace(math.log(1e-3), math.log(300.0), 40))
# Real curves have autocorrelated noise and are not exactly this family: temper the likelihood.
LIKELIHOOD_TEMPER = 0.5
MISFIT_SD = 0.012
MIN_OBS_FOR_CURVE = 3
MAX_OBS_FIT = 60  # a longer curve is thinned to this many points (each weighted up), for speed
MAX_SAMPLES = 800  # posterior samples kept for the forecast


class RoundsForecast:
    """Distribution of the rounds still needed, per candidate (n, k).

    Samples carry a progress configuration (beta, K) by index, the tau still needed (inf: the
    target is never reached) and a weight."""

    def __init__(self, cfg_idx, tau_rem, weights, betas, drifts, momentum, p_done):
        self.cfg_idx = cfg_idx  # (S,) index into betas / drifts of each posterior sample
        self.tau_rem = tau_rem  # (S,) remaining tau (inf = never reaches the target)
        self.w = weights / weights.sum()
        self.betas = betas
        self.drifts = drifts
        self.momentum = momentum
        self.p_done = p_done  # probability that the current model already meets the target

    def rounds(self, n, k):
        """(C, S) rounds needed, counting the round that evaluates the final model."""
        n = np.asarray(n, dtype=float)[:, None]
        k = np.asarray(k, dtype=float)[:, None]
        # each config's progress, then each sample's (its config's): the same numbers, 63 columns not
        # S; gathered in C order (the rows' sums in `summary` are pairwise only along a C-order row)
        per_cfg = round_progress(n, k, self.momentum, self.betas[None, :], self.drifts[None, :])
        dtau = np.ascontiguousarray(per_cfg[:, self.cfg_idx])
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.ceil(np.maximum(self.tau_rem[None, :], 0.0) / np.maximum(dtau, 1e-12))
        return np.where(self.tau_rem[None, :] <= 0, 0.0, r) + 1.0

    def summary(self, n, k, qs=(0.1, 0.2, 0.5, 0.7, 0.9)):
        R = self.rounds(n, k)
        fin = np.isfinite(R)
        order = np.argsort(R, axis=1)
        Rs = np.take_along_axis(R, order, axis=1)
        # Quantiles are conditional on the target being reachable: the outcomes where it is not
        # are equally bad for every plan, so they must not steer the choice (p_never reports them).
        wf_sorted = np.where(np.isfinite(Rs), self.w[order], 0.0)
        tot = wf_sorted.sum(1, keepdims=True)
        cw = np.cumsum(wf_sorted, axis=1) / np.maximum(tot, 1e-300)
        out = {}
        for q in qs:
            i = np.argmax(cw >= q - 1e-12, axis=1)
            out[q] = np.where(tot[:, 0] > 0, Rs[np.arange(len(Rs)), i], np.inf)
        wf = fin * self.w[None, :]
        mass = wf.sum(1)
        # mean over the outcomes where the target is reached; p_never carries the rest
        out["mean"] = np.where(mass > 0, (np.where(fin, R, 0.0) * wf).sum(1) / np.maximum(mass, 1e-300), np.inf)
        out["p_never"] = 1.0 - mass
        return out


def _progress_configs(P) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (beta, K) of the grids, and its log prior (beta's median set per run, later)."""
    betas = np.repeat(P.BETA_GRID, len(P.DRIFT_K_GRID))
    drifts = np.tile(P.DRIFT_K_GRID, len(P.BETA_GRID))
    z = (np.log(drifts) - math.log(P.DRIFT_K_PRIOR_MEDIAN)) / P.DRIFT_K_PRIOR_SD_LOG
    return betas, drifts, -0.5 * z**2


def _thin(idx: np.ndarray, d: np.ndarray, prec: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """At most MAX_OBS_FIT observations, evenly spread, the last kept, each weighted by the number
    it stands for (the total evidence stays that of the whole curve)."""
    if len(d) <= MAX_OBS_FIT:
        return idx, d, prec
    keep = np.unique(np.linspace(0, len(d) - 1, MAX_OBS_FIT).round().astype(int))
    return idx[keep], d[keep], prec[keep] * (len(d) / len(keep))


def _keep_heaviest(w: np.ndarray, most: int = MAX_SAMPLES) -> np.ndarray:
    """Indices of the heaviest weights, at most `most` (those above 1e-4 of the largest)."""
    keep = np.flatnonzero(w > w.max() * 1e-4)
    if len(keep) > most:
        keep = keep[np.argpartition(w[keep], -most)[-most:]]
    return keep


def _grid_posterior(epochs_obs, d, prec_obs, prior_a, P):
    """Log posterior (up to a constant) over (config, tau0, p) of the curve d = y - y0 seen at
    epochs_obs (C, O), the amplitude A integrated out in closed form (d is linear in A), with the
    posterior mean and precision of A at every grid point. Priors: tau0 lognormal around the
    epochs prior / 3.5 (x8), p uniform; the configs' prior is added by the caller."""
    mu_a, sd_a = prior_a
    # configs that made the same progress (one worker's rounds do not depend on beta) share the
    # curve's features: computed once per distinct row of epochs_obs, the same numbers
    rows, inv = np.unique(epochs_obs, axis=0, return_inverse=True)
    x = rows[:, None, None, :] / TAU0_GRID_EPOCHS[None, :, None, None]  # (U, T, 1, O)
    # phi = 1 - exp(-x ** p), (U, T, Q, O), and the products summed, in place: the same operations
    # on the same arrays as out of place, without a new array for each step
    phi = np.power(x, P.P_GRID[None, None, :, None])
    np.negative(phi, out=phi)
    np.exp(phi, out=phi)
    np.subtract(1.0, phi, out=phi)
    t = np.multiply(phi, phi)
    t *= prec_obs
    s_pp = t.sum(-1)[inv.ravel()]  # (C, T, Q)
    np.multiply(phi, d * prec_obs, out=t)
    s_py = t.sum(-1)[inv.ravel()]
    s_yy = float((d**2 * prec_obs).sum())
    prec = s_pp + 1.0 / sd_a**2
    mean_a = (s_py + mu_a / sd_a**2) / prec
    logml = -0.5 * (s_yy + mu_a**2 / sd_a**2 - mean_a**2 * prec) - 0.5 * np.log(sd_a**2 * prec)
    tau0_med = P.EPOCHS_TO_TARGET_MEDIAN / 3.5
    lt = -0.5 * ((np.log(TAU0_GRID_EPOCHS) - math.log(tau0_med)) / math.log(8.0)) ** 2
    return logml + lt[None, :, None], mean_a, prec


class ProgressModel:
    """Fits the validation curve in progress units and forecasts the rounds to the target.

    Unknowns: beta (how much averaging n workers helps), K (how fast drift erodes long rounds),
    the curve's scale tau0 and shape p, and its amplitude A (where the metric saturates). For
    every (beta, K, tau0, p) on a grid the amplitude has a Gaussian posterior in closed form (the
    metric is linear in A), so the marginal likelihood of each grid point is exact; the posterior
    over the grid, a 5-point quadrature over A and a 3-point one over the model error give a
    distribution of the tau still needed. Before 3 validation points exist, a prior in epochs
    (calibrated) stands in for the curve.
    """

    def __init__(
        self,
        *,
        metric: str,
        target: float | None,
        momentum: float,
        batch: int,
        train_rows: int,
        val_rows: int,
        quorum: float,
        max_rounds: int,
        initial_workers: int,
        initial_steps: int,
        optimizer: str = "sgd",
    ):
        from smlt.runtime.planner import priors as P

        self.P = P
        self.sign = -1.0 if lower_is_better(metric) else 1.0  # y = sign * metric grows as it improves
        self.metric = metric
        self.target = target
        mom = momentum if optimizer == "sgd" else 0.9
        self.mu_e = min(P.MOMENTUM_EFFECTIVE_RATIO * mom, 0.98)
        self.batch = batch
        self.rows = max(train_rows, 1)
        self.val_rows = max(val_rows, 1)
        self.noise_rows = float(self.val_rows)  # a proportion's binomial noise (fit: types.noise_rows)
        self.quorum = quorum
        self.max_rounds = max_rounds
        self.init_n = initial_workers
        self.init_k = initial_steps
        self.betas, self.drifts, lk = _progress_configs(P)
        lb = -0.5 * ((np.log(self.betas) - math.log(P.beta_prior_median(self.rows))) / P.BETA_PRIOR_SD_LOG) ** 2
        lp = lb + lk
        self.cfg_logprior = lp - np.log(np.exp(lp).sum())
        self.tau_epoch = self.rows / batch
        self.forecast: RoundsForecast | None = None
        self.tau_now = np.zeros(len(self.betas))
        self.cfg_post = np.exp(self.cfg_logprior)
        self.n_obs = 0
        self.last_metric: float | None = None

    def _applied(self, r) -> tuple[float, float]:
        """(workers whose updates were applied, their mean local steps) of one round; 0 workers
        when the round applied nothing (below quorum, evaluation only)."""
        ok = r.workers_ok if r.workers_ok else (r.workers if not r.timings else 0)
        if r.local_steps <= 0 or ok <= 0 or ok < self.quorum * r.workers - 1e-9:
            return 0.0, 0.0
        # credited for the steps the applied updates took (a cut worker's partial update counts)
        return float(ok), r.steps_applied()

    def _dtau_history(self, history):
        """(C, R) progress of every past round under each (beta, K)."""
        cols = []
        for r in history.rounds:
            ok, steps = self._applied(r)
            if ok <= 0:
                cols.append(np.zeros(len(self.betas)))
            else:
                cols.append(round_progress(ok, steps, self.mu_e, self.betas, self.drifts))
        if not cols:
            return np.zeros((len(self.betas), 0))
        return np.stack(cols, axis=1)

    def _epochs_before(self, history) -> np.ndarray:
        """Epochs of samples the model had been trained on when each round evaluated it."""
        per = [ok * steps * self.batch / self.rows for ok, steps in map(self._applied, history.rounds)]
        return np.concatenate([[0.0], np.cumsum(per)])[: len(history.rounds)]

    def _cfg_of(self, rem: np.ndarray) -> np.ndarray:
        """The configuration index of every element of an array whose first axis is the config."""
        return np.broadcast_to(np.arange(len(self.betas)).reshape((-1,) + (1,) * (rem.ndim - 1)), rem.shape).ravel()

    def _forecast(self, ci, rem, w) -> RoundsForecast:
        keep = _keep_heaviest(w)
        p_done = float(w[rem <= 0].sum() / w.sum())
        return RoundsForecast(ci[keep], rem[keep], w[keep], self.betas, self.drifts, self.mu_e, p_done)

    def fit(self, history) -> ProgressModel:
        self.noise_rows = noise_rows(self.metric, self.val_rows, getattr(history, "val_class_rows", None))
        dt = self._dtau_history(history)
        tau_before = np.concatenate([np.zeros((len(self.betas), 1)), np.cumsum(dt, axis=1)], axis=1)
        self.tau_now = tau_before[:, -1]
        obs = [
            (i, getattr(r, self.metric)) for i, r in enumerate(history.rounds) if getattr(r, self.metric) is not None
        ]
        self.n_obs = len(obs)
        self.last_metric = obs[-1][1] if obs else None
        if self.target is None:
            self._fit_work()
        elif self.n_obs < MIN_OBS_FOR_CURVE:
            self._fit_prior(tau_before[:, obs[-1][0]] if obs else None)
        else:
            self._fit_curve(history, obs, tau_before)
        return self

    def _fit_work(self) -> None:
        """No target: the work is max_rounds rounds of the job's initial plan, in tau."""
        goal = self.max_rounds * round_progress(self.init_n, self.init_k, self.mu_e, self.betas, self.drifts)
        rem = goal - self.tau_now
        self.forecast = self._forecast(self._cfg_of(rem), rem, np.exp(self.cfg_logprior))

    def _fit_prior(self, tau_seen: np.ndarray | None = None) -> None:
        """Before the curve: tau* ~ lognormal in epochs; remaining = tau* - tau_now (per config).
        `tau_seen` (per config): the progress of the last model evaluated. It had not met the
        target, so a tau* at or below it is ruled out (the prior is conditioned on it: unconditioned,
        its mass below counted as "done now", and digits CNN runs at 0.95 of 0.97 planned one
        more short round for the last 2 points)."""
        P = self.P
        qx = norm_ppf((np.arange(20) + 0.5) / 20.0)
        tau_star = self.tau_epoch * np.exp(math.log(P.EPOCHS_TO_TARGET_MEDIAN) + P.EPOCHS_TO_TARGET_SD_LOG * qx)
        rem = tau_star[None, :] - self.tau_now[:, None]
        w = np.exp(self.cfg_logprior)[:, None] * np.full(len(qx), 1.0 / len(qx))[None, :]
        if metric_reaches(self.metric, self.target, self.last_metric):
            rem = np.zeros_like(rem)
        elif tau_seen is not None:
            alive = tau_star[None, :] > tau_seen[:, None]
            if (w * alive).sum() > 0:  # (a run past the prior's whole range keeps it as it is)
                w = w * alive
        self.forecast = self._forecast(self._cfg_of(rem), rem.ravel(), w.ravel())

    def _noise_sd(self, y: np.ndarray) -> tuple[np.ndarray, float]:
        """Each observation's noise sd (validation split + misfit) and the best possible gain."""
        y0 = y[0]
        if self.metric in PROPORTIONS:  # accuracy, balanced accuracy: binomial on the (effective) rows
            yy = np.clip(np.abs(y[1:]), 0.0, 1.0)
            return np.sqrt(np.maximum(yy * (1 - yy), 0.01) / self.noise_rows + MISFIT_SD**2), max(1.0 - y0, 1e-3)
        if self.metric == "val_r2":  # at most 1, noise like a loss's
            return 0.02 * np.abs(y[1:]) + MISFIT_SD, max(1.0 - y0, 1e-3)
        return 0.02 * np.abs(y[1:]) + MISFIT_SD, max(-y0, 1e-3)  # loss >= 0

    def _p_escape(self, history, idx: np.ndarray, y: np.ndarray, sd: np.ndarray) -> float:
        """Chance that the curve's current plateau is not its last: exp(-flat epochs / E), the
        flat epochs counted since it first came within noise of its best."""
        near = y[1:] >= y[1:].max() - sd[-1]
        first = int(idx[1:][int(np.argmax(near))])
        ep = self._epochs_before(history)
        return math.exp(-max(float(ep[int(idx[-1])] - ep[first]), 0.0) / self.P.PLATEAU_ESCAPE_EPOCHS)

    def _fit_curve(self, history, obs, tau_before) -> None:
        P = self.P
        assert self.target is not None
        idx = np.array([i for i, _ in obs])
        y = self.sign * np.array([v for _, v in obs], dtype=float)
        sd, a_max = self._noise_sd(y)
        gain = self.sign * self.target - y[0]  # what the curve must still add to its start
        fit_idx, d, prec_obs = _thin(idx[1:], (y - y[0])[1:], LIKELIHOOD_TEMPER / sd**2)
        # Amplitude prior: the user's target is probably reachable, the plateau somewhere between
        # the target and the best possible value.
        need = min(max(gain, 0.0), a_max)
        prior_a = (need + 0.5 * (a_max - need), 0.5 * (a_max - need) + 0.1 * a_max)
        post, mean_a, prec = _grid_posterior(tau_before[:, fit_idx] / self.tau_epoch, d, prec_obs, prior_a, P)
        post = post + self.cfg_logprior[:, None, None]
        # only the grid points that carry weight go on (the forecast keeps at most MAX_SAMPLES)
        flat = np.exp(post - post.max()).ravel()
        g = _keep_heaviest(flat, 4 * MAX_SAMPLES)
        ci, ti, qi = np.unravel_index(g, post.shape)
        # amplitude quadrature: where each grid point's curve reaches the target, in tau
        A = np.clip(mean_a.ravel()[g][:, None] + _GH_X / np.sqrt(prec.ravel()[g])[:, None], 1e-6, a_max)  # (G, 5)
        frac = gain / A
        tau0 = (self.tau_epoch * TAU0_GRID_EPOCHS[ti])[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            inner = -np.log(np.clip(1.0 - frac, 1e-300, None))
            tau_star = tau0 * np.power(inner, 1.0 / P.P_GRID[qi][:, None])
        tau_star = np.where(frac >= 1.0, np.inf, np.where(frac <= 0.0, 0.0, tau_star))
        # the same prior on tau* (epochs to the target) that stands in before the curve exists, so
        # the forecast moves smoothly from the prior to the data
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (np.log(tau_star / self.tau_epoch) - math.log(P.EPOCHS_TO_TARGET_MEDIAN)) / P.EPOCHS_TO_TARGET_SD_LOG
        w = flat[g][:, None] * _GH_W * np.exp(np.where(np.isfinite(z), -0.5 * z**2, -2.0))
        self.cfg_post = np.bincount(ci, weights=w.sum(1), minlength=len(self.betas)) / w.sum()
        # the family's extrapolation is off by a log-normal factor (3-point quadrature)
        with np.errstate(invalid="ignore"):
            rem = np.maximum(tau_star - self.tau_now[ci][:, None], 0.0)[..., None] * np.exp(P.FORECAST_SD_LOG * _GH3_X)
        w = w[..., None] * _GH3_W
        if metric_reaches(self.metric, self.target, self.last_metric):
            rem = np.zeros_like(rem)
        cfg = np.broadcast_to(ci[:, None, None], rem.shape).ravel()
        p_escape = self._p_escape(history, idx, y, sd)
        self.forecast = self._forecast(*self._with_escape(cfg, rem.ravel(), w.ravel(), p_escape))

    def _with_escape(self, ci, rem, w, p_escape: float):
        """Where the fit says the target is never reached, with p_escape the plateau ends after all
        and the rest takes about as long again as the run so far (tau_now, spread as the epochs prior)."""
        never = ~np.isfinite(rem)
        if p_escape <= 0.0 or not never.any():
            return ci, rem, w
        per_cfg = np.bincount(ci[never], weights=w[never], minlength=len(self.betas))
        z = _GH_X * self.P.EPOCHS_TO_TARGET_SD_LOG
        esc_rem = np.maximum(self.tau_now, 1.0)[:, None] * np.exp(z)[None, :]
        esc_w = p_escape * per_cfg[:, None] * _GH_W[None, :]
        w = np.where(never, w * (1.0 - p_escape), w)
        return (
            np.concatenate([ci, self._cfg_of(esc_rem)]),
            np.concatenate([rem, esc_rem.ravel()]),
            np.concatenate([w, esc_w.ravel()]),
        )

    def mean_round_progress(self, n, k):
        """Posterior-mean tau of one round at (n, k)."""
        n = np.asarray(n, dtype=float)[:, None]
        k = np.asarray(k, dtype=float)[:, None]
        d = round_progress(n, k, self.mu_e, self.betas[None, :], self.drifts[None, :])
        w = self.cfg_post / self.cfg_post.sum()
        return (d * w[None, :]).sum(1)

    def beta_mean(self) -> float:
        return float(np.exp((self.cfg_post * np.log(self.betas)).sum()))
