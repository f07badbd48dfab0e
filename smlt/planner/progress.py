"""Progress model: how much a round of local SGD moves training, and how far the target is.

Progress is measured in tau, "steady-state steps": one step of batch b with fully built-up
momentum on one worker. A round of n workers x k local steps adds

    dtau(n, k) = k_eff(k) * (1 + (s(n) - 1) * h(k))

- k_eff(k) = k - mu (1 - mu^k) / (1 - mu): workers start every round with a fresh optimizer, so
  momentum builds up again each round (k = 1 with mu = 0.9 is worth 0.1 of a steady step).
- s(n) = (1 + beta) / (1 + beta / n): averaging n workers' steps is like one step with an n-times
  larger batch, which is worth at most 1 + beta small-batch steps (beta = B_noise / b, the
  critical-batch model of McCandlish et al. 2018). n workers are never worth n sequential steps.
- h(k) = 1 / (1 + (k - 1) / K): the longer workers drift apart between averages, the less of the
  large-batch benefit survives (k = 1 is exactly large-batch SGD, h = 1).

The metric follows a stretched-exponential saturation in tau,
    metric(tau) = m_inf - (m_inf - m_0) * exp(-(tau / tau_0) ** p),
fitted online to the validation curve. Both forms were fitted to local-SGD curves measured on
digits and a synthetic 20k-row set (bench/planner_calibrate.py, smlt/sim/calibration.json).
numpy only: this module runs in the planner Lambda.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from smlt.evaluation import lower_is_better
from smlt.planner.stats import norm_ppf
from smlt.planner.types import metric_reaches


def k_effective(k, momentum: float):
    k = np.asarray(k, dtype=float)
    if momentum <= 0.0:
        return k
    return k - momentum * (1.0 - momentum**k) / (1.0 - momentum)


def round_progress(n, k, momentum: float, beta: Any, drift_k: float):
    """dtau of one round with n workers and k local steps (broadcasts over arrays)."""
    n = np.asarray(n, dtype=float)
    k = np.asarray(k, dtype=float)
    s = (1.0 + beta) / (1.0 + beta / np.maximum(n, 1.0))
    h = 1.0 / (1.0 + np.maximum(k - 1.0, 0.0) / drift_k)
    return k_effective(k, momentum) * (1.0 + (s - 1.0) * h)


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
# The online model: a grid posterior over (beta, tau0, p) with the amplitude integrated out.

# Gauss-Hermite nodes/weights for an expectation over a standard normal (5 points).
_GH_X = np.array([-2.856970, -1.355626, 0.0, 1.355626, 2.856970])
_GH_W = np.array([0.011257, 0.222076, 0.533333, 0.222076, 0.011257])
TAU0_GRID_EPOCHS = np.exp(np.linspace(math.log(1e-3), math.log(300.0), 64))
# Real curves have autocorrelated noise and are not exactly this family: temper the likelihood.
LIKELIHOOD_TEMPER = 0.5
MISFIT_SD = 0.012
MIN_OBS_FOR_CURVE = 3


class RoundsForecast:
    """Distribution of the rounds still needed, per candidate (n, k)."""

    def __init__(self, beta_idx, tau_rem, weights, betas, momentum, drift_k, p_done):
        self.beta_idx = beta_idx  # (S,) index into betas of each posterior sample
        self.tau_rem = tau_rem  # (S,) remaining tau (inf = never reaches the target)
        self.w = weights / weights.sum()
        self.betas = betas
        self.momentum = momentum
        self.drift_k = drift_k
        self.p_done = p_done  # probability that the current model already meets the target

    def rounds(self, n, k):
        """(C, S) rounds needed, counting the round that evaluates the final model."""
        n = np.asarray(n, dtype=float)[:, None]
        k = np.asarray(k, dtype=float)[:, None]
        dtau = round_progress(n, k, self.momentum, self.betas[self.beta_idx][None, :], self.drift_k)
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


class ProgressModel:
    """Fits the validation curve in progress units and forecasts the rounds to the target.

    Unknowns: beta (how much averaging n workers helps), the curve's scale tau0 and shape p,
    and its amplitude A (where the metric saturates). For every (beta, tau0, p) on a grid the
    amplitude has a Gaussian posterior in closed form (the metric is linear in A), so the
    marginal likelihood of each grid point is exact; the posterior over the grid and a 5-point
    quadrature over A give a distribution of the tau still needed. Before 3 validation points
    exist, a prior in epochs (calibrated) stands in for the curve.
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
        from smlt.planner import priors as P

        self.P = P
        self.sign = -1.0 if lower_is_better(metric) else 1.0  # y = sign * metric grows as it improves
        self.metric = metric
        self.target = target
        mom = momentum if optimizer == "sgd" else 0.9
        self.mu_e = min(P.MOMENTUM_EFFECTIVE_RATIO * mom, 0.98)
        self.batch = batch
        self.rows = max(train_rows, 1)
        self.val_rows = max(val_rows, 1)
        self.quorum = quorum
        self.max_rounds = max_rounds
        self.init_n = initial_workers
        self.init_k = initial_steps
        self.betas = P.BETA_GRID
        lb = -0.5 * ((np.log(self.betas) - math.log(P.beta_prior_median(self.rows))) / P.BETA_PRIOR_SD_LOG) ** 2
        self.beta_logprior = lb - np.log(np.exp(lb).sum())
        self.tau_epoch = self.rows / batch
        self.forecast: RoundsForecast | None = None
        self.tau_now = np.zeros(len(self.betas))
        self.beta_post = np.exp(self.beta_logprior)
        self.n_obs = 0
        self.last_metric: float | None = None

    def _dtau_history(self, history):
        """(B, R) progress of every past round under each beta."""
        cols = []
        for r in history.rounds:
            ok = r.workers_ok if r.workers_ok else (r.workers if not r.timings else 0)
            if r.local_steps <= 0 or ok <= 0 or ok < self.quorum * r.workers - 1e-9:
                cols.append(np.zeros(len(self.betas)))
            else:
                # credited for the steps the applied updates took (a cut worker's partial update counts)
                cols.append(round_progress(ok, r.steps_applied(), self.mu_e, self.betas, self.P.DRIFT_K))
        if not cols:
            return np.zeros((len(self.betas), 0))
        return np.stack(cols, axis=1)

    def fit(self, history) -> ProgressModel:
        P = self.P
        dt = self._dtau_history(history)
        tau_before = np.concatenate([np.zeros((len(self.betas), 1)), np.cumsum(dt, axis=1)], axis=1)
        self.tau_now = tau_before[:, -1]
        obs = [
            (i, getattr(r, self.metric)) for i, r in enumerate(history.rounds) if getattr(r, self.metric) is not None
        ]
        self.n_obs = len(obs)
        self.last_metric = obs[-1][1] if obs else None

        if self.target is None:
            goal = self.max_rounds * round_progress(self.init_n, self.init_k, self.mu_e, self.betas, P.DRIFT_K)
            rem = goal - self.tau_now
            w = np.exp(self.beta_logprior)
            self.forecast = RoundsForecast(
                np.arange(len(self.betas)), rem, w, self.betas, self.mu_e, P.DRIFT_K, float(w[rem <= 0].sum() / w.sum())
            )
            return self

        y_t = self.sign * self.target
        if self.n_obs < MIN_OBS_FOR_CURVE:
            # Prior in epochs: tau* ~ lognormal; remaining = tau* - tau_now (per beta).
            qx = norm_ppf((np.arange(20) + 0.5) / 20.0)
            qw = np.full(20, 1.0 / 20.0)
            tau_star = self.tau_epoch * np.exp(math.log(P.EPOCHS_TO_TARGET_MEDIAN) + P.EPOCHS_TO_TARGET_SD_LOG * qx)
            bi = np.repeat(np.arange(len(self.betas)), len(qx))
            rem = np.tile(tau_star, len(self.betas)) - self.tau_now[bi]
            w = np.exp(self.beta_logprior)[bi] * np.tile(qw, len(self.betas))
            if metric_reaches(self.metric, self.target, self.last_metric):
                rem = np.zeros_like(rem)
            self.forecast = RoundsForecast(
                bi, rem, w, self.betas, self.mu_e, P.DRIFT_K, float(w[rem <= 0].sum() / w.sum())
            )
            return self

        idx = np.array([i for i, _ in obs])
        y = self.sign * np.array([v for _, v in obs], dtype=float)
        y0 = y[0]
        d = (y - y0)[1:]
        if self.metric == "val_accuracy":
            yy = np.clip(np.abs(y[1:]), 0.0, 1.0)
            sd = np.sqrt(np.maximum(yy * (1 - yy), 0.01) / self.val_rows + MISFIT_SD**2)
            a_max = max(1.0 - y0, 1e-3)
        elif self.metric == "val_r2":  # at most 1, noise like a loss's
            sd = 0.02 * np.abs(y[1:]) + MISFIT_SD
            a_max = max(1.0 - y0, 1e-3)
        else:
            sd = 0.02 * np.abs(y[1:]) + MISFIT_SD
            a_max = max(-y0, 1e-3)  # loss >= 0
        prec_obs = LIKELIHOOD_TEMPER / sd**2
        # Amplitude prior: the user's target is probably reachable, the plateau somewhere between
        # the target and the best possible value.
        need = min(max(y_t - y0, 0.0), a_max)
        mu_a = need + 0.5 * (a_max - need)
        sd_a = 0.5 * (a_max - need) + 0.1 * a_max
        tau_obs = tau_before[:, idx[1:]]  # (B, O)
        tau0 = self.tau_epoch * TAU0_GRID_EPOCHS  # (T,)
        ps = P.P_GRID  # (Q,)
        x = tau_obs[:, None, None, :] / tau0[None, :, None, None]  # (B, T, 1, O)
        phi = 1.0 - np.exp(-np.power(x, ps[None, None, :, None]))  # (B, T, Q, O)
        s_pp = (phi**2 * prec_obs).sum(-1)
        s_py = (phi * d * prec_obs).sum(-1)
        s_yy = float((d**2 * prec_obs).sum())
        prec = s_pp + 1.0 / sd_a**2
        mean_a = (s_py + mu_a / sd_a**2) / prec
        logml = -0.5 * (s_yy + mu_a**2 / sd_a**2 - mean_a**2 * prec) - 0.5 * np.log(sd_a**2 * prec)
        # priors: beta (lognormal), tau0 (lognormal around the epochs prior / 3.5), p (uniform)
        tau0_med = P.EPOCHS_TO_TARGET_MEDIAN / 3.5
        lt = -0.5 * ((np.log(TAU0_GRID_EPOCHS) - math.log(tau0_med)) / math.log(8.0)) ** 2
        logpost = logml + self.beta_logprior[:, None, None] + lt[None, :, None]
        logpost -= logpost.max()
        post = np.exp(logpost)
        post /= post.sum()
        self.beta_post = post.sum(axis=(1, 2))
        # amplitude quadrature
        sd_post = 1.0 / np.sqrt(prec)
        A = np.clip(mean_a[..., None] + sd_post[..., None] * _GH_X, 1e-6, a_max)  # (B, T, Q, 5)
        frac = (y_t - y0) / A
        with np.errstate(divide="ignore", invalid="ignore"):
            inner = -np.log(np.clip(1.0 - frac, 1e-300, None))
            tau_star = tau0[None, :, None, None] * np.power(inner, 1.0 / ps[None, None, :, None])
        tau_star = np.where(frac >= 1.0, np.inf, np.where(frac <= 0.0, 0.0, tau_star))
        rem = tau_star - self.tau_now[:, None, None, None]
        # the same prior on tau* (epochs to the target) that stands in before the curve exists, so
        # the forecast moves smoothly from the prior to the data
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (np.log(tau_star / self.tau_epoch) - math.log(P.EPOCHS_TO_TARGET_MEDIAN)) / P.EPOCHS_TO_TARGET_SD_LOG
        log_pt = np.where(np.isfinite(z), -0.5 * z**2, -2.0)
        w = post[..., None] * _GH_W * np.exp(log_pt)
        self.beta_post = w.sum(axis=(1, 2, 3)) / w.sum()
        if metric_reaches(self.metric, self.target, self.last_metric):
            rem = np.zeros_like(rem)
        bi = np.broadcast_to(np.arange(len(self.betas))[:, None, None, None], rem.shape)
        flat_w = w.ravel()
        keep = flat_w > flat_w.max() * 1e-4
        if keep.sum() > 800:
            keep = flat_w >= np.sort(flat_w)[-800]
        self.forecast = RoundsForecast(
            bi.ravel()[keep],
            rem.ravel()[keep],
            flat_w[keep],
            self.betas,
            self.mu_e,
            P.DRIFT_K,
            float(flat_w[(rem.ravel() <= 0)].sum() / flat_w.sum()),
        )
        return self

    def mean_round_progress(self, n, k):
        """Posterior-mean tau of one round at (n, k)."""
        n = np.asarray(n, dtype=float)[:, None]
        k = np.asarray(k, dtype=float)[:, None]
        d = round_progress(n, k, self.mu_e, self.betas[None, :], self.P.DRIFT_K)
        w = self.beta_post / self.beta_post.sum()
        return (d * w[None, :]).sum(1)

    def beta_mean(self) -> float:
        return float(np.exp((self.beta_post * np.log(self.betas)).sum()))
