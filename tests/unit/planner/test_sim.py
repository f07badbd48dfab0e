"""The simulated world the planner is benchmarked in (smlt/sim): replayed curves, drawn platform
constants, faults, the worker's early stop, and the baselines."""

import ast
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from smlt.runtime.job import parse_job
from smlt.runtime.planner import decide
from smlt.runtime.planner.types import RunHistory
from smlt.runtime.prices import Prices
from smlt.runtime.roundspec import COLD_START_ALLOWANCE_S, MIN_TASK_TIMEOUT_S, round_limits
from smlt.sim import curves as curves_mod
from smlt.sim.baselines import GuardedStatic, Static, ablation, oracle
from smlt.sim.cloud import Cloud
from smlt.sim.network import GIB, MIB, Link
from smlt.sim.run import simulate
from smlt.sim.schedulers import (
    FIRST_ROUND_S,
    FIRST_ROUND_SHARE,
    ProfiledFixed,
    SmltBO,
    profile_settings,
    run_profiled,
    run_smlt,
)
from smlt.sim.workloads import WORKLOADS
from smlt.sim.world import KINDS, World

TIERS = [1024, 1769, 3008, 5120, 10240]
SIM = Path(curves_mod.__file__).parent


def _job(planner="adaptive", target=0.9, **c):
    return parse_job(
        {
            "dataset": {"uri": "s3://b/d/"},
            "training": {"target_value": target, "max_rounds": 300},
            "constraints": c,
            "workers": {"planner": planner, "max": 32},
        }
    )


def test_the_world_imports_none_of_the_planners_models():
    """Ground truth the planner did not write: no module of smlt/sim imports its progress, timing
    or priors (the baselines call the planner itself, nothing else of it)."""
    banned = {"smlt.runtime.planner.progress", "smlt.runtime.planner.timing", "smlt.runtime.planner.priors"}
    for path in SIM.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not names & banned, (path.name, names & banned)


def test_replay_at_a_recorded_setting_follows_the_recorded_curve():
    w = WORKLOADS["digits-mlp"]
    run = next(r for r in w.data["runs"] if r["workers"] == 4 and r["local_steps"] == 20)
    pts = np.array(run["curve"], float)
    best = np.maximum.accumulate(pts[:, 3])
    acc = w.curves.acc0
    per_round = 4 * 20 * w.batch
    for r in range(1, len(pts)):
        acc = w.curves.advance(acc, 4, 20, per_round)
        assert acc == pytest.approx(best[r], abs=0.01), r


def test_interpolated_settings_lie_between_the_recorded_ones():
    c = WORKLOADS["digits-cnn"].curves
    target = WORKLOADS["digits-cnn"].target
    ns = sorted({r["workers"] for r in c.data["runs"]})
    lo, hi = c.samples_to(target, ns[0], 20), c.samples_to(target, ns[1], 20)
    mid = c.samples_to(target, math.sqrt(ns[0] * ns[1]), 20)
    assert min(lo, hi) <= mid <= max(lo, hi)
    # beyond the grid: never fewer samples than at its edge, at most proportionally more
    edge, far = c.samples_to(target, ns[-1], 20), c.samples_to(target, 4 * ns[-1], 20)
    assert edge <= far <= 4.01 * edge or math.isinf(far)


def test_a_plan_change_continues_from_where_the_model_stands():
    c = WORKLOADS["digits-mlp"].curves
    a1 = c.advance(c.acc0, 4, 20, 2560)
    a2 = c.advance(a1, 16, 5, 2560)
    assert c.acc0 < a1 <= a2
    assert c.advance(a2, 16, 5, 0) == a2


def test_worlds_are_drawn_per_seed_and_the_noisy_one_is_noisier():
    calm = [World.draw(s, "calm", "cnn") for s in range(20)]
    noisy = [World.draw(s, "noisy", "cnn") for s in range(20)]
    assert len({w.init_median_s for w in calm}) == 20  # each seed its own constants
    assert all(2.5 <= w.init_median_s <= 5.0 for w in calm)
    assert all(w.straggler_p == 0.02 for w in calm) and all(w.straggler_p == 0.10 for w in noisy)
    assert np.median([w.worker_sigma for w in noisy]) > 3 * np.median([w.worker_sigma for w in calm])
    assert np.median([w.init_median_s for w in noisy]) > 1.3 * np.median([w.init_median_s for w in calm])
    with pytest.raises(ValueError, match="world kind"):
        World.draw(0, "stormy")  # type: ignore[arg-type]  # the error a bad kind gets


