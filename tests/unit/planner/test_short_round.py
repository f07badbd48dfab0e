"""The shorter-round probe (issue #12): a long-round plan with many rounds left trains k / 4 steps
every second round from round 4, at the same workers and memory, if that round passes the hard
guards, and its reason says so."""

from types import SimpleNamespace

import numpy as np

from smlt.runtime.planner import decide
from smlt.runtime.planner.config import DEFAULT as C
from smlt.runtime.planner.pick import Pick, _short_round_probe

from .conftest import TIERS, make_history, make_job, make_round

# candidates: (n, m, k); plan 0 is the pick
N = np.array([4.0, 4.0, 4.0, 4.0, 8.0, 4.0])
M = np.array([1769.0, 1769.0, 1769.0, 1769.0, 1769.0, 3008.0])
K = np.array([300.0, 50.0, 80.0, 120.0, 80.0, 80.0])


def _probe(rounds=4, k=300.0, left=20.0, guard=(True,) * 6, note=""):
    cand = SimpleNamespace(n=N, m=M, k=np.where(np.arange(6) == 0, k, K))
    x = SimpleNamespace(
        cand=cand,
        history=SimpleNamespace(rounds=[None] * rounds),
        ev=SimpleNamespace(R={0.5: np.full(6, left)}),
        describe=lambda i: f"plan {i}",
    )
    p = Pick(np.ones(6, bool), 0.9, None, "cost", note)
    return _short_round_probe(x, p, np.array(guard))  # type: ignore[arg-type]  # the fields it reads


def test_a_long_round_plan_trains_a_quarter_of_its_steps_every_third_round():
    assert (C.short_round_every, C.short_round_x) == (2, 4)
    p = _probe()
    assert p.i == 2 and p.i_exploit == 0 and p.explore  # 80 steps: the nearest to 300 / 4, same n and m
    assert "exploring a shorter round: 80 steps instead of 300" in p.probe
    assert _probe(rounds=6).i == 2
    assert _probe(note="best effort: the target may not be reached").i == 2  # best effort too


def test_no_probe_off_the_cycle_early_on_short_plans_or_near_the_end():
    for p in (
        _probe(rounds=3),
        _probe(rounds=5),
        _probe(rounds=2),
        _probe(rounds=0),
        _probe(k=80.0),
        _probe(left=5.0),
    ):
        assert p.i == 0 and not p.probe and not p.explore


def test_the_shorter_round_must_pass_the_hard_guards():
    p = _probe(guard=(True, True, False, True, True, True))  # 80 steps at this n and m is not allowed
    assert p.i == 1  # the next nearest allowed: 50 steps (log distance 0.41 vs 120's 0.47)
    p = _probe(guard=(True, False, False, False, True, True))  # none at this n and m
    assert p.i == 0 and not p.probe


def test_the_decision_records_the_probe_in_its_notes(prices):
    """Through `decide`: round 4 of a run of 100-step rounds with many rounds left is the probe
    (k / 4 of the plan, `notes` says so); round 5 is not."""

    def plan_after(n_rounds):
        rounds = [make_round(i, n=1, m=1769, k=100, acc=0.1 + 0.02 * i) for i in range(n_rounds)]
        hist = make_history(rounds, params=100_000, rows=20_000, val_rows=2000)
        job = make_job(
            constraints={"deadline_seconds": hist.elapsed_s + 3600, "budget_usd": 5.0},
            training={"target_value": 0.9, "max_rounds": 500, "local_steps": 20},
        )
        return decide(job, hist, TIERS, prices)

    probe, plain = plan_after(4), plan_after(5)
    assert (probe.action, probe.rule, probe.notes) == ("train", "feasible", ["short_round"]), probe.reason
    assert probe.explore and probe.local_steps < plain.local_steps
    assert (plain.action, plain.rule, plain.notes) == ("train", "feasible", []), plain.reason
