"""`val_balanced_accuracy` as a target metric: the job's checks, the stop rule, the planner's
noise and stall rules, the pipeline's gate, a study's metric, tracking, and `smlt models list`'s
class warning per version."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from smlt.runtime import keys
from smlt.runtime.errors import InvalidJob
from smlt.runtime.evaluation import MAX_CLASS_SUMS, metric_reaches, summary_text, target_reached, val_metrics
from smlt.runtime.items import FinalMetrics, RoundItem
from smlt.runtime.job import Job, check_dataset, parse_job
from smlt.runtime.pipeline import MIN_GATE_ROWS, Champion, Validation, VersionRecord, conclude, run_class_warning
from smlt.runtime.planner import decide
from smlt.runtime.planner.progress import ProgressModel
from smlt.runtime.planner.stall import stalled
from smlt.runtime.planner.types import noise_rows
from smlt.runtime.prices import Prices
from smlt.runtime.store import NotFound
from smlt.tracking import round_scalars
from tests.unit.planner.conftest import TIERS, make_history, make_job, make_round

METRIC = "val_balanced_accuracy"


def _Manifest(task: str, outputs: int = 2) -> Any:  # what check_dataset reads of one
    train = SimpleNamespace(rows=1000, class_counts=None)
    return SimpleNamespace(task=task, name="d", outputs=outputs, train=train)


def _job(value: float | None = 0.8, **training) -> Job:
    return parse_job(
        {"dataset": {"uri": "s3://b/d/"}, "training": {"target_metric": METRIC, "target_value": value, **training}}
    )


# --- the job ------------------------------------------------------------------------------------


def test_a_classification_job_may_target_balanced_accuracy_a_fraction_of_at_most_1():
    check_dataset(_job(0.8), _Manifest("classification", 2))
    check_dataset(_job(None), _Manifest("classification", MAX_CLASS_SUMS))
    with pytest.raises(InvalidJob, match=r"training.target_value: val_balanced_accuracy is a fraction of at most 1"):
        _job(85)


def test_regression_and_more_than_1000_classes_are_refused_by_name():
    for value in (0.8, None):  # even without a target: a pipeline's gate or a study compares it
        with pytest.raises(InvalidJob, match=r"^training.target_metric: val_balanced_accuracy needs a classification"):
            check_dataset(_job(value), _Manifest("regression", 1))
        with pytest.raises(
            InvalidJob, match=r"val_balanced_accuracy is measured for at most 1,000 classes .* has 1,001, so no round"
        ):
            check_dataset(_job(value), _Manifest("classification", MAX_CLASS_SUMS + 1))


def test_a_target_one_class_everywhere_meets_is_refused():
    with pytest.raises(
        InvalidJob, match=r"val_balanced_accuracy 0.5 is met by always predicting one class \(0.5 with 2"
    ):
        check_dataset(_job(0.5), _Manifest("classification", 2))
    check_dataset(_job(0.34), _Manifest("classification", 3))


# --- the stop rule ------------------------------------------------------------------------------


def test_higher_is_better_and_a_round_without_per_class_sums_never_reaches_it():
    assert metric_reaches(METRIC, 0.8, 0.81) and not metric_reaches(METRIC, 0.8, 0.79)
    assert not metric_reaches(METRIC, 0.8, None)
    training = _job(0.8).training
    # 95 % accuracy, fraud never predicted: balanced accuracy 0.5
    m = val_metrics(
        1.0, 95, 100, task="classification", outputs=2, target=None, class_correct=[95, 0], class_count=[95, 5]
    )
    assert m.val_accuracy == 0.95 and m.val_balanced_accuracy == 0.5 and not target_reached(training, m)
    # a worker sent no per-class sums: no balanced accuracy, not reached, no error
    m = val_metrics(1.0, 99, 100, task="classification", outputs=2, target=None)
    assert m.val_balanced_accuracy is None and not target_reached(training, m)
    item = RoundItem(round=1, workers=2, memory_mb=1769, local_steps=20, batch_size=32, val_accuracy=0.99)
    assert not target_reached(training, item)
    m = val_metrics(
        1.0, 97, 100, task="classification", outputs=2, target=None, class_correct=[93, 4], class_count=[95, 5]
    )
    assert target_reached(training, m)  # (93/95 + 4/5) / 2 = 0.889


def test_the_summary_names_balanced_accuracy_when_it_is_the_target():
    final = {"val_accuracy": 0.95, "val_balanced_accuracy": 0.5}
    assert summary_text(final) == "val accuracy 0.9500"
    assert summary_text(final, METRIC) == "val accuracy 0.9500, val balanced accuracy 0.5000"
    assert summary_text({"val_accuracy": 0.95}, METRIC) == "val accuracy 0.9500, val balanced accuracy n/a"


# --- the planner --------------------------------------------------------------------------------


def _rounds(values):
    out = []
    for i, v in enumerate(values):
        r = make_round(i, acc=None if v is None else min(0.99, v + 0.1))
        r.val_balanced_accuracy = v
        out.append(r)
    return out


def test_the_planner_stops_on_the_target_and_not_on_a_round_without_it():
    prices = Prices()
    job = make_job(workers={"planner": "fixed"}, training={"target_metric": METRIC, "target_value": 0.8})
    d = decide(job, make_history(_rounds([0.81])), TIERS, prices)
    assert (d.rule, d.bound) == ("target_reached", "target"), d.reason
    assert "val_balanced_accuracy 0.8100 >= 0.8" in d.reason
    assert decide(job, make_history(_rounds([0.79])), TIERS, prices).action == "train"
    # accuracy 0.99 but no per-class sums: trains on
    assert decide(job, make_history(_rounds([0.5, None])), TIERS, prices).action == "train"


def test_the_adaptive_planner_forecasts_a_balanced_target_with_gaps():
    job = make_job(training={"target_metric": METRIC, "target_value": 0.9, "max_rounds": 200})
    values: list[float | None] = [0.5 + 0.35 * (1 - math.exp(-0.4 * i)) for i in range(7)]
    values[3] = None  # a round a worker sent no per-class sums for
    d = decide(job, make_history(_rounds(values)), TIERS, Prices())
    assert d.action == "train" and d.predicted_rounds_left is not None and d.predicted_rounds_left > 0


def test_balanced_accuracys_noise_is_a_proportions_on_the_effective_rows():
    assert noise_rows("val_accuracy", 2000, [1880, 120]) == 2000
    assert noise_rows(METRIC, 2000, None) == 2000  # unknown: equal classes, a lower bound of the noise
    assert noise_rows(METRIC, 2000, [1000, 1000]) == pytest.approx(2000)  # equal classes: the same
    assert noise_rows(METRIC, 2000, [1880, 120, 0]) == pytest.approx(4 / (1 / 1880 + 1 / 120))  # ~451
    pm = ProgressModel(
        metric=METRIC,
        target=0.9,
        momentum=0.9,
        batch=32,
        train_rows=20_000,
        val_rows=2000,
        quorum=0.5,
        max_rounds=200,
        initial_workers=4,
        initial_steps=20,
    )
    sd_equal = pm._noise_sd(pm.sign * np.array([0.5, 0.8]))[0][0]
    pm.fit(make_history(_rounds([0.5, 0.6, 0.7, 0.75]), val_class_rows=[1880, 120]))
    sd_rare = pm._noise_sd(pm.sign * np.array([0.5, 0.8]))[0][0]
    assert pm.noise_rows == pytest.approx(451.2, abs=0.1) and sd_rare > 1.4 * sd_equal  # (+ the misfit sd)


def test_a_stall_is_judged_against_the_rare_classes_noise():
    job = make_job(training={"target_metric": METRIC, "target_value": 0.95})
    curve = [0.5, 0.7, 0.8, 0.8, 0.8, 0.8, 0.84]  # the last 4 rose 0.04 above the best before
    # 2 sqrt(2) sd at 0.8: 0.025 on 2,000 equal rows, 0.053 on 1,880 + 120 (the rare class's recall)
    assert not stalled(job, make_history(_rounds(curve)), 2000)
    assert stalled(job, make_history(_rounds(curve), val_class_rows=[1880, 120]), 2000)
    assert not stalled(job, make_history(_rounds([None] * 11)), 2000)  # nothing measured: no stall, no error


# --- the pipeline's gate -------------------------------------------------------------------------


class _Store:
    """An artifacts bucket in memory (get, put, list)."""

    bucket = "smlt-artifacts"

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def get(self, key: str) -> bytes:
        if key not in self.objects:
            raise NotFound(key)
        return self.objects[key]

    def put(self, key: str, blob: bytes, **_) -> None:
        self.objects[key] = blob

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))


def _final(run_id: str, accuracy: float, recall: list[float | None]) -> FinalMetrics:
    return FinalMetrics(
        run_id=run_id,
        val_accuracy=accuracy,
        val_loss=0.2,
        val_balanced_accuracy=sum(r or 0.0 for r in recall) / len(recall),
        val_class_recall=recall,
        val_rows=1000,
        rounds=5,
        samples=1,
        wall_seconds=1.0,
        estimated_cost_usd=0.001,
        stop_reason="max_rounds reached",
    )


def _pipeline_with_champion(store: _Store, run_id: str = "fraud-v2-r") -> None:
    store.put(
        keys.pipeline_latest_key("fraud"),
        Champion(run_id="fraud-v1-r", model="s3://a/runs/fraud-v1-r/final/model.safetensors", version="v1")
        .model_dump_json()
        .encode(),
    )
    record = VersionRecord(
        pipeline="fraud",
        version="v2",
        data="s3://smlt-data/prepared/fraud/v2/t/",
        run_id=run_id,
        start="warm: from the champion v1 (run fraud-v1-r), same features",
        features="f",
        generation=1,
        champion_run="fraud-v1-r",
        champion_version="v1",
    )
    store.put(keys.pipeline_version_key("fraud", "v2"), record.model_dump_json().encode())


def _gate(
    metric: str,
    champion_round0: RoundItem,
    challenger: FinalMetrics,
    validation: Validation | None = None,
    min_rows: int = MIN_GATE_ROWS,
) -> VersionRecord | None:
    """Finalize's call (smlt.runtime.steps.finalize): the final metrics against round 0's, the
    champion scored on this version's validation rows."""
    store = _Store()
    _pipeline_with_champion(store, challenger.run_id)
    return conclude(
        store,  # type: ignore[arg-type]
        "s3://smlt-data/incoming/fraud/v2/",
        challenger.run_id,
        "s3://a/runs/fraud-v2-r/final/model.safetensors",
        metric,
        0.0,
        getattr(challenger, metric),
        getattr(champion_round0, metric),
        challenger.estimated_cost_usd,
        "ab" * 32,
        validation,
        min_rows,
    )