def test_cloud_records_like_the_real_system():
    w = WORKLOADS["digits-cnn"].scaled(8)
    cloud = Cloud(w, Prices(), seed=3, faults=False)
    first = cloud.run_round(4, 1769, 20, time_limit_s=None)
    second = cloud.run_round(4, 1769, 20, time_limit_s=None)
    assert first.workers == first.workers_ok == 4 and len(first.timings) == 4
    assert all(t.cold and t.init_s > 0 and t.cache_miss for t in first.timings)  # fresh instances
    assert not any(t.cold or t.cache_miss for t in second.timings)  # warm, shards cached
    assert all(t.steps == 20 and t.samples == 20 * w.batch and not t.cut for t in second.timings)
    assert first.cost_usd > second.cost_usd > 0 and first.round_s > second.round_s
    assert first.val_accuracy is not None and 0 <= first.val_accuracy <= 1


def test_a_cut_worker_keeps_its_partial_update_like_the_real_worker():
    """smlt/runtime/steps/train.py stops at 0.8 x the compute limit after at least one step and its
    update counts with the samples it did: the round is applied, not voided."""
    w = WORKLOADS["digits-cnn"].scaled(8)
    cloud = Cloud(w, Prices(), seed=3, faults=False)
    cloud.run_round(4, 1024, 20, time_limit_s=None)  # warm up: the cut round is a warm one
    before = cloud.acc
    limit = 3.0
    cut = cloud.run_round(4, 1024, 5000, time_limit_s=limit)
    assert cut.workers_ok == 4
    for t in cut.timings:
        assert t.error is None and t.cut and 1 <= t.steps < 5000 and t.samples == t.steps * w.batch
        assert t.load_s + t.eval_s + (t.steps - 1) * t.compute_s / t.steps <= 0.8 * limit + 1e-9
    assert cloud.acc > before


def test_round_0_keeps_the_planner_s_compute_limit_as_the_controller_gives_it():
    """smlt/runtime/steps/plan.py passes the planner's limit to round 0's workers as their compute limit
    (`round_limits`); the world cuts them there too, and its Map task waits the limit plus the
    cold start's allowance (twice the init cap), not the function's timeout."""
    w = WORKLOADS["digits-cnn"].scaled(8)
    cloud = Cloud(w, Prices(), seed=3, faults=False)
    limit = 3.0
    first = cloud.run_round(2, 1024, 5000, time_limit_s=limit)
    assert first.workers_ok == 2
    for t in first.timings:
        assert t.cold and t.error is None and t.cut and 1 <= t.steps < 5000
        assert t.load_s + t.eval_s + (t.steps - 1) * t.compute_s / t.steps <= 0.8 * limit + 1e-9
    assert round_limits(limit, first=True) == (limit, limit + COLD_START_ALLOWANCE_S)


def test_round_limits_of_a_plan():
    """A warm round: the limit, its task never under 10 s and waiting for the waves before it;
    round 0: the cold start's cap on top; a resumed run's first round: none."""
    assert round_limits(None) == (None, None)
    assert round_limits(4.0) == (4.0, MIN_TASK_TIMEOUT_S)
    assert round_limits(6.0, waves=3) == (6.0, 18.0)
    assert round_limits(6.0, waves=3, first=True) == (6.0, 18.0 + COLD_START_ALLOWANCE_S)
    assert round_limits(6.0, first=True, resumed=True) == (None, None)


def test_too_little_memory_runs_out_of_memory():
    w = WORKLOADS["resnet18"] if "resnet18" in WORKLOADS else WORKLOADS["digits-cnn"]
    small = Cloud(dataclasses.replace(w), Prices(), seed=1, faults=False)
    tier = 128 if w.fits(1024) else 1024
    rec = small.run_round(2, tier, 1, time_limit_s=60)
    assert all(t.error == "OutOfMemory" for t in rec.timings) and rec.workers_ok == 0


