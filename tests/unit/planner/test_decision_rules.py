"""The decision rule (issue #12): a run is given up only when its own curve has stopped
improving, a tight budget's last trained model is evaluated before a budget stop, no plan jumps
far beyond the settings tried so far, a plan that meets the deadline itself needs no way out, and
with a deadline the cost headroom buys speed."""

from types import SimpleNamespace

import numpy as np

from smlt.runtime.planner import decide
from smlt.runtime.planner.candidates import candidates, step_reach
from smlt.runtime.planner.config import DEFAULT as C
from smlt.runtime.planner.config import PlannerConfig
from smlt.runtime.planner.levels import budget_safe, candidate_levels, deadline_safe
from smlt.runtime.planner.pick import Pick, _cheap_then_fast
from smlt.runtime.planner.priors import FINALIZE_S
from smlt.runtime.planner.progress import saturation
from smlt.runtime.planner.stall import stalled
from smlt.runtime.planner.timing import JobShape, TimingModel
from smlt.runtime.planner.types import RunHistory

from .conftest import TIERS, make_history, make_job, make_round


def _history(accs, val_rows=360, k=100, **kw):
    rounds = [make_round(i, n=1, m=1769, k=k, acc=a) for i, a in enumerate(accs)]
    return make_history(rounds, params=100_000, rows=1437, val_rows=val_rows, **kw)


def test_a_flat_curve_is_stalled_and_a_climbing_one_is_not():
    job = make_job(training={"target_value": 0.97, "max_rounds": 500, "local_steps": 20})
    flat = [0.30, 0.45, 0.50, 0.51, 0.49, 0.505, 0.51]
    climbing = [0.30, 0.45, 0.50, 0.55, 0.58, 0.61, 0.64]
    assert stalled(job, _history(flat), 360)
    assert not stalled(job, _history(climbing), 360)
    # the same 0.03 rise is noise on 60 validation rows (sd ~0.065), a rise on 5,000 (sd ~0.007)
    small_rise = [0.30, 0.45, 0.50, 0.51, 0.52, 0.52, 0.53]
    assert stalled(job, _history(small_rise), 60)
    assert not stalled(job, _history(small_rise), 5000)
    # too few points to tell
    assert not stalled(job, _history(flat[: C.stall_rounds]), 360)


def test_a_loss_target_is_stalled_when_the_loss_stops_falling():
    job = make_job(training={"target_metric": "val_loss", "target_value": 0.1, "max_rounds": 500})
    rounds = [make_round(i, n=1, m=1769, k=100, acc=a) for i, a in enumerate([0.3, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6])]
    hist = make_history(rounds, val_rows=360)  # val_loss = 2.3 (1 - acc): falling, then flat
    assert stalled(job, hist, 360)
    rounds = [make_round(i, n=1, m=1769, k=100, acc=a) for i, a in enumerate([0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85])]
    assert not stalled(job, make_history(rounds, val_rows=360), 360)


def test_the_model_s_doubt_alone_does_not_stop_a_run_that_still_climbs(prices):
    """A curve still rising (+0.19 over the last four rounds, far beyond the split's noise) whose
    fitted family puts the plateau below the 0.97 target, 20 s left: the model calls it out of
    reach (the old rule stopped "to save the budget" here), the run itself does not, so it keeps
    training (best effort within the guards)."""
    accs = [float(saturation(60 * i, 0.1, 0.85, 300.0, 1.0)) for i in range(9)]
    assert accs[-1] - accs[-C.stall_rounds - 1] > 0.15
    hist = _history(accs)
    job = make_job(
        constraints={"deadline_seconds": hist.elapsed_s + 20.0, "budget_usd": 1.0},
        training={"target_value": 0.97, "max_rounds": 500, "local_steps": 20},
    )
    d = decide(job, hist, TIERS, prices)
    assert d.action == "train", d.reason


def _budget_history(cost_left: float, n: int = 1):
    rounds = [make_round(i, n=n, m=1769, k=100, acc=0.3 + 0.05 * i) for i in range(4)]
    hist = make_history(rounds, params=100_000, rows=1437, val_rows=360)
    return hist, make_job(
        constraints={"budget_usd": hist.cost_total_usd + cost_left},
        training={"target_value": 0.97, "max_rounds": 500, "local_steps": 20},
    )