def test_the_gate_on_balanced_accuracy_rejects_a_challenger_that_gains_accuracy_by_missing_fraud():
    # the champion finds 80 % of the fraud; the challenger predicts "ok" everywhere but one fraud row
    champion = RoundItem(
        round=0, workers=2, memory_mb=1769, local_steps=0, batch_size=32, eval_only=True,
        val_loss=0.3, val_accuracy=0.95, val_balanced_accuracy=(0.96 + 0.8) / 2,
    )  # fmt: skip
    challenger = _final("fraud-v2-r", 0.96, [1.0, 0.05])
    on_accuracy = _gate("val_accuracy", champion, challenger)
    assert on_accuracy is not None and on_accuracy.status == "promoted"  # plain accuracy would promote it
    record = _gate(METRIC, champion, challenger)
    assert record is not None and record.status == "rejected" and not record.promoted
    assert record.metric == METRIC and record.challenger_value == pytest.approx(0.525)
    assert record.champion_value == pytest.approx(0.88)
    assert record.reason.startswith("val_balanced_accuracy 0.525 vs the champion v1's 0.88 on the same rows: worse by")
    better = _final("fraud-v2-r", 0.94, [0.95, 0.9])
    assert _gate(METRIC, champion, better).status == "promoted"  # type: ignore[union-attr]


