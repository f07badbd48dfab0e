"""The planner: each round, choose workers n, memory tier m and local steps k (or stop).

`decide(job, history, tiers, prices, architecture)` is the one entry point, a `Policy` (`policy`):
the job's planner, `fixed` or `adaptive`. The models behind it are in `timing` (round time and
cost) and `progress` (rounds still needed); the adaptive rule's steps are `stops`, `candidates`,
`evaluate`, `guards`, `feasibility`, `levels`, `pick` and `reasons` (docs/planner.md).
`round_memo()` lets a caller that refits on the same, unchanging records (the simulator) reuse
each round's timing observations.
numpy + pydantic only: this package runs in the planner Lambda on the numpy layer.
"""

from smlt.runtime.planner.policy import Policy, decide
from smlt.runtime.planner.timing import round_memo
from smlt.runtime.planner.types import Decision, RoundRecord, RunHistory, WorkerTiming

__all__ = ["decide", "Policy", "round_memo", "Decision", "RoundRecord", "RunHistory", "WorkerTiming"]