def test_duplicates_and_retries_are_billed():
    w = WORKLOADS["digits-mlp"]
    world = World.draw(2, "calm", "mlp")
    clean = Cloud(w, Prices(), seed=2, world=world, faults=False)
    dup = Cloud(w, Prices(), seed=2, world=dataclasses.replace(world, duplicate_p=1.0), faults=True)
    a, b = clean.run_round(4, 1769, 20, None), dup.run_round(4, 1769, 20, None)
    assert clean.last_bill is not None and dup.last_bill is not None
    assert dup.last_bill.requests.lambda_invocations == clean.last_bill.requests.lambda_invocations + 4
    assert b.cost_usd > a.cost_usd


def test_an_overrun_is_one_slowdown_whatever_the_plan():
    """An overrun slows the handler 2-5x for every plan: a round whose Map task times out first
    loses the worker (billed for all it ran), a plan without a task timeout waits for it."""
    w = WORKLOADS["digits-mlp"]
    world = World.draw(2, "calm", "mlp")
    only = dataclasses.replace(world, throttle_p=0.0, duplicate_p=0.0, overrun_p=1.0)

    def pair(k: int, limit: float | None):
        clean = Cloud(w, Prices(), seed=2, world=world, faults=False)
        over = Cloud(w, Prices(), seed=2, world=only, faults=True)
        for c in (clean, over):  # warm the tier first, the same way
            c.run_round(4, 1769, k, None)
        return clean.run_round(4, 1769, k, limit), over.run_round(4, 1769, k, limit)

    # no limit: every worker slowed 2-5x, none lost
    a, b = pair(20, None)
    assert b.workers_ok == 4 and all(2.0 <= y.total_s / x.total_s <= 5.0 for x, y in zip(a.timings, b.timings))
    # a long round whose slowed workers pass the Map task's timeout: lost to the round, billed on
    long_k = 12_000  # ~4-8 s a handler here, so 2-5x passes a 10 s task timeout
    a, b = pair(long_k, None)
    limit = 1.2 * max(t.total_s for t in a.timings)
    a, b = pair(long_k, limit)
    lost = [t for t in b.timings if t.error == "TimeLimit"]
    assert lost and all(t.total_s > max(limit, 10.0) for t in lost) and b.workers_ok == 4 - len(lost)
    assert b.cost_usd > a.cost_usd


def test_the_planner_reads_flops_only_once_the_workers_measured_them():
    seen = []

    def planner(job, h, tiers, prices, arch):
        seen.append(h.flops_per_sample)
        return decide(job, h, tiers, prices, arch)

    w = WORKLOADS["digits-mlp"]
    simulate(_job(target=w.target, deadline_seconds=300.0, budget_usd=0.05), w, planner, TIERS, seed=5)
    assert seen[0] is None and len(seen) > 1 and all(f == w.flops_per_sample for f in seen[1:])


def test_short_adaptive_run_meets_target_within_budget():
    w = WORKLOADS["digits-mlp"]
    job = _job(target=w.target, deadline_seconds=300.0, budget_usd=0.05)
    r = simulate(job, w, decide, TIERS, seed=5, keep_history=True)
    assert r.reached and r.cost_usd <= 0.05 and r.elapsed_s <= 300.0
    assert all(d["reason"] for d in r.decisions)


def test_budget_never_exceeded_in_simulation():
    """Property over random budgets, deadlines, seeds and both worlds, faults on."""
    rng = np.random.default_rng(11)
    for trial in range(6):
        w = WORKLOADS[str(rng.choice(["digits-mlp", "digits-cnn"]))]
        budget = float(10 ** rng.uniform(-3.0, -1.5))
        job = _job(target=w.target, deadline_seconds=float(10 ** rng.uniform(1, 2.5)), budget_usd=budget)
        world = World.draw(int(rng.integers(1e6)), "noisy" if trial % 2 else "calm", w.family)
        r = simulate(job, w, decide, TIERS, seed=world.seed, world=world)
        assert r.cost_usd <= budget + 1e-12, (trial, r.cost_usd, budget, r.stop_reason)


