"""The adaptive planner's forecast lands in its PLAN items (the ETA the per-round line and the
dashboard show): rounds, seconds and dollars left, median and p70, on real digits rounds."""

from smlt.outputs import progress_line
from smlt.runtime.records import RunTable
from tests.functional.handlers.conftest import job
from tests.functional.handlers.test_handlers import drive


def test_adaptive_plans_record_the_forecast_and_the_line_shows_it(digits, aws):
    j = job(digits, max_rounds=6, target_value=0.97)
    j["workers"] = {"initial": 2, "min": 1, "max": 4, "planner": "adaptive"}
    j["constraints"] = {"deadline_seconds": 900, "budget_usd": 0.5}
    drive(j, execution="eta")
    table = RunTable("smlt-runs", "eta")
    plans = {p.round: p for p in table.plans()}
    forecast = [p for p in plans.values() if p.eta_rounds is not None]
    assert forecast, "no adaptive plan recorded a forecast"
    for p in forecast:
        assert p.eta_rounds_p70 is not None and p.eta_rounds_p70 >= p.eta_rounds > 0
        assert p.eta_s is not None and p.eta_s > 0 and p.eta_cost_usd is not None and p.eta_cost_usd > 0
        assert p.elapsed_s is not None and p.elapsed_s >= 0
    r = next(r for r in table.rounds() if not r.stop and plans[r.round].eta_rounds is not None)
    line = progress_line(r, plans[r.round])

    assert " | ETA " in line and "s left" in line and "left" in line.rsplit("$", 1)[-1]
