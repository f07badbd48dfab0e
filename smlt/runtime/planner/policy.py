"""The planner's one interface, `Policy`, and the deployed planner behind it, `decide`.

A policy plans the next round of a job from its history: train (n workers, m MB, k local steps)
or stop, with a reason. The planner Lambda (smlt/runtime/steps/plan.py) and the simulator
(`smlt.sim.run.simulate`) call every policy alike. The policies:

- `decide`: the deployed planner; the job's `workers.planner` chooses between
  - `fixed.decide_fixed`: the job's own plan under the stops and guards, and
  - `adaptive.decide_adaptive`: the plan chosen every round from the run's models;
- the ablations (`smlt.sim.ablations`): `decide` with dimensions of its plan held;
- the benchmark's baselines (`smlt.sim.baselines`: the oracle's fixed plans; `smlt.sim.schedulers`:
  the users' SMLT-style scheduler and fixed plan from a profile).

The benchmark's policies live in smlt.sim, outside the planner Lambda's package. The deployed
functions' sizes are bound before the call (`decide`'s `sizes`, a baseline's constructor).
numpy + pydantic only (planner Lambda).
"""

from __future__ import annotations

from typing import Protocol

from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner.adaptive import decide_adaptive, planning_history
from smlt.runtime.planner.candidates import Hold
from smlt.runtime.planner.config import PlannerConfig, using
from smlt.runtime.planner.fixed import decide_fixed
from smlt.runtime.planner.types import Decision, RunHistory
from smlt.runtime.prices import Prices


class Policy(Protocol):
    """Plan the next round of `job` from its `history` on the deployed memory `tiers`, priced by
    `prices` for `architecture`: train (n, m, k) or stop, with a reason."""

    def __call__(
        self, job: Job, history: RunHistory, tiers: list[int], prices: Prices, architecture: str, /
    ) -> Decision: ...


def decide(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    architecture: str = "x86_64",
    sizes: FunctionSizes | None = None,
    *,
    hold: Hold | None = None,
    config: PlannerConfig | None = None,
) -> Decision:
    """Plan the next round of `job` from its `history`: train (n, m, k) or stop, with a reason.
    `sizes`: the deployed planner/aggregator memory and worker timeout (a function's Settings;
    None reads them from the environment, or cdk.json without one). `hold`: dimensions held
    fixed (ablations; the adaptive planner only). `config`: the decision rule's constants (None:
    the active ones, `config.active`; the deployed defaults unless a caller set a variant)."""
    with using(config):
        return _decide(job, history, tiers, prices, architecture, sizes, hold)


def _decide(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    architecture: str,
    sizes: FunctionSizes | None,
    hold: Hold | None,
) -> Decision:
    if not tiers:
        tiers = [job.workers.memory_mb or 2048]
    sizes = sizes or FunctionSizes()
    if job.workers.planner == "fixed":
        return decide_fixed(job, history, list(tiers), prices, architecture, sizes)
    decision = decide_adaptive(job, history, list(tiers), prices, architecture, sizes, hold)
    planned_on = planning_history(history)
    if planned_on is history or decision.action == "stop":
        return decision
    return decide_adaptive(job, planned_on, list(tiers), prices, architecture, sizes, hold)