def test_oracle_smlt_and_ablations_run_in_the_same_world():
    w = WORKLOADS["digits-mlp"]
    world = World.draw(2, "calm", w.family)
    job = _job(target=w.target, deadline_seconds=120.0, budget_usd=0.05)
    cfg, res = oracle(job, w, TIERS, Prices(), 2, world)
    assert cfg is not None and res is not None and res.reached and res.cost_usd <= 0.05
    for run in (run_smlt, run_profiled):
        r = run(job, w, TIERS, Prices(), 2, world)
        assert r.rounds >= 1 and math.isfinite(r.cost_usd)
    # round 0's plan held: a history whose round 0 no planner would choose (k = 7)
    h = simulate(job, w, Static(3, 1024, 7, time_cap=0.0), TIERS, seed=2, world=world, keep_history=True).history
    assert h is not None and h.rounds[0].local_steps == 7
    held = ablation("static_plan")(
        job, RunHistory(rounds=h.rounds[:1], param_count=w.params, train_rows=w.train_rows), TIERS, Prices(), "x86_64"
    )
    assert held.action == "stop" or (held.workers, held.memory_mb, held.local_steps) == (3, 1024, 7)
    for name in ("static_plan", "workers_only"):
        a = simulate(job, w, ablation(name), TIERS, seed=2, world=world, keep_history=True)
        assert a.history is not None and a.history.rounds
        trained = [x for x in a.history.rounds if x.local_steps > 0]
        if name == "static_plan":
            assert len({(x.workers, x.memory_mb, x.local_steps) for x in trained}) == 1
        else:
            assert {x.local_steps for x in trained} == {job.training.local_steps}


def test_smlt_stops_at_the_budget_at_the_smallest_fitting_tier():
    w = WORKLOADS["digits-cnn"].scaled(8)
    world = World.draw(4, "calm", w.family)
    job = _job(target=0.99, budget_usd=0.02)
    r = run_smlt(job, w, TIERS, Prices(), 4, world)
    assert r.cost_usd <= 0.02 and r.stop_bound == "budget" and r.rounds >= 2
    r = simulate(job, w, SmltBO(w.smallest_tier(TIERS)), TIERS, seed=4, world=world, keep_history=True)
    assert r.history is not None and {x.memory_mb for x in r.history.rounds} == {w.smallest_tier(TIERS)}


def test_the_users_baselines_never_pass_the_budget():
    """Their stop rule (`schedulers.Observed.stop`): over random budgets, deadlines, seeds and both
    worlds, faults on, neither user's baseline spends more than its budget."""
    rng = np.random.default_rng(5)
    trained = []
    for trial in range(6):
        w = WORKLOADS[str(rng.choice(["digits-mlp", "digits-cnn"]))].scaled(8)
        budget = float(10 ** rng.uniform(-2.5, -1.5))
        job = _job(target=0.99, deadline_seconds=float(10 ** rng.uniform(1.5, 3)), budget_usd=budget)
        world = World.draw(int(rng.integers(1e6)), "noisy" if trial % 2 else "calm", w.family)
        for run in (run_smlt, run_profiled):
            r = run(job, w, TIERS, Prices(), world.seed, world)
            assert r.cost_usd <= budget + 1e-12, (trial, run.__name__, r.cost_usd, budget)
            trained.append(r.rounds)
    assert sum(1 for x in trained if x >= 3) >= 6, trained  # most spent their budget on rounds, not refused it


def test_smlt_profiles_then_searches_workers_and_local_steps():
    """The profile first (one worker's long round, capped in round 0, then the job's steps on 4, 1
    and 16 workers), then GP-UCB's choice of (workers, local steps) among the settings its own
    estimate says meet the deadline, and it never spends past the budget."""
    w = WORKLOADS["transformer"].scaled(8)
    world = World.draw(3, "calm", w.family)
    job = _job(target=w.target, deadline_seconds=3000.0, budget_usd=0.5)  # room for the whole profile
    bo = SmltBO(w.smallest_tier(TIERS))
    assert bo.settings(job) == [(1, 500), (4, 20), (1, 20), (16, 20)]
    r = simulate(job, w, bo, TIERS, seed=3, world=world, keep_history=True)
    assert r.history is not None
    profiled = [d for d in r.decisions if d["reason"] == "SMLT: profile"]
    assert len(profiled) >= 3  # the 16 workers' round only while the pace leaves room for it
    assert [(x.workers, x.local_steps) for x in r.history.rounds[: len(profiled)]] == bo.settings(job)[: len(profiled)]
    assert [x.time_limit_s for x in r.history.rounds[:2]] == [FIRST_ROUND_S, None]  # round 0 capped
    chosen = [d for d in r.decisions[len(profiled) :] if d["reason"].startswith("SMLT: GP-UCB")]
    assert chosen and r.cost_usd <= 0.5 and r.rounds > len(profiled)