def test_the_gate_rejects_when_balanced_accuracy_was_not_measured_and_says_why():
    champion = RoundItem(round=0, workers=2, memory_mb=1769, local_steps=0, batch_size=32, val_accuracy=0.95)
    record = _gate(METRIC, champion, _final("fraud-v2-r", 0.96, [1.0, 0.9]))
    assert record is not None and record.status == "rejected"
    assert "could not be re-scored" in record.reason and "per-class sums" in record.reason
    unmeasured = _final("fraud-v2-r", 0.96, [1.0, 0.9]).model_copy(update={"val_balanced_accuracy": None})
    record = _gate(METRIC, champion.model_copy(update={"val_balanced_accuracy": 0.9}), unmeasured)
    assert record is not None and record.status == "rejected"
    assert record.reason.startswith("the challenger has no val_balanced_accuracy (balanced accuracy needs")


# --- smlt models list ----------------------------------------------------------------------------


def test_models_list_shows_each_versions_class_warning(capsys):
    from smlt.cli.models import _print_versions, _warnings

    store = _Store()
    _pipeline_with_champion(store)
    missed = _final("fraud-v2-r", 0.95, [1.0, 0.0])
    store.put(keys.final_metrics_key("fraud-v2-r"), json.dumps({"final": missed.model_dump()}).encode())
    store.put("runs/fraud-v2-r/final/model.json", json.dumps({"classes": ["ok", "fraud"]}).encode())
    fine = _final("fraud-v1-r", 0.95, [0.96, 0.9])
    store.put(keys.final_metrics_key("fraud-v1-r"), json.dumps({"final": fine.model_dump()}).encode())
    assert run_class_warning(store, "fraud-v1-r") is None and run_class_warning(store, "nothing-yet") is None
    base: dict[str, Any] = dict(pipeline="fraud", data="s3://d/", features="f", generation=1, metric=METRIC)
    versions = [
        VersionRecord.model_validate(base | {"version": "v1", "run_id": "fraud-v1-r", "status": "promoted"}),
        VersionRecord.model_validate(base | {"version": "v2", "run_id": "fraud-v2-r", "status": "rejected"}),
        VersionRecord.model_validate(base | {"version": "v3", "run_id": "fraud-v3-r", "status": "rejected"}),
    ]
    warnings = _warnings(store, versions)
    assert set(warnings) == {"v2"}
    _print_versions(None, versions, None, warnings)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["version", "status", "metric", "new", "champion", "cost", "$", "run", "/", "reason"]
    assert out[3].split()[:3] == ["v2", "rejected", METRIC]
    assert out[5] == " " * 26 + (
        "warning: balanced accuracy 0.5000 (the mean of the classes' recalls) against accuracy 0.9500: "
        "no validation row of class 'fraud' is predicted as its class; on imbalanced classes accuracy rewards "
        'predicting the common ones (training.class_weights "balanced" weighs the rare ones up)'
    )
    assert sum("warning:" in line for line in out) == 1


