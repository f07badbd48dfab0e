"""The planner: each round, choose workers n, memory tier m and local steps k (or stop).

`decide(job, history, tiers, prices, architecture)` is the one entry point; the models behind
it are in `timing` (round time and cost), `progress` (rounds still needed) and `core` (the rule).
`round_memo()` lets a caller that refits on the same, unchanging records (the simulator) reuse
each round's timing observations.
numpy + pydantic only: this package runs in the planner Lambda on the numpy layer.
"""

from smlt.runtime.planner.core import decide
from smlt.runtime.planner.timing import round_memo
from smlt.runtime.planner.types import Decision, RoundRecord, RunHistory, WorkerTiming

__all__ = ["decide", "round_memo", "Decision", "RoundRecord", "RunHistory", "WorkerTiming"]
