import math

import numpy as np
import pytest

from smlt.runtime.planner import priors as P
from smlt.runtime.planner.progress import ProgressModel, k_effective, round_progress, saturation, tau_to_reach
from smlt.runtime.planner.stats import expected_max_z, norm_ppf
from smlt.runtime.planner.timing import STEP_SPREAD_PRIOR as P_SPREAD
from smlt.runtime.planner.timing import JobShape, TimingModel, step_round_spread

from .conftest import make_history, make_round


def test_round_progress_shape():
    # averaging n workers is worth less than n sequential steps, and never less than one
    for k in (1, 10, 100):
        one = round_progress(1, k, 0.78, 4.0, 1000.0)
        many = round_progress(16, k, 0.78, 4.0, 1000.0)
        assert one < many < 16 * one
    # momentum restarts every round: k = 1 is worth a fraction of a steady step
    assert k_effective(1, 0.9) < 0.2 and abs(k_effective(1000, 0.9) - 991) < 1
    assert abs(tau_to_reach(0.9, 0.1, 0.95, 100.0, 0.8) - 100.0 * (-np.log(0.05 / 0.85)) ** (1 / 0.8)) < 1e-6
    assert tau_to_reach(0.96, 0.1, 0.95, 100.0, 0.8) == float("inf")


def test_stats_helpers():
    assert abs(norm_ppf(0.975) - 1.959964) < 1e-5 and abs(norm_ppf(0.5)) < 1e-9
    assert expected_max_z(1) == 0 and 0.5 < expected_max_z(2) < 0.6 and 2.3 < expected_max_z(64) < 2.6


def test_progress_forecast_brackets_the_truth():
    """A synthetic run on the model's own family: the 10-90 % range of the forecast contains the
    rounds actually needed, and the forecast narrows as the curve is observed."""
    rng = np.random.default_rng(0)
    n, k, beta, mu_e = 4, 50, 3.0, 0.8
    tau_star_true = tau_to_reach(0.85, 0.1, 0.92, 800.0, 0.7)
    dt = round_progress(n, k, mu_e, beta, 1000.0)
    total = int(np.ceil(tau_star_true / dt)) + 1
    widths = []
    for seen in (6, 12, 18):
        rounds = []
        for i in range(seen):
            acc = float(saturation(i * dt, 0.1, 0.92, 800.0, 0.7) + rng.normal(0, 0.005))
            rounds.append(make_round(i, n=n, k=k, acc=acc))
        hist = make_history(rounds, rows=20_000)
        pm = ProgressModel(
            metric="val_accuracy",
            target=0.85,
            momentum=0.9,
            batch=32,
            train_rows=20_000,
            val_rows=5000,
            quorum=0.5,
            max_rounds=1000,
            initial_workers=4,
            initial_steps=20,
        ).fit(hist)
        s = pm.forecast.summary(np.array([n]), np.array([k]))
        need = total - seen + 1
        assert s[0.1][0] <= need <= s[0.9][0], (seen, need, s)
        widths.append(s[0.9][0] - s[0.1][0])
    assert widths[-1] < widths[0]


def test_timing_model_learns_compute_speed(prices):
    hist = make_history(
        [make_round(i, n=4, m=1769, k=50, step_s=0.05, acc=0.2) for i in range(3)], params=1_000_000, flops=6e6
    )
    tm = TimingModel(JobShape.of(hist, 32), prices).fit(hist)
    mu, sd = tm.step_seconds(np.array([1769.0, 10240.0]))
    assert abs(mu[0] - 0.05) / 0.05 < 0.1  # measured tier: learned
    assert mu[1] < mu[0] and sd[1] / mu[1] > sd[0] / mu[0]  # unmeasured tier: faster but uncertain


