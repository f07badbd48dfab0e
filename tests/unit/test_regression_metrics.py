"""The metric rule (smlt.runtime.evaluation): RMSE and R² in the user's units from the workers' sums,
the target metrics a task has, which way they improve, and how the lines print them."""

import math

import numpy as np
import pytest

import smlt.runner
from smlt.outputs import progress_line
from smlt.runtime.data.manifest import TargetScaling
from smlt.runtime.errors import InvalidJob
from smlt.runtime.evaluation import ValMetrics, metric_reaches, metrics_text, summary_text, target_reached, val_metrics
from smlt.runtime.items import RoundItem
from smlt.runtime.job import Job, check_dataset, parse_job
from smlt.runtime.planner import decide
from smlt.runtime.prices import Prices
from tests.unit.planner.conftest import TIERS, make_history, make_job, make_round


def _sums(pred_user, y_user, mean, std):
    """What workers report: the squared error summed over targets, on the standardised scale."""
    scaled = (pred_user - mean) / std - (y_user - mean) / std
    return float((scaled**2).sum()), len(y_user)


def test_rmse_and_r2_are_in_the_users_units():
    rng = np.random.default_rng(1)
    y = rng.normal(150, 77, size=(300, 1))
    pred = y + rng.normal(0, 40, size=y.shape)
    mean, std = np.array([140.0]), np.array([70.0])  # the train split's, not the validation's
    loss_sum, n = _sums(pred, y, mean, std)
    target = TargetScaling(mean=mean.tolist(), std=std.tolist(), val_var=y.var(axis=0).tolist())
    m = val_metrics(loss_sum, 0, n, task="regression", outputs=1, target=target)
    assert m.val_rmse == pytest.approx(np.sqrt(np.mean((pred - y) ** 2)), rel=1e-9)
    r2 = 1 - np.sum((pred - y) ** 2) / np.sum((y - y.mean()) ** 2)  # sklearn's r2_score
    assert m.val_r2 == pytest.approx(r2, rel=1e-9)
    assert m.val_loss == pytest.approx(loss_sum / n) and m.val_accuracy is None


def test_several_targets_average_over_targets():
    # Each target's scaled squared error is taken as an equal share of the summed one.
    target = TargetScaling(mean=[0.0, 0.0], std=[2.0, 10.0], val_var=[8.0, 200.0])
    m = val_metrics(4.0 * 10, 0, 10, task="regression", outputs=2, target=target)  # 2 per target, per row
    assert m.val_rmse == pytest.approx(math.sqrt((2 * 4 + 2 * 100) / 2))
    assert m.val_r2 == pytest.approx(((1 - 8 / 8) + (1 - 200 / 200)) / 2)


def test_without_scaling_rmse_is_on_the_stored_scale_and_there_is_no_r2():
    m = val_metrics(18.0, 0, 3, task="regression", outputs=2, target=None)
    assert m.val_rmse == pytest.approx(math.sqrt(18 / 6)) and m.val_r2 is None and m.val_accuracy is None
    constant = TargetScaling(mean=[5.0], std=[1.0], val_var=[0.0])  # R² undefined: not stored as NaN
    assert val_metrics(3.0, 0, 3, task="regression", outputs=1, target=constant).val_r2 is None


def test_classification_has_accuracy_and_no_rmse():
    m = val_metrics(12.0, 7, 10, task="classification", outputs=3, target=None)
    assert (m.val_loss, m.val_accuracy, m.val_rmse, m.val_r2) == (1.2, 0.7, None, None)
    assert val_metrics(0.0, 0, 0, task="regression", outputs=1, target=None) == ValMetrics()


def test_regression_targets_and_their_direction():
    assert metric_reaches("val_rmse", 50.0, 49.0) and not metric_reaches("val_rmse", 50.0, 51.0)
    assert metric_reaches("val_r2", 0.4, 0.45) and not metric_reaches("val_r2", 0.4, 0.3)
    training = parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"target_metric": "val_r2"}}).training
    assert not target_reached(training, ValMetrics(val_r2=0.9))  # no target value
    training = training.model_copy(update={"target_value": 0.5})
    assert target_reached(training, ValMetrics(val_r2=0.5, val_accuracy=0.0))
    assert not target_reached(training, ValMetrics(val_loss=0.01))  # R² not measured


def test_target_metric_validation():
    job = parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"target_metric": "val_rmse", "target_value": 53}})
    assert job.training.target_value == 53  # in the user's units: any size
    with pytest.raises(InvalidJob, match=r"training.target_value: val_r2 is at most 1"):
        parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"target_metric": "val_r2", "target_value": 1.5}})
    with pytest.raises(InvalidJob, match=r"training.target_metric: .*val_rmse"):
        parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"target_metric": "rmse"}})


class _Manifest:  # what check_dataset reads of one
    def __init__(self, task):
        self.task, self.name = task, "d"
        self.train = type("S", (), {"rows": 1000})()


def _job(metric, value=0.5) -> Job:
    return parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"target_metric": metric, "target_value": value}})


