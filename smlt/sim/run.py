"""Run a planner against the simulated cloud, the way the state machine would.

Plan -> (stop: optional evaluation-only round, Finalize) | Train (Map) -> Aggregate (stops when
the round's model meets the target) -> Plan ...  The planner is any policy
(`smlt.runtime.planner.Policy`: `decide`, its ablations, the baselines). It reads what the
deployed planner reads (smlt/runtime/steps/plan.py `_history`): no FLOP count before the first
round, then the FLOPs per sample round 0's workers measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from smlt.runtime.config import FunctionSizes
from smlt.runtime.evaluation import target_reached
from smlt.runtime.job import Job, ModelSpec
from smlt.runtime.planner import Policy, round_memo
from smlt.runtime.planner.footprint import model_cost
from smlt.runtime.planner.types import RoundRecord, RunHistory
from smlt.runtime.prices import Prices
from smlt.sim.cloud import Cloud
from smlt.sim.workloads import Workload
from smlt.sim.world import World


@dataclass
class SimResult:
    reached: bool
    stop_reason: str
    stop_bound: str
    cost_usd: float
    elapsed_s: float
    rounds: int
    infeasible: bool = False
    final_metric: float | None = None
    decisions: list[dict] = field(default_factory=list)
    history: RunHistory | None = None
    plan_wall_s: float = 0.0

    def deadline_met(self, deadline: float | None) -> bool:
        return self.reached and (deadline is None or self.elapsed_s <= deadline)

    def budget_ok(self, budget: float | None) -> bool:
        return budget is None or self.cost_usd <= budget + 1e-12


def history_of(w: Workload, give_flops: bool = False, model: ModelSpec | None = None) -> RunHistory:
    """The run's history before round 0: what META and the job say (the world's FLOPs only if
    `give_flops`). As the deployed Plan step (`smlt/runtime/steps/plan.py` `first_footprint`), a job
    naming a built-in model gets its parameters and FLOPs computed from the architecture and the
    sample shape; a job whose model is not the workload's recorded one gets none (the world
    trains the recorded model, so nothing honest could be computed)."""
    first = model_cost(model, *w.sample_shape) if model is not None and model == w.model else None
    return RunHistory(
        param_count=w.params if give_flops else (first.params if first else 0),
        train_rows=w.train_rows,
        val_rows=w.val_rows,
        dataset_bytes=w.dataset_bytes,
        flops_per_sample=w.flops_per_sample if give_flops else (first.flops_per_sample if first else None),
    )


def _measured(hist: RunHistory, rec: RoundRecord, w: Workload) -> None:
    """A worker that trained measured the model's FLOPs per sample (smlt.runtime.train.measure); the
    next plan reads it from the round's record."""
    if hist.flops_per_sample is None and any(t.error is None and t.steps > 0 for t in rec.timings):
        hist.flops_per_sample = w.flops_per_sample
    hist.param_count = w.params  # the aggregator records the model's size with every round


def _met(job: Job, rec) -> bool:
    return target_reached(job.training, rec)


def simulate(
    job: Job,
    workload: Workload,
    planner: Policy,
    tiers: list[int],
    prices: Prices | None = None,
    seed: int = 0,
    architecture: str = "x86_64",
    keep_history: bool = False,
    max_rounds_hard: int = 5000,
    give_flops: bool = False,
    world: World | None = None,
    sizes: FunctionSizes | None = None,
) -> SimResult:
    """Run `planner` until it stops, or the target is met. `sizes`: the deployed functions' sizes
    the cloud runs with (None: `FunctionSizes()`, what the planner reads when given none)."""
    prices = prices or Prices()
    cloud = Cloud(workload, prices, architecture, seed, world=world, sizes=sizes or FunctionSizes())
    hist = history_of(workload, give_flops, job.model)
    memo: dict = {}  # the records never change once made: the planner's timing fits observe each once
    decisions = []
    plan_wall = 0.0
    reason, bound, reached, infeasible = "", "", False, False
    while True:
        t0 = time.perf_counter()
        with round_memo(memo):
            d = planner(job, hist, tiers, prices, architecture)
        plan_wall += time.perf_counter() - t0
        plan = cloud.plan_call()
        decisions.append(
            {
                "round": len(hist.rounds),
                "action": d.action,
                "n": d.workers,
                "m": d.memory_mb,
                "k": d.local_steps,
                "bound": d.bound,
                "rule": d.rule,
                "explore": d.explore,
                "reason": d.reason,
                "pred_round_s": d.predicted_round_s,
                "pred_cost": d.predicted_round_cost_usd,
            }
        )
        if d.action == "stop" or len(hist.rounds) >= max_rounds_hard:
            reason, bound, infeasible = d.reason, d.bound, d.infeasible
            fails = d.infeasible and not job.constraints.best_effort
            evaluate = d.evaluates_first and hist.rounds and hist.rounds[-1].local_steps > 0
            if fails or not evaluate:  # else the plan is part of the evaluation round's bill
                cloud.now += plan[0]
                cloud.cost += plan[1]
            if fails:
                break  # the controller fails the execution (Infeasible) before anything trains
            if evaluate:
                last = hist.rounds[-1]
                rec = cloud.run_round(
                    last.workers,
                    last.memory_mb,
                    0,
                    d.worker_time_limit_s or last.time_limit_s,
                    job.training.quorum,
                    plan=plan,
                )
                hist.rounds.append(rec)
                reached = _met(job, rec)
            cloud.finalize()
            break
        rec = cloud.run_round(
            d.workers, d.memory_mb, d.local_steps, d.worker_time_limit_s, job.training.quorum, plan=plan
        )
        hist.rounds.append(rec)
        _measured(hist, rec, workload)
        hist.elapsed_s = cloud.now
        hist.cost_total_usd = cloud.cost
        if _met(job, rec):  # the aggregator sees the target met: Finalize
            reached, reason, bound = True, f"target reached at round {rec.round}", "target"
            cloud.finalize()
            break
    final = getattr(hist.rounds[-1], job.training.target_metric) if hist.rounds else None
    return SimResult(
        reached=reached,
        stop_reason=reason,
        stop_bound=bound,
        cost_usd=cloud.cost,
        elapsed_s=cloud.now,
        rounds=sum(1 for r in hist.rounds if r.local_steps > 0),
        infeasible=infeasible,
        final_metric=final,
        decisions=decisions,
        history=hist if keep_history else None,
        plan_wall_s=plan_wall,
    )
