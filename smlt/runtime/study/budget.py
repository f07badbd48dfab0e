"""The study's budget and deadline rules, pure.

Budget: every trial runs under its own `constraints.budget_usd`, a share the study reserves when
the trial starts: what is not reserved yet, split evenly over the trials not started yet. When a
trial ends, its reservation is replaced by its ledger, so what an early-stopped trial did not
spend goes back to the trials still to start. The reservations and ledgers never sum past the
study budget, and since each run's planner never spends past its own budget, the trials' ledgers
never do either. (A share never shrinks: reserving share = free/left leaves the same free/left
for the next trial, and every trial that ends under its share raises it.)

Deadline: a trial starts only while `min_trial_seconds` are left, with its own deadline the time
left less a margin for the planner's stop, its evaluation round and Finalize; the watcher asks
the trials still running to stop when the study's deadline comes.
"""

from __future__ import annotations

from smlt.runtime.prices import Prices

# Seconds kept back from a trial's deadline: the stop takes one Plan, an evaluation round and
# Finalize after the planner's last decision (a few seconds on AWS, about one on the local engine).
DEADLINE_MARGIN_S = 10.0


def share(budget_usd: float, reserved_usd: float, trials_left: int) -> float:
    """The budget of the next trial to start: the free budget split over the trials left (it included)."""
    if trials_left < 1:
        raise ValueError("no trial left to start")
    return max(0.0, budget_usd - reserved_usd) / trials_left


def settle(reserved_usd: float, share_usd: float, cost_usd: float) -> float:
    """The study's reservations once a trial that held `share_usd` ended, having spent `cost_usd`."""
    return max(0.0, reserved_usd - share_usd + cost_usd)


def trial_deadline(study_deadline_at: float, now: float, min_trial_seconds: float) -> float | None:
    """The deadline (seconds from now) a trial starting now gets, or None when it could not finish."""
    left = study_deadline_at - now - DEADLINE_MARGIN_S
    return left if left >= min_trial_seconds else None


# --------------------------------------------------------------------------------------------
# The study's own bill: its controller's invocations and its state machine's transitions (the
# trials' executions are in the trials' own ledgers). Reserved up front, like a trial's share.

CONTROLLER_MEMORY_MB = 512  # the controller function's memory (infra/stacks/study.py deploys it)
# State transitions of the study machine per controller step (infra/stacks/study.py): Init, Run
# and the Map; per trial Admit, Admitted, RunTrial, TrialEnded and the iteration; per look Watch,
# WatchDone and Poll; the Trials branch's TrialsEnded (which ends the watcher), Finish and Done.
TRANSITIONS = {"init": 4, "admit": 3, "ended": 2, "watch": 3, "finish": 3}
NOMINAL_STEP_S = 0.25  # a controller step's billed time when it is reserved (before it is measured)
MIN_POLL_S, MAX_POLL_S = 2, 60
# With fewer looks than this left in the watch reserve, the last is kept for the deadline.
PACE_BELOW = 2
FIRST_POLL_S = MIN_POLL_S  # before any trial has a round to time: look soon, ASHA stops at the first rungs


def step_cost(op: str, seconds: float, prices: Prices, architecture: str) -> float:
    """One controller step's bill: its invocation (memory x time, 1 ms granularity, the request,
    its trace) and its state transitions."""
    billed = max(0.001, round(seconds, 3))
    return (
        float(prices.lambda_cost(CONTROLLER_MEMORY_MB, billed, architecture))
        + prices.lambda_request
        + prices.xray_trace
        + TRANSITIONS[op] * prices.sfn_transition
    )


def expected_watches(trials: int, concurrency: int, max_rounds: int, deadline_s: float, poll_s: int | None) -> int:
    """How often the watcher looks: with a poll interval given, as often as the deadline allows;
    by default once per trial round (the interval follows the trials' round time), so about the
    rounds of trials/concurrency trials in a row, two more per trial for start and end."""
    if poll_s is not None:
        return int(deadline_s // poll_s) + 1
    waves = -(-trials // max(1, concurrency))
    return waves * (max_rounds + 2) + 1


def overhead_reserve(trials: int, watches: int, prices: Prices, architecture: str) -> float:
    """The study's own bill, reserved before any trial gets a share."""

    def cost(op: str) -> float:
        return step_cost(op, NOMINAL_STEP_S, prices, architecture)

    return cost("init") + cost("finish") + trials * (cost("admit") + cost("ended")) + watches * cost("watch")


def next_poll(
    explicit_s: int | None, round_s: float | None, time_left_s: float, watch_usd_left: float, watch_usd: float
) -> int:
    """The watcher's next wait: the study's `poll_seconds` if it gives one, else the running trials'
    round time (a trial's curve changes once a round); never so short that the watches to the
    deadline would cost more than is left of their reserve."""
    base = explicit_s if explicit_s is not None else round(round_s) if round_s else FIRST_POLL_S
    base = max(MIN_POLL_S, min(MAX_POLL_S, int(base))) if explicit_s is None else int(base)
    affordable = int(watch_usd_left // watch_usd) if watch_usd > 0 else 0
    if affordable < 1:
        return max(base, min(3600, int(time_left_s) + 1))  # no reserve left: look once more at the deadline
    if affordable >= PACE_BELOW:  # the reserve holds many more looks: at the trials' pace
        return base
    return max(base, min(3600, int(time_left_s // affordable) + 1))  # the last look: at the deadline