def test_each_task_refuses_the_others_metrics():
    with pytest.raises(InvalidJob, match=r"^training.target_metric: val_accuracy needs a classification dataset; use"):
        check_dataset(_job("val_accuracy"), _Manifest("regression"))
    for metric in ("val_rmse", "val_r2"):
        with pytest.raises(InvalidJob, match=rf"^training.target_metric: {metric} needs a regression dataset"):
            check_dataset(_job(metric), _Manifest("classification"))
        check_dataset(_job(metric), _Manifest("regression"))
    check_dataset(_job("val_loss"), _Manifest("regression"))
    check_dataset(_job("val_loss"), _Manifest("classification"))


def _round(**metrics):
    base = dict(round=3, workers=4, workers_ok=4, memory_mb=1769, local_steps=20, batch_size=32, train_loss=0.3)
    return RoundItem(**(base | {"val_rows": 89, "val_rows_total": 89} | metrics))


def test_the_progress_line_shows_rmse_and_r2_never_an_accuracy():
    line = progress_line(_round(val_loss=0.52, val_rmse=55.4321, val_r2=0.4812))
    assert "val rmse 55.43 r2 0.4812" in line and "acc" not in line
    partial = progress_line(_round(val_loss_partial=0.5, val_rmse_partial=54.0, val_r2_partial=0.5, val_rows=60))
    assert "val partial rmse 54 r2 0.5000 (60/89 rows)" in partial and "acc" not in partial
    assert "val acc 0.9700" in progress_line(_round(val_loss=0.1, val_accuracy=0.97))
    assert metrics_text(ValMetrics(val_loss=0.25, val_rmse=0.5)) == "val rmse 0.5"  # no scaling: no R²


def test_the_progress_line_shows_the_balanced_accuracy_when_it_is_the_target_or_far_below():
    close = _round(val_loss=0.1, val_accuracy=0.97, val_balanced_accuracy=0.95)
    assert "val acc 0.9700 |" in progress_line(close)  # a plain accuracy target, classes alike
    assert "val acc 0.9700 bal 0.9500 |" in progress_line(close, target="val_balanced_accuracy")
    hidden = _round(val_loss=0.1, val_accuracy=0.95, val_balanced_accuracy=0.55)  # a class the model misses
    assert "val acc 0.9500 bal 0.5500 |" in progress_line(hidden)
    partial = _round(val_loss_partial=0.2, val_accuracy_partial=0.9, val_balanced_accuracy_partial=0.8, val_rows=60)
    assert "val partial acc 0.9000 bal 0.8000 (60/89 rows)" in progress_line(partial, target="val_balanced_accuracy")


def test_the_summary_of_a_regression_run():
    final = {"task": "regression", "rounds": 6, "val_loss": 0.51, "val_rmse": 55.1, "val_r2": 0.48}
    final |= {"val_accuracy": None, "estimated_cost_usd": 0.001, "stop_reason": "max_rounds reached"}
    line = smlt.runner.done_lines("r", final, 2.0, __import__("pathlib").Path("/nonexistent"))[0]
    assert line.startswith("done: run r: 6 rounds, val rmse 55.1000, val r2 0.4800, val loss 0.5100, 2.0 s")
    assert "accuracy" not in line
    assert summary_text({"task": "regression", "val_rmse": None}) == "val rmse n/a, val r2 n/a"
    assert summary_text({"val_accuracy": 0.961}) == "val accuracy 0.9610"  # an older metrics.json: classification


def test_the_report_plots_rmse_and_r2(tmp_path):
    rounds = [
        _round(val_loss=1.0 / (i + 1), val_rmse=70.0 - i, val_r2=0.1 * i).model_copy(
            update={"round": i, "finished_at": 100.0 + i, "round_s": 1.0}
        )
        for i in range(4)
    ]
    final = {"run_id": "r", "task": "regression", "val_rmse": 67.0, "val_r2": 0.3, "rounds": 3, "samples": 1}
    final |= {"wall_seconds": 4.0, "estimated_cost_usd": 0.0, "stop_reason": ""}
    metrics = {"rounds": [r.model_dump() for r in rounds], "final": final}
    from smlt.report import _plot_metric, write_report

    write_report(metrics, tmp_path / "report.png")
    assert (tmp_path / "report.png").stat().st_size > 10_000

    class Axes:  # records what is drawn
        def __init__(self):
            self.labels, self.twin = [], None

        def plot(self, xs, ys, *style, label, **kw):
            self.labels.append((label, list(ys)))

        def twinx(self):
            self.twin = Axes()
            return self.twin

        def set_xlabel(self, *_, **__):
            pass

        set_ylabel = legend = set_xlabel

    ax = Axes()
    _plot_metric(ax, [0, 1, 2, 3], rounds, "round")
    assert ax.labels == [("validation RMSE", [70.0, 69.0, 68.0, 67.0])]
    assert ax.twin.labels == [("validation R²", pytest.approx([0.0, 0.1, 0.2, 0.3]))]


