"""The planner's final evaluation: planned again while a failed worker leaves it partial, at most
MAX_EVALUATIONS in a row."""

from smlt.runtime.items import RoundItem
from smlt.runtime.planner.types import Decision
from smlt.runtime.steps.plan import MAX_EVALUATIONS, _final_evaluation

STOP = Decision(action="stop", reason="max_rounds reached", bound="max_rounds", rule="max_rounds")


def _round(n, eval_only):
    return RoundItem(
        round=n, workers=4, memory_mb=1769, local_steps=0 if eval_only else 20, batch_size=32, eval_only=eval_only
    )


def test_a_partial_evaluation_is_planned_again_up_to_the_cap():
    rounds = [_round(0, False), _round(1, False)]
    for n in range(MAX_EVALUATIONS):
        evaluation = _final_evaluation(STOP, rounds)
        assert evaluation is not None and evaluation.local_steps == 0 and evaluation.workers == 4
        assert (evaluation.rule, evaluation.bound) == ("final_evaluation", "max_rounds")
        rounds.append(_round(2 + n, True))  # partial: stop = False
    assert _final_evaluation(STOP, rounds) is None  # finalize falls back to the newest whole-split metric
