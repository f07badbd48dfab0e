"""The planner with parts of its choice taken away, to measure what each part buys (bench).

Both are policies (`smlt.runtime.planner.Policy`, with `decide`'s signature), so a simulator
runs them like the planner itself; they keep every stop rule (target, budget and deadline guards,
admission control), only the plan's dimensions are held:

- `workers_only`: chooses the number of workers; the memory tier is the smallest deployed one
  that fits the model (the next one up after an out-of-memory round) and the local steps are the
  job's, as in SMLT's scheduler.
- `static_plan`: plans round 0 as usual, then holds that round's (n, m, k) for the whole run
  (what re-planning every round buys).
"""

from __future__ import annotations

from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import Job
from smlt.runtime.planner import decide
from smlt.runtime.planner.candidates import Hold, tiers_usable
from smlt.runtime.planner.types import Decision, RunHistory
from smlt.runtime.prices import Prices


def workers_only(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    architecture: str = "x86_64",
    sizes: FunctionSizes | None = None,
) -> Decision:
    """`decide` choosing n only: the smallest fitting tier, the job's local steps."""
    tier = tiers_usable(job, history, list(tiers) or [job.workers.memory_mb or 2048])[0]
    hold = Hold(memory_mb=tier, local_steps=job.training.local_steps)
    return decide(job, history, tiers, prices, architecture, sizes, hold=hold)


def static_plan(
    job: Job,
    history: RunHistory,
    tiers: list[int],
    prices: Prices,
    architecture: str = "x86_64",
    sizes: FunctionSizes | None = None,
) -> Decision:
    """`decide` at round 0, then that round's (n, m, k) held for every later round."""
    first = next((r for r in history.rounds if r.local_steps > 0), None)
    hold = None if first is None else Hold(first.workers, first.memory_mb, first.local_steps)
    return decide(job, history, tiers, prices, architecture, sizes, hold=hold)