def test_the_planner_stops_on_a_regression_target():
    prices = Prices()
    for metric, target, good, bad in (("val_rmse", 50.0, 49.0, 51.0), ("val_r2", 0.5, 0.55, 0.45)):
        job = make_job(workers={"planner": "fixed"}, training={"target_metric": metric, "target_value": target})
        r = make_round(0)
        setattr(r, metric, bad)
        assert decide(job, make_history([r]), TIERS, prices).action == "train"
        setattr(r, metric, good)
        d = decide(job, make_history([r]), TIERS, prices)
        assert (d.rule, d.bound) == ("target_reached", "target"), d.reason


def test_the_adaptive_planner_forecasts_an_r2_target():
    prices = Prices()
    job = make_job(training={"target_metric": "val_r2", "target_value": 0.5, "max_rounds": 200})
    rounds = []
    for i in range(6):
        r = make_round(i)
        r.val_r2 = 0.45 * (1 - math.exp(-0.5 * i)) - 0.1  # climbing towards the target
        rounds.append(r)
    d = decide(job, make_history(rounds), TIERS, prices)
    assert d.action == "train" and d.predicted_rounds_left is not None and d.predicted_rounds_left > 0


def test_each_class_has_its_recall_and_their_mean_is_the_balanced_accuracy():
    from smlt.runtime.evaluation import val_metrics

    m = val_metrics(
        9.0, 90, 100, task="classification", outputs=3, target=None, class_correct=[0, 90, 0], class_count=[10, 90, 0]
    )
    assert m.val_accuracy == 0.9 and m.val_class_recall == [0.0, 1.0, None] and m.val_balanced_accuracy == 0.5
    # a worker that did not sum per class (its rows missing from the sums): no per-class metrics
    m = val_metrics(
        9.0, 95, 110, task="classification", outputs=3, target=None, class_correct=[0, 90, 0], class_count=[10, 90, 0]
    )
    assert m.val_accuracy == pytest.approx(95 / 110) and m.val_class_recall is None and m.val_balanced_accuracy is None


def test_an_accuracy_that_hides_a_missed_class_is_told_with_the_class_named(tmp_path):
    from smlt.runner import done_lines
    from smlt.runtime.evaluation import class_warning

    final = {"val_accuracy": 0.94, "val_balanced_accuracy": 0.5, "val_class_recall": [0.0, 1.0]}
    assert class_warning(final, ["fraud", "ok"]) == (
        "balanced accuracy 0.5000 (the mean of the classes' recalls) against accuracy 0.9400: no validation row "
        "of class 'fraud' is predicted as its class; on imbalanced classes accuracy rewards predicting the common ones "
        '(training.class_weights "balanced" weighs the rare ones up)'
    )
    skewed = {"val_accuracy": 0.9, "val_balanced_accuracy": 0.7, "val_class_recall": [0.95, 0.45, None]}
    assert "class #1 has the lowest recall, 0.4500" in (class_warning(skewed) or "")
    assert class_warning({"val_accuracy": 0.9, "val_balanced_accuracy": 0.85, "val_class_recall": [0.8, 0.9]}) is None
    assert class_warning({"val_accuracy": 0.9}) is None  # regression, or per-class not measured
    (tmp_path / "model.json").write_text('{"classes": ["fraud", "ok"]}')
    run = {**final, "rounds": 3, "stop_reason": "max_rounds", "estimated_cost_usd": 0.001, "val_loss": 0.2}
    lines = done_lines("r", run, 1.0, tmp_path)
    assert lines[1].startswith("  warning: balanced accuracy 0.5000") and "class 'fraud'" in lines[1]


def test_the_watch_tells_a_triggered_runs_missed_class(tmp_path, monkeypatch, caplog):
    """`smlt run --local --watch` (smlt/watch.py) ends a pipeline run's lines with the warning
    `smlt run` ends with, the class named from the fetched model card."""
    import json

    from smlt import watch

    final = {"val_accuracy": 0.94, "val_balanced_accuracy": 0.5, "val_class_recall": [0.0, 1.0], "rounds": 1}

    def fetched(store, run_id, out, history):
        out.mkdir(parents=True)
        (out / "model.json").write_text('{"classes": ["fraud", "ok"]}')
        return {"final": final, "job": {"dataset": {"uri": "s3://d/prepared/x/"}}}

    class Engine:
        def wait(self, arn, interval):
            return {"status": "SUCCEEDED", "output": json.dumps({"plan": {"run_id": "r1"}})}

        def client(self, name):
            return None

        def history(self, arn):
            return []

    class Follower:
        def __init__(self, *args):
            pass

        def poll(self):
            pass

    monkeypatch.setattr(watch, "fetch_outputs", fetched)
    monkeypatch.setattr(watch, "Follower", Follower)
    names = type("Names", (), {"artifacts_bucket": "a"})()
    caplog.set_level("INFO", logger="smlt.notice")
    watch._follow_triggered(Engine(), names, "arn", tmp_path)
    told = [r.getMessage() for r in caplog.records if r.name == "smlt.notice"]
    assert told[-1].startswith("  warning: balanced accuracy 0.5000") and "class 'fraud'" in told[-1], told