def test_a_budget_stop_evaluates_the_newest_model_first_when_that_fits(prices):
    """$0.00105 left: no training round's worst case fits with finalisation, an evaluation-only
    round does. Without it the last round's training would never be measured (its metric shows in
    the next round's record), as in the tight-budget digits jobs whose round 0 was wasted."""
    hist, job = _budget_history(0.00105)
    d = decide(job, hist, TIERS, prices)
    assert (d.action, d.rule, d.local_steps, d.bound) == ("train", "last_look", 0, "budget"), d.reason
    assert (d.workers, d.memory_mb) == (1, 1769)
    assert d.worker_time_limit_s and d.worker_time_limit_s > 0
    # after that evaluation round the run stops: nothing more is evaluated
    ev = make_round(4, n=1, m=1769, k=0, acc=0.5, cost=0.0002)
    after = hist.model_copy(update={"rounds": [*hist.rounds, ev], "cost_total_usd": hist.cost_total_usd + 0.0002})
    d2 = decide(job, after, TIERS, prices)
    assert (d2.action, d2.rule, d2.bound) == ("stop", "budget_guard", "budget"), d2.reason


def test_the_last_look_takes_the_fewest_workers_when_only_they_fit(prices):
    """The last round ran 4 workers; an evaluation on 4 (worst case ~$0.0023 with finalisation)
    does not fit $0.00105, on 1 (~$0.0010) it does."""
    hist, job = _budget_history(0.00105, n=4)
    d = decide(job, hist, TIERS, prices)
    assert (d.action, d.rule, d.local_steps, d.workers) == ("train", "last_look", 0, 1), d.reason


def test_a_budget_stop_with_no_time_for_a_last_look_is_the_deadline_s_stop(prices):
    """$0.00105 left (an evaluation-only round's worst case fits, a training round's does not) and
    1 s to the deadline (an evaluation round and finalisation do not fit): no last look, but the
    stop is the deadline's, after which the controller evaluates the newest model (its limit set),
    not a budget stop that leaves the last trained round unmeasured (the tight-budget digits MLP
    jobs ended on round 0's starting metric so)."""
    hist, job = _budget_history(0.00105)
    job = job.model_copy(
        update={"constraints": job.constraints.model_copy(update={"deadline_seconds": hist.elapsed_s + 1.0})}
    )
    d = decide(job, hist, TIERS, prices)
    # the budget guard's stop, bound by the deadline (no time for the last look)
    assert (d.action, d.rule, d.bound) == ("stop", "budget_guard", "deadline"), d.reason
    assert d.worker_time_limit_s and d.worker_time_limit_s > 0
    # with time for the evaluation round it is the last look, as before
    roomy = job.model_copy(
        update={"constraints": job.constraints.model_copy(update={"deadline_seconds": hist.elapsed_s + 60.0})}
    )
    d = decide(roomy, hist, TIERS, prices)
    assert (d.action, d.rule, d.local_steps) == ("train", "last_look", 0), d.reason
    # and when the budget cannot pay even the evaluation, it stays a budget stop
    hist, job = _budget_history(0.0009)
    job = job.model_copy(
        update={"constraints": job.constraints.model_copy(update={"deadline_seconds": hist.elapsed_s + 1.0})}
    )
    d = decide(job, hist, TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "budget_guard", "budget"), d.reason


def test_no_round_is_trained_that_cannot_be_evaluated_before_the_deadline(prices):
    """A round's training shows only in the next round's record (at the latest the evaluation after
    the deadline's stop): with time for the shortest round and finalisation but not for the
    evaluation after it, the run stops (and is evaluated) instead of training a round that ends it
    late; with time for both it trains."""
    rounds = [make_round(i, n=1, m=1769, k=100, acc=0.3 + 0.05 * i) for i in range(4)]
    hist = make_history(rounds, params=100_000, rows=1437, val_rows=360)
    tm = TimingModel(JobShape.of(hist, 32), prices).fit(hist)
    f = tm.forecast([1] * len(TIERS), TIERS, [1] * len(TIERS), hist)
    shortest, eval_s = float(f.round_s.min()), float(f.eval_round_s.min())

    def job_with(t_left: float):
        return make_job(
            constraints={"deadline_seconds": hist.elapsed_s + t_left, "budget_usd": 1.0},
            training={"target_value": 0.97, "max_rounds": 500, "local_steps": 20},
        )

    d = decide(job_with(shortest + FINALIZE_S + 0.5 * eval_s), hist, TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "deadline", "deadline"), d.reason
    d = decide(job_with(shortest + eval_s + FINALIZE_S + 0.5), hist, TIERS, prices)
    assert d.action == "train" and d.local_steps > 0, d.reason


