"""The per-round line's ETA: the planner's forecast (PLAN item) of the rounds, seconds and dollars
left, with its p70 band, against the deadline and budget left."""

from smlt.outputs import eta_text, progress_line
from smlt.runtime.items import PlanItem, RoundItem
from smlt.runtime.job import parse_job
from smlt.runtime.roundspec import RoundSpec


def _plan(**eta):
    job = parse_job({"dataset": {"uri": "s3://b/d/"}, "constraints": {"deadline_seconds": 600, "budget_usd": 0.5}})
    spec = RoundSpec.model_construct(job=job)
    return PlanItem(
        run_id="r", round=3, action="train", reason="", planned_at=0.0, execution="e", spec=spec, elapsed_s=100.0, **eta
    )


def _round(**kw):
    base = dict(run_id="r", round=3, workers=4, workers_ok=4, memory_mb=1769, local_steps=20, batch_size=32)
    return RoundItem(**{**base, "round_s": 10.0, "cost_usd": 0.001, "cost_total_usd": 0.1, **kw})


def test_the_line_says_what_is_left_with_its_p70_band_against_deadline_and_budget():
    plan = _plan(eta_rounds=6, eta_rounds_p70=9, eta_s=60, eta_s_p70=90, eta_cost_usd=0.006, eta_cost_usd_p70=0.009)
    text = eta_text(_round(), plan)
    # Round 3 took 10 s and $0.001 of the plan's forecast: 5 rounds, 50 s, $0.005 are left.
    assert text == "ETA 5 (p70 8) rounds, 50 s (p70 80 s) of 490 s left, $0.0050 (p70 $0.0080) of $0.4000 left"
    assert progress_line(_round(), plan).endswith(text)


def test_no_forecast_no_eta():
    assert eta_text(_round(), _plan()) == "" and eta_text(_round(), None) == ""
    plan = _plan(eta_rounds=1, eta_s=10, eta_cost_usd=0.001)
    assert "ETA" not in progress_line(_round(stop=True), plan)  # the last round: nothing left


def test_the_dashboards_plans_table_shows_each_plans_forecast():
    from types import SimpleNamespace

    from smlt.dashboard.app import plans_rows

    plan = _plan(eta_rounds=4, eta_rounds_p70=6, eta_s=20, eta_s_p70=30, eta_cost_usd=0.002, eta_cost_usd_p70=0.003)
    html = str(plans_rows(SimpleNamespace(plans=[plan])))
    assert "4 (p70 6) rounds, 20 s (p70 30 s), $0.0020 (p70 $0.0030)" in html


def test_the_line_says_when_the_time_limit_cut_workers_short():
    from smlt.runtime.items import RoundTiming

    def timing(worker, steps, cut):
        return RoundTiming(worker=worker, memory_mb=1769, samples=32 * steps, steps=steps, cut=cut)

    assert "| k 20 |" in progress_line(_round(timings=[timing(0, 20, False), timing(1, 20, False)]))
    line = progress_line(_round(timings=[timing(0, 1, True), timing(1, 3, True), timing(2, 20, False)]))
    assert "| k 20 (2 cut to 1-3 at the time limit) |" in line


def test_the_dashboards_status_line_carries_the_class_warning():
    from types import SimpleNamespace

    from smlt.dashboard.app import _status_line
    from smlt.runtime.items import FinalMetrics

    final = FinalMetrics(
        run_id="r",
        val_accuracy=0.94,
        val_balanced_accuracy=0.5,
        val_class_recall=[0.0, 1.0],
        rounds=3,
        samples=100,
        wall_seconds=1.0,
        estimated_cost_usd=0.001,
        stop_reason="max_rounds",
    )
    meta = SimpleNamespace(job=SimpleNamespace(name="fraud"), final=final)
    view = SimpleNamespace(meta=meta, status="SUCCEEDED", rounds=[1, 2, 3], stop=None)
    line = _status_line(view)  # type: ignore[arg-type]
    assert "stop reason: max_rounds | warning: balanced accuracy 0.5000" in line and "class #0" in line
