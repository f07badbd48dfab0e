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