def test_a_budget_stop_with_too_little_for_an_evaluation_just_stops(prices):
    hist, job = _budget_history(0.0009)
    d = decide(job, hist, TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "budget_guard", "budget"), d.reason


def test_round_0_steps_at_most_its_bound_beyond_the_job_s_own_settings(prices):
    """Round 0: n up to C.step_up_x times the job's, k up to C.first_steps_up_x (C.step_up_x squared) times."""
    job = make_job(training={"target_value": 0.9, "max_rounds": 200, "local_steps": 20})
    hist = make_history([], params=100_000, rows=20_000, flops=None)
    n_max, k_max = step_reach(job, hist)
    assert C.first_steps_up_x == C.step_up_x**2
    assert (n_max, k_max) == (C.step_up_x * 4, C.first_steps_up_x * 20)
    cand = candidates(job, hist, TIERS)
    assert cand.k[cand.reach].max() <= k_max and cand.n[cand.reach].max() <= n_max
    assert cand.k.max() > k_max  # the plans beyond reach stay candidates for admission
    d = decide(job, hist, TIERS, prices)
    assert d.action == "train" and d.local_steps <= k_max and d.workers <= n_max, d.reason


def test_the_reach_grows_with_the_steps_workers_actually_took():
    job = make_job(training={"target_value": 0.9, "max_rounds": 200, "local_steps": 20})
    r0 = make_round(0, n=2, m=1769, k=300, acc=0.1)
    for t in r0.timings:  # cut at the limit after 60 of the 300 planned steps
        t.steps, t.cut = 60, True
    assert step_reach(job, make_history([r0])) == (C.step_up_x * 4, C.step_up_x * 60)
    r1 = make_round(1, n=8, m=1769, k=200, acc=0.2)
    n_max, k_max = step_reach(job, make_history([r0, r1]))
    assert (n_max, k_max) == (C.step_up_x * 8, C.step_up_x * 200)
    cand = candidates(job, make_history([r0, r1]), TIERS)
    assert set(np.unique(cand.k[cand.reach])) >= {800} and cand.k[cand.reach].max() == 800


def _ev(round_s, T90, ok90):
    f = SimpleNamespace(round_s=np.array(round_s), round_s_warm=np.array(round_s))
    return SimpleNamespace(f=f, T={0.9: np.array(T90)}, ok_deadline={0.9: np.array(ok90)})


def test_a_plan_that_finishes_by_the_deadline_itself_needs_no_way_out():
    """10 s left, the fastest plan (0) needs 8 s at p90. A 4 s round then that plan from scratch
    does not fit, but the plan (1) finishes by itself at p90 in 8.5 s: safe. A 1 s round (2) is
    safe the old way (one round, then the fast plan); a 4 s round that finishes by itself only at
    the median (3) is not."""
    ev = _ev([3.0, 4.0, 1.0, 4.0], [8.0, 8.5, 30.0, 40.0], [True, True, False, False])
    assert deadline_safe(ev, 0.9, 0, 10.0).tolist() == [True, True, True, False]


def _pick_of(objective, chosen, cost, T, deadline=100.0):
    job = make_job(constraints={"deadline_seconds": deadline, "objective": objective})
    x = SimpleNamespace(job=job, ev=SimpleNamespace(T={"mean": np.array(T)}))
    p = Pick(np.array(chosen), 0.9, None, objective, "")
    return _cheap_then_fast(x, p, np.array(cost))  # type: ignore[arg-type]  # the two fields it reads


def test_with_a_deadline_the_cost_headroom_buys_the_fastest_of_the_near_cheapest_plans():
    cost = [1.00, 1.05, 1.09, 1.20, 0.5]
    T = [40.0, 30.0, 20.0, 5.0, 1.0]
    chosen = [True, True, True, True, False]  # the cheapest overall is not allowed
    assert C.time_for_cost == 0.1
    assert _pick_of("cost", chosen, cost, T) == 2  # within 10 % of $1.00: the fastest
    assert _pick_of("cost", chosen, cost, T, deadline=None) == 0  # no deadline: the cheapest
    assert _pick_of("speed", chosen, T, T) == 3  # the speed objective is the time itself


def test_a_fast_plan_that_pays_its_own_way_needs_no_cheap_way_out():
    """$1.00 left; the cheapest plan (0) costs $0.50 at p90. Plan 1's worst round ($0.60) then
    plan 0 does not fit, but plan 1 pays its own way at p90: safe. Plan 2 (worst round $0.30) is
    safe the old way; plan 3 neither."""
    f = SimpleNamespace(cost_ub=np.array([0.2, 0.6, 0.3, 0.7]))
    ev = SimpleNamespace(f=f, C={0.9: np.array([0.5, 0.9, 3.0, 4.0])}, ok_budget={0.9: np.array([1, 1, 0, 0], bool)})
    assert budget_safe(ev, 0.9, 0, 1.0).tolist() == [True, True, True, False]  # type: ignore[arg-type]