def test_a_short_deadline_gets_a_short_profile():
    """A user with a 24-s deadline (rounds of ~5 s) profiles one setting, not four: round 0 capped
    at `FIRST_ROUND_SHARE` of the deadline, then GP-UCB from what it showed; the deadline is met."""
    w = WORKLOADS["digits-cnn"]
    world = World.draw(3, "calm", w.family)
    job = _job(target=w.target, deadline_seconds=24.0, budget_usd=0.0036)
    r = simulate(job, w, SmltBO(w.smallest_tier(TIERS)), TIERS, seed=3, world=world, keep_history=True)
    assert r.history is not None and r.history.rounds[0].time_limit_s == FIRST_ROUND_SHARE * 24.0
    assert [d["reason"] for d in r.decisions].count("SMLT: profile") == 1
    assert r.reached and r.deadline_met(24.0) and r.budget_ok(0.0036)


def test_the_fixed_plan_from_a_profile_holds_the_cheapest_that_meets_the_deadline():
    w = WORKLOADS["transformer"].scaled(8)
    world = World.draw(3, "calm", w.family)
    job = _job(target=w.target, deadline_seconds=600.0, budget_usd=0.5)
    settings = profile_settings(job, w.smallest_tier(TIERS), TIERS)
    assert len(settings) == 5 and len({m for _, m, _ in settings}) == 2
    assert [(n, k) for n, _, k in settings[:3]] == [(1, 500), (1, 100), (1, 20)]  # one worker's long rounds first
    plan = ProfiledFixed(settings)
    r = simulate(job, w, plan, TIERS, seed=3, world=world, keep_history=True)
    assert r.history is not None and plan.held in settings
    trained = r.history.rounds[len(settings) :]
    assert trained and {(x.workers, x.memory_mb, x.local_steps) for x in trained if x.local_steps} == {plan.held}


def _run(n, k, accs, per_round):
    return {"workers": n, "local_steps": k, "curve": [[r, r * per_round, 2.0 - a, a] for r, a in enumerate(accs)]}


def test_a_run_cut_short_continues_and_a_plateau_stays():
    """The recording's end is not the curve's end when the run was still learning; a run that
    flattened for many evaluations stays flat."""
    fast = [0.1, 0.3, 0.5, 0.7, 0.8, 0.85, 0.88, 0.9]
    short = [0.1, 0.2, 0.3]  # 3 evaluations, still rising: cut short by the recording
    flat = [0.1, 0.4, 0.5, 0.52, 0.52, 0.52, 0.52, 0.52]  # a plateau
    data = {
        "name": "t",
        "runs": [_run(1, 5, fast, 100), _run(1, 20, flat, 100), _run(4, 5, short, 100), _run(4, 20, fast, 400)],
    }
    c = curves_mod.Curves(data)
    assert math.isfinite(c.samples_to(0.85, 4, 5))  # continued along its neighbour
    assert c.samples_to(0.85, 4, 5) > c.samples_to(0.85, 1, 5)  # at its own, slower pace
    assert math.isinf(c.samples_to(0.85, 1, 20))  # the plateau is kept


def test_the_guarded_oracle_keeps_smlt_s_budget_guard():
    """`GuardedStatic` (the guarded oracle's plans) stops where smlt's fixed planner would: before a
    round whose worst case plus finalisation's does not fit; the plain oracle's `Static` spends on."""
    w = WORKLOADS["digits-mlp"]
    world = World.draw(3, "calm", w.family)
    plan = (1, 1769, 200)
    ample = _job(target=w.target, deadline_seconds=120.0, budget_usd=0.05)
    g = simulate(ample, w, GuardedStatic(*plan), TIERS, seed=3, world=world, keep_history=True)
    assert g.reached and g.history is not None
    # its workers get the limit the worst case assumes (round 0: the probe's)
    assert all(r.time_limit_s and r.time_limit_s > 0 for r in g.history.rounds)
    # a budget above one round's expected bill but under its worst case: the guard refuses round 0
    tight = _job(target=w.target, deadline_seconds=120.0, budget_usd=0.8 * g.cost_usd / len(g.history.rounds))
    refused = simulate(tight, w, GuardedStatic(*plan), TIERS, seed=3, world=world)
    budget = tight.constraints.budget_usd
    assert refused.rounds == 0 and refused.stop_bound == "budget" and refused.cost_usd <= budget  # the planner's call
    spent = simulate(tight, w, Static(*plan), TIERS, seed=3, world=world)
    assert spent.rounds >= 1 and spent.cost_usd > refused.cost_usd
    cfg, _ = oracle(tight, w, TIERS, Prices(), 3, world, guard=True)
    assert cfg is None