# --- a study's metric, tracking --------------------------------------------------------------------


def test_a_study_maximises_balanced_accuracy_and_refuses_it_where_it_is_not_measured():
    from smlt.precheck import _check_study_metric
    from smlt.runtime.study.items import TrialItem
    from smlt.runtime.study.spec import parse_study
    from tests.unit.test_study import study

    s = parse_study(study(metric=METRIC))
    assert s.metric_name == METRIC and s.direction == "max"
    from smlt.runtime.study.controller import _best

    trials = [
        TrialItem(trial=1, run_id="a", status="SUCCEEDED", params={}, metric=0.6),
        TrialItem(trial=2, run_id="b", status="SUCCEEDED", params={}, metric=0.8),
        TrialItem(trial=3, run_id="c", status="SUCCEEDED", params={}, metric=None),  # not measured
    ]
    assert _best(s, trials).trial == 2  # type: ignore[union-attr]
    _check_study_metric(s, _Manifest("classification", 10))
    with pytest.raises(InvalidJob, match=r"^study.metric: val_balanced_accuracy needs a classification dataset"):
        _check_study_metric(s, _Manifest("regression", 1))
    with pytest.raises(InvalidJob, match=r"^study.metric: val_balanced_accuracy is measured for at most 1,000"):
        _check_study_metric(s, _Manifest("classification", 5000))


def test_tracking_logs_balanced_accuracy_per_round_and_at_the_end():
    from smlt.tracking import _FINAL

    r = {"round": 2, "val_accuracy": 0.95, "val_balanced_accuracy": 0.5}
    assert round_scalars(r, None) == {"metrics/val_accuracy": 0.95, "metrics/val_balanced_accuracy": 0.5}
    assert METRIC in _FINAL