def test_admission_judges_every_plan_not_only_those_within_the_next_rounds_reach(prices):
    """The step bound limits what round 0 tries, not what the job could do later: a job that needs
    many local steps per round is admitted as it would be without the bound (the bound once made the
    bench's digits jobs with 21 s deadlines 'infeasible' while the oracle met them)."""

    hist = make_history([], params=100_000, rows=11_500, flops=None)

    def verdicts(step_up):
        variant = PlannerConfig(step_up_x=step_up, first_steps_up_x=step_up**2)
        out = []
        for deadline in (15.0, 25.0, 40.0, 80.0, 160.0):
            job = make_job(
                training={"target_value": 0.97, "max_rounds": 200, "local_steps": 1, "batch_size": 32},
                workers={"planner": "adaptive", "initial": 1, "min": 1, "max": 64},
                constraints={"deadline_seconds": deadline, "budget_usd": 0.01},
            )
            out.append(decide(job, hist, TIERS, prices, config=variant).infeasible)
        return out

    bounded, unbounded = verdicts(C.step_up_x), verdicts(10**6)
    assert bounded == unbounded, (bounded, unbounded)
    assert not all(unbounded)  # some of these jobs are feasible


def test_best_effort_counts_the_rounds_the_budget_guard_lets_a_plan_pay(prices):
    """Round 0 of a digits-sized job on 8x the rows with a 21 s deadline and $0.00256, round 0's k
    held to C.step_up_x x the job's (with C.first_steps_up_x the 300-step plans fit at p70): nothing
    fits even at the p20 forecast, so best effort buys the most progress. The money rounds may
    spend is the budget less the hard guard's reserve (the last round's worst case beyond its mean,
    and finalisation's), so a plan with a dear worst case buys fewer rounds than its mean cost
    says. Counting rounds at the mean cost alone chose 4 workers (worst case $0.00197 of the
    $0.00256), and such runs stopped on their budget a round or two short; with the reserve
    counted, 2 workers ($0.00134)."""

    hist = RunHistory(train_rows=11_504, val_rows=359, dataset_bytes=2_945_024)
    job = make_job(
        constraints={"deadline_seconds": 21.0, "budget_usd": 0.00256},
        training={"target_value": 0.97, "max_rounds": 4000, "local_steps": 20},
    )
    variant = PlannerConfig(first_steps_up_x=C.step_up_x)
    d = decide(job, hist, [1024, 1769, 3008, 5120, 7168, 10240], prices, config=variant)
    assert (d.action, d.rule) == ("train", "best_effort"), d.reason
    assert d.workers <= 2 and d.predicted_round_cost_usd is not None, d.reason


def test_the_speed_objective_s_cheap_way_out_is_judged_at_the_budget_s_percentile():
    """Speed with $1.00 to spend: the fast plan (1) has a $0.40 worst round; the cheap plan (0)
    needs $0.80 at p90, $0.40 at the median. Judged at p90 the fast plan left no way out and the
    run took the cheap, slow one; at C.budget_q (the median, as every budget test) the fast plan
    is allowed (the hard guard keeps the bill within the budget either way)."""
    job = make_job(constraints={"budget_usd": 1.0, "objective": "speed"})
    yes = np.array([True, True])
    qs = (0.9, 0.7, 0.5, 0.2, 0.1)
    ev = SimpleNamespace(
        f=SimpleNamespace(cost_ub=np.array([0.1, 0.4])),
        C={0.9: np.array([0.8, 1.5]), 0.7: np.array([0.7, 1.3]), 0.5: np.array([0.4, 0.9]), 0.2: np.array([0.3, 0.7])},
        T={q: np.array([100.0, 10.0]) for q in qs},
        ok_rounds={q: yes for q in qs},
        ok_deadline={q: yes for q in qs},
        ok_budget={0.9: np.array([True, False]), 0.7: np.array([True, False]), 0.5: yes, 0.2: yes},
    )
    x = SimpleNamespace(job=job, ev=ev, spendable=1.0)
    chosen, level, backup = candidate_levels(x, yes, True)[0]  # type: ignore[arg-type]  # the fields it reads
    assert chosen.tolist() == [True, True] and backup == 0