def test_a_function_s_network_bursts_then_holds_its_sustained_rate():
    """smlt.sim.network: a token bucket (facts.md: ~1.2 GiB/s for ~250 ms, then ~75 MiB/s)."""
    link = Link(burst_mbps=1288.0, sustained_mbps=78.6, bucket_mb=315.0)
    s, left = link.transfer(100.0, 315.0)
    assert s == pytest.approx(100.0 / 1288.0) and 0 < left < 315.0
    burst_s = 315.0 / (1288.0 - 78.6)  # how long a full bucket carries the burst rate
    assert burst_s == pytest.approx(0.26, abs=0.01)  # facts.md: ~250 ms
    s, left = link.transfer(1000.0, 315.0)
    assert s == pytest.approx(burst_s + (1000.0 - 1288.0 * burst_s) / 78.6) and left == 0.0
    assert link.transfer(50.0, 0.0)[0] == pytest.approx(50.0 / 78.6)  # an empty bucket: sustained
    # an idle function refills at the sustained rate, up to the bucket
    assert link.refill(0.0, 2.0) == pytest.approx(157.2) and link.refill(0.0, 60.0) == 315.0


def test_the_world_draws_its_network_around_the_published_figures():
    worlds = [World.draw(s, kind, "cnn") for s in range(20) for kind in KINDS]
    burst = np.array([w.net_burst_mbps for w in worlds]) / GIB
    sustained = np.array([w.net_sustained_mbps for w in worlds]) / MIB
    bucket = np.array([w.net_bucket_mb for w in worlds]) / MIB
    assert ((0.9 <= burst) & (burst <= 1.5)).all() and abs(np.median(burst) - 1.2) < 0.15
    assert ((55 <= sustained) & (sustained <= 95)).all() and abs(np.median(sustained) - 75) < 10
    assert ((200 <= bucket) & (bucket <= 400)).all() and abs(np.median(bucket) - 300) < 50
    assert len(set(burst)) == len(set(sustained)) == len(set(bucket)) == len(worlds) // 2 * 2


def test_the_world_s_network_is_the_same_at_every_memory_size():
    w = WORKLOADS["resnet18"]  # a 45 MB model
    small, big = (Cloud(w, Prices(), seed=4, faults=False).run_round(4, m, 20, None) for m in (1769, 10240))
    assert [t.load_s for t in small.timings] == pytest.approx([t.load_s for t in big.timings])
    assert all(t.compute_s > u.compute_s for t, u in zip(small.timings, big.timings, strict=True))


def test_a_warm_worker_s_bucket_refills_between_rounds():
    """A 600 MB model: round 0's upload drains the worker's bucket; a round that starts right after
    it loads from a partly refilled bucket, one that starts 60 s later from a full one."""
    w = dataclasses.replace(WORKLOADS["resnet18"], data={**WORKLOADS["resnet18"].data, "params": 150_000_000})
    soon, later = Cloud(w, Prices(), seed=5, faults=False), Cloud(w, Prices(), seed=5, faults=False)
    for cloud in (soon, later):
        cloud.run_round(1, 10240, 1, None)
    later.now += 60.0
    a, b = soon.run_round(1, 10240, 1, None), later.run_round(1, 10240, 1, None)
    assert not any(t.cold or t.cache_miss for t in a.timings + b.timings)  # the same warm instance
    link = later.w.link
    full_s = link.transfer(600.0, link.bucket_mb)[0]
    assert b.timings[0].load_s == pytest.approx(later.w.get_s + full_s, rel=0.35)  # noise: bw_sigma 0.15
    assert a.timings[0].load_s > b.timings[0].load_s + 0.2  # the burst it had not got back