def test_the_first_round_s_cold_overhead_does_not_predict_the_next_rounds(prices):
    """Round 0's planner and states start cold (in the benchmark's world ~1.7-2.1 s of overhead
    where a warm round pays ~0.85 s), so, like its cold aggregator, its overhead is left out of the
    fit: a round-0 overhead of 3 s more predicts the same next round, while the same excess in a
    later round is learned."""

    def history(extra0: float, extra1: float):
        rounds = [make_round(i, n=1, m=1769, k=50, acc=0.2) for i in range(2)]
        for r, extra in zip(rounds, (extra0, extra1)):
            r.round_s += extra
        return make_history(rounds)

    def next_round_s(hist) -> float:
        tm = TimingModel(JobShape.of(hist, 32), prices).fit(hist)
        return float(tm.forecast([1], [1769], [50], hist).round_s[0])

    base = next_round_s(history(0.0, 0.0))
    assert next_round_s(history(3.0, 0.0)) == pytest.approx(base, rel=1e-9)
    assert next_round_s(history(0.0, 3.0)) > base + 1.0


def test_a_cold_start_scales_with_the_vcpu_share_below_one_vcpu(prices):
    """The cold start imports torch, seconds of one core (facts.md), so at 1,024 MB (0.58 of a vCPU)
    it takes 1,769 / 1,024 as long as at 1,769 MB; above one vCPU no less. A cold start measured at
    1,024 MB exactly where that rule puts the prior leaves the prior where it was: the fit
    normalises what it observes by the same rule it predicts with."""
    hist = make_history([make_round(0, n=1, m=1769, k=50, acc=0.2)])
    tm = TimingModel(JobShape.of(hist, 32), prices)
    at = tm.init_seconds(np.array([1024.0, 1769.0, 3008.0]))
    assert at[0] / at[1] == pytest.approx(1769 / 1024, rel=1e-9)
    assert at[2] == pytest.approx(at[1], rel=1e-9)

    rounds = [make_round(i, n=4, m=1024, k=50, acc=0.2, cold=(i == 0)) for i in range(2)]
    for t in rounds[0].timings:
        t.init_s = P.COLD_INIT_MEDIAN_S * 1769 / 1024
    hist = make_history(rounds)
    fitted = TimingModel(JobShape.of(hist, 32), prices).fit(hist)
    assert fitted.init_log_mu == pytest.approx(math.log(P.COLD_INIT_MEDIAN_S), abs=1e-9)


def test_workers_held_to_their_limit_make_rounds_of_more_workers_expected_longer(prices):
    """A worker cut at its limit holds its round for about the limit. How often that happens is
    the run's own: after rounds where one of four workers was cut each time, a round is expected
    to take longer than after clean rounds, and more so for eight workers than for one (a round
    waits for its slowest). Round 0's cuts do not count: its probe limit cuts a wrong prior."""

    def history(cut_rounds: range):
        rounds = [make_round(i, n=4, m=1769, k=50, acc=0.2) for i in range(6)]
        for i in cut_rounds:
            rounds[i].timings[0].cut = True
        return make_history(rounds)

    def round_s(hist, n: int) -> float:
        tm = TimingModel(JobShape.of(hist, 32), prices).fit(hist)
        return float(tm.forecast([n], [1769], [50], hist).round_s_warm[0])

    clean, cut, probe = history(range(0)), history(range(1, 6)), history(range(0, 1))
    assert round_s(probe, 4) == pytest.approx(round_s(clean, 4), rel=1e-9)
    assert round_s(cut, 1) > round_s(clean, 1)
    assert round_s(cut, 8) - round_s(clean, 8) > 2 * (round_s(cut, 1) - round_s(clean, 1))