def test_the_deployed_plan_gives_the_planner_the_validation_rows_of_each_class():
    """The contract: META carries the manifest's validation class counts, and the history the
    deployed Plan step builds for the planner reads them (not only the simulator)."""
    import time

    from smlt.runtime.items import MetaItem
    from smlt.runtime.steps.plan import _history

    job = parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"target_metric": "val_balanced_accuracy"}})
    meta = MetaItem(
        run_id="r",
        execution="e",
        job=job,
        status="RUNNING",
        created_at=time.time(),
        train_rows=2000,
        train_shards=4,
        val_rows=2000,
        val_class_rows=[1880, 120],
        features=8,
        outputs=2,
        task="classification",
    )
    state = SimpleNamespace(rounds=[], records=[])
    history = _history(state, meta)
    assert history.val_class_rows == [1880, 120]
    assert round(noise_rows("val_balanced_accuracy", history.val_rows, history.val_class_rows)) == 451


def test_a_run_held_to_balanced_accuracy_ends_with_it_on_its_done_line(tmp_path):
    from smlt.runner import done_lines

    final = {"rounds": 3, "stop_reason": "target", "estimated_cost_usd": 0.001, "task": "classification"}
    final |= {"val_accuracy": 0.96, "val_balanced_accuracy": 0.91, "val_loss": 0.1}
    (tmp_path / "metrics.json").write_text(
        json.dumps({"job": {"training": {"target_metric": "val_balanced_accuracy"}}})
    )
    assert (
        "val accuracy 0.9600, val balanced accuracy 0.9100, val loss 0.1000" in done_lines("r", final, 1.0, tmp_path)[0]
    )
    (tmp_path / "metrics.json").write_text(json.dumps({"job": {"training": {"target_metric": "val_accuracy"}}}))
    assert "balanced" not in done_lines("r", final, 1.0, tmp_path)[0]


def test_the_gate_rejects_a_version_whose_validation_rows_cannot_compare_and_says_why():
    # the champion scored on the new version's rows, the challenger better on them: promoted when
    # the rows can tell, rejected when they are too few or hold only some of the classes
    champion = RoundItem(round=0, workers=2, memory_mb=1769, local_steps=0, batch_size=32, val_accuracy=0.89)
    challenger = _final("fraud-v2-r", 1.0, [None, 1.0])
    enough = Validation(200, [120, 80], ["ok", "fraud"])
    assert _gate("val_accuracy", champion, challenger, enough).status == "promoted"  # type: ignore[union-attr]

    one_class = _gate("val_accuracy", champion, challenger, Validation(200, [0, 200], ["ok", "fraud"]))
    assert one_class is not None and one_class.status == "rejected" and not one_class.promoted
    assert one_class.reason == (
        "val_accuracy 1 vs the champion v1's 0.89 on the same rows, but its validation rows hold 1 of the "
        "pipeline's 2 classes (none of 'ok': a filtered export?), so a model that no longer predicts it is not "
        "seen: the champion v1 stays (upload the version again with more rows, or `smlt models promote fraud v2` "
        "to serve it anyway)"
    ), one_class.reason
    # a bincount ends at its last class present: a missing last class is absent too
    assert (
        "(none of 'fraud'" in _gate("val_accuracy", champion, challenger, Validation(50, [50], ["ok", "fraud"])).reason
    )  # type: ignore[union-attr]

    tiny = _gate("val_accuracy", champion, challenger, Validation(2, [1, 1], ["ok", "fraud"]))
    assert tiny is not None and tiny.status == "rejected"
    assert (
        "but the version's validation split has 2 rows, fewer than the 30 the gate compares on (the job's "
        "promotion_min_rows): the champion v1 stays" in tiny.reason
    )
    # a regression's rows (no classes), and a META from before the rows were counted (0): only the rows tell
    assert _gate("val_accuracy", champion, challenger, Validation(29)).status == "rejected"  # type: ignore[union-attr]
    assert _gate("val_accuracy", champion, challenger, Validation(0)).status == "promoted"  # type: ignore[union-attr]
    assert MIN_GATE_ROWS == 30 == parse_job({"dataset": {"uri": "x.csv"}}).promotion_min_rows
    # the job's promotion_min_rows moves the line: 12 rows pass at 10, 40 rows fail at 50
    assert _gate("val_accuracy", champion, challenger, Validation(12), min_rows=10).status == "promoted"  # type: ignore[union-attr]
    strict = _gate("val_accuracy", champion, challenger, Validation(40), min_rows=50)
    assert strict is not None and strict.status == "rejected" and "40 rows, fewer than the 50" in strict.reason
    with pytest.raises(InvalidJob, match="promotion_min_rows"):
        parse_job({"dataset": {"uri": "x.csv"}, "promotion_min_rows": 0})