def test_the_step_time_is_as_uncertain_as_the_run_s_rounds_at_one_tier_disagree(prices):
    """A round's per-step time carries the round's own noise (a slow host, a noisy neighbour), not
    only its workers' spread. Rounds at one tier that disagree by 2x leave the tier's step time
    uncertain (it feeds the p90 and the worker limit), where rounds that agree pin it; a
    difference between tiers is the model's to explain, not noise."""

    def fitted(steps: list[float]):
        rounds = [make_round(i, n=1, m=1769, k=50, step_s=s, acc=0.2) for i, s in enumerate(steps)]
        hist = make_history(rounds, params=1_000_000, flops=6e7)  # a prior of ~0.05 s a step
        tm = TimingModel(JobShape.of(hist, 32), prices).fit(hist)
        mu, sd = tm.step_seconds(np.array([1769.0]))
        return float(mu[0]), float(sd[0])

    mu_c, sd_c = fitted([0.05] * 6)
    mu_n, sd_n = fitted([0.035, 0.07] * 3)
    # each round is weighed by its own value, as the fit always did: the fast ones count a little
    # more (0.042 here; weighing by the tier's median measured worse in the benchmark's loop)
    assert mu_c == pytest.approx(0.05, rel=0.05) and mu_n == pytest.approx(0.05, rel=0.2)
    assert sd_n / mu_n > 2 * sd_c / mu_c

    tiers = np.array([1769.0, 1769.0, 3008.0, 3008.0])
    assert step_round_spread(tiers, np.array([0.05, 0.05, 0.03, 0.03])) < P_SPREAD
    assert step_round_spread(tiers, np.array([0.035, 0.07, 0.02, 0.04])) > 2 * P_SPREAD


def test_the_network_prior_bursts_then_holds_the_sustained_rate(prices):
    """priors: ~1.2 GiB/s for the first ~300 MiB, then ~75 MiB/s (facts.md, Skyrise), and no
    memory tier in it; the upload gets back the burst the load used while the worker computes."""
    small = TimingModel(JobShape.of(make_history([], params=1_000_000), 32), prices)  # 4 MB
    big = TimingModel(JobShape.of(make_history([], params=250_000_000), 32), prices)  # 1,000 MB
    hit = np.zeros(1)
    load, up = small.network_seconds(np.array([4.0]), hit, np.array([1.0]))
    assert load[0] == pytest.approx(P.S3_GET_LATENCY_S + 4.0 / P.NET_BURST_MB_PER_S)
    assert up[0] == pytest.approx(P.S3_PUT_LATENCY_S + 4.0 / P.NET_BURST_MB_PER_S)
    burst, rest = P.NET_BURST_MB / P.NET_BURST_MB_PER_S, (1000.0 - P.NET_BURST_MB) / P.NET_SUSTAINED_MB_PER_S
    load, rested = big.network_seconds(np.array([4.0]), hit, np.array([10.0]))
    assert load[0] == pytest.approx(P.S3_GET_LATENCY_S + burst + rest)
    assert rested[0] == pytest.approx(P.S3_PUT_LATENCY_S + burst + rest)  # 10 s refill the bucket
    _, drained = big.network_seconds(np.array([4.0]), hit, np.array([0.0]))
    assert drained[0] == pytest.approx(P.S3_PUT_LATENCY_S + 1000.0 / P.NET_SUSTAINED_MB_PER_S)


def test_the_network_model_learns_the_recorded_load_and_upload_times(prices):
    """A run whose 200 MB model loads in 2 s and uploads in 1.5 s (a network 10x slower than the
    prior's burst): the fitted model predicts what was recorded, at any memory tier."""
    rounds = [make_round(i, n=4, m=m, k=20, load_s=2.0, upload_s=1.5) for i, m in enumerate((1769, 3008, 1769))]
    hist = make_history(rounds, params=50_000_000)
    tm = TimingModel(JobShape.of(hist, 32), prices)
    before = tm.network_seconds(np.array([4.0]), np.zeros(1), np.array([0.45]))
    tm.fit(hist)
    load, up = tm.network_seconds(np.array([4.0]), np.zeros(1), np.array([0.45]))
    assert before[0][0] < 0.5 and load[0] == pytest.approx(2.0, rel=0.1) and up[0] == pytest.approx(1.5, rel=0.1)
