"""`smlt tune` end to end: the study state machine of the real stack on the local engine starts
the trials' training executions, ASHA stops the bad ones, the best model is the study's result;
and the same through the deployed path (boto3 against the stack's outputs)."""

import json
from pathlib import Path

from smlt import studies as tune
from smlt.console import publish_outputs
from smlt.runtime.records import RunTable
from smlt.runtime.store import S3Store
from smlt.runtime.study.items import StudyTable

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/digits-study.json"


def ledgers(engine, names, trials):
    """The sum of the trials' own ledgers, read from their runs (not from the study's items)."""
    total = 0.0
    for t in trials:
        meta = RunTable(names.table, t.run_id, client=engine.client("dynamodb")).meta()
        if meta is not None and meta.final is not None:
            total += meta.final.estimated_cost_usd
    return total


def test_the_digits_study_stops_a_third_early_and_finds_097_within_its_budget(local, tmp_path):
    engine, names = local
    target = tune.local_target(engine)
    meta, trials = tune.run(target, EXAMPLE, tmp_path, study_id="digits-e2e")
    assert meta.status == "SUCCEEDED" and len(trials) >= 12
    assert all(t.status in ("SUCCEEDED", "STOPPED") for t in trials)  # every trial is a run that ended
    stopped = [t for t in trials if t.status == "STOPPED"]
    assert len(stopped) >= len(trials) / 3
    assert all(t.stop_reason and "rung" in t.stop_reason for t in stopped)
    assert meta.best_metric is not None and meta.best_metric >= 0.97
    spent = ledgers(engine, names, trials)
    assert 0 < spent <= meta.budget_usd
    assert meta.spent_usd == sum(t.cost_usd for t in trials)
    # the full bill: the study's own steps (every Watch look, each trial's Admit and TrialEnded,
    # Init, Finish: invocations and transitions) on top of the trials' ledgers, within the budget
    from smlt.runtime.prices import Prices
    from smlt.runtime.study import budget

    assert meta.watches > 0
    assert meta.watch_usd >= meta.watches * budget.TRANSITIONS["watch"] * Prices().sfn_transition
    assert meta.overhead_usd >= meta.watch_usd
    assert abs(meta.total_usd - (meta.spent_usd + meta.overhead_usd)) < 1e-9
    assert meta.total_usd <= meta.budget_usd
    # each trial ran under the share the study gave it, and every run is an ordinary execution
    for t in trials:
        run = RunTable(names.table, t.run_id, client=engine.client("dynamodb")).meta()
        assert run.job.constraints.budget_usd == t.budget_usd and run.final.estimated_cost_usd <= t.budget_usd
    # the best trial's model is the study's result, and fetched into OUT
    best = RunTable(names.table, meta.best_run_id, client=engine.client("dynamodb")).meta()
    assert best.final.val_accuracy == meta.best_metric
    store = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    assert store.get(meta.best_model_key) == store.get(f"runs/{meta.best_run_id}/final/model.safetensors")
    assert (tmp_path / "model.safetensors").read_bytes() == store.get(meta.best_model_key)
    assert json.loads((tmp_path / "best.json").read_text())["best_run_id"] == meta.best_run_id


def small_study(tmp_path, **changes):
    raw = json.loads(EXAMPLE.read_text())
    raw["job"]["training"]["max_rounds"] = 3
    raw.update({"trials": 4, "concurrency": 2, "search": {"kind": "random"}, **changes})
    path = tmp_path / "study.json"
    path.write_text(json.dumps(raw))
    return path


def test_the_same_study_through_the_deployed_path(engine_as_aws, tmp_path):
    engine, names = engine_as_aws
    publish_outputs(engine, "SmltStudyTest")
    cfn = engine.client("cloudformation")
    try:
        meta, trials = tune.run(tune.deployed_target("SmltStudyTest", cfn=cfn), small_study(tmp_path), tmp_path, "dep")
    finally:
        cfn.delete_stack(StackName="SmltStudyTest")
    assert meta.status == "SUCCEEDED" and [t.status for t in trials] == ["SUCCEEDED"] * 4
    assert all(t.rounds == 3 for t in trials)  # random search: no trial stopped
    assert ledgers(engine, names, trials) <= meta.budget_usd


def test_a_study_warm_starts_from_another_studys_best(local, tmp_path):
    engine, names = local
    target = tune.local_target(engine)
    first, _ = tune.run(target, small_study(tmp_path, trials=1), tmp_path / "a", "warm-from")
    meta, trials = tune.run(
        target, small_study(tmp_path, trials=1, warm_start={"study": "warm-from"}), tmp_path / "b", "warm-to"
    )
    run = RunTable(names.table, trials[0].run_id, client=engine.client("dynamodb")).meta()
    assert run.job.warm_start == f"s3://{names.artifacts_bucket}/{first.best_model_key}"
    assert StudyTable(names.table, "warm-to", client=engine.client("dynamodb")).study().status == "SUCCEEDED"


def test_a_study_ends_when_its_last_trial_ends_not_when_its_watcher_next_looks(local, tmp_path):
    """The watcher's first look answers a wait of 120 s (poll_seconds) or, when that look cost more
    than its reserve allows, to the deadline; the one trial ends long before: the trials'
    branch ending stops that wait, and the study finishes at once."""
    engine, _ = local
    study = small_study(tmp_path, trials=1, concurrency=1, deadline_seconds=180, poll_seconds=120)
    target = tune.local_target(engine)
    meta, (trial,) = tune.run(target, study, tmp_path, study_id="ends-with-trials")
    assert meta.status == "SUCCEEDED" and trial.status == "SUCCEEDED"
    sfn = engine.client("stepfunctions")
    executions = sfn.list_executions(stateMachineArn=target.study_machine_arn)["executions"]
    (execution,) = [e for e in executions if e["name"] == "ends-with-trials"]
    events = sfn.get_execution_history(executionArn=execution["executionArn"], maxResults=1000)["events"]
    outputs = [
        json.loads(d["output"])
        for e in events
        if (d := e.get("taskSucceededEventDetails") or e.get("lambdaFunctionSucceededEventDetails"))
    ]
    answered = [o["poll_seconds"] for o in outputs if "done" in o]  # Watch's answers
    assert answered and answered[-1] >= 120  # the watcher was waiting 120 s or more when the trial ended
    assert meta.ended_at - trial.ended_at < 20  # not the 120 s the watcher would have waited
    assert execution["stopDate"].timestamp() - trial.ended_at < 30
    assert abs(meta.total_usd - (meta.spent_usd + meta.overhead_usd)) < 1e-9 and meta.total_usd <= meta.budget_usd


def test_the_study_folder_holds_the_best_trials_model_as_a_run_folder_does(local, tmp_path, capsys):
    """`smlt tune --out OUT` writes the best trial's model with its card (model.json) beside it,
    so `smlt predict/export/model OUT` use it as they use a run's folder, and say which run it is;
    a run's outputs already in OUT move into OUT/<run id>/ rather than sit beside the study's model."""
    import numpy as np
    from sklearn.datasets import load_digits

    from smlt.cli import main
    from smlt.inference import load_model

    engine, _ = local
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps({"run_id": "earlier-run", "final": {}}))
    (out / "model.safetensors").write_bytes(b"an earlier run's model")
    path = small_study(tmp_path, trials=2, search={"kind": "random"})
    meta, _ = tune.run(tune.local_target(engine), path, out, study_id="folder-e2e")
    assert meta.best_run_id is not None
    card = json.loads((out / "model.json").read_text())
    assert card["run_id"] == meta.best_run_id and card["model_sha256"]
    model = load_model(out)  # the card's sha256 checked against the file
    assert model.card.run_id == meta.best_run_id and model.card.metrics is not None
    assert (out / "earlier-run" / "model.safetensors").read_bytes() == b"an earlier run's model"
    assert json.loads((out / "best.json").read_text())["best_run_id"] == meta.best_run_id
    x, y = load_digits(return_X_y=True)
    np.savez(tmp_path / "d.npz", x=x[:50], y=y[:50])
    capsys.readouterr()
    assert main(["predict", str(out), str(tmp_path / "d.npz"), "--out", str(tmp_path / "p.csv")]) == 0
    assert main(["model", str(out)]) == 0
    said = capsys.readouterr().out
    assert "wrote 50 predictions" in said and f'"run_id": "{meta.best_run_id}"' in said


def test_smlt_tune_local_injects_faults_into_every_trial_and_logs_the_functions_prints(
    local, tmp_path, monkeypatch, caplog
):
    """`smlt tune --local --faults SPEC` as `smlt run --local --faults`: the trials meet the faults and
    still end; what the functions print goes to OUT/logs/<study id>.log, not the terminal."""
    import smlt.runner
    from smlt.cli import main
    from smlt.faults import FaultInjector

    engine, names = local
    made = []

    def start_engine(faults):
        injector = FaultInjector.from_spec(faults, functions=names.train_functions)
        made.append(injector)
        engine.invoke_filter = injector
        return engine, names, injector

    monkeypatch.setattr(smlt.runner, "start_engine", start_engine)
    monkeypatch.setattr(engine, "stop", lambda: None)
    monkeypatch.chdir(tmp_path)
    study = small_study(tmp_path, trials=2, study_id="faulty-tune")
    try:
        assert main(["tune", "--local", str(study), "--out", "out", "--faults", "fail=0.3,seed=3"]) == 0
    finally:
        engine.invoke_filter = None
    (injector,) = made
    assert injector.counts["fail"] > 0, injector.counts
    assert f"faults injected {injector.counts}" in caplog.text
    assert (tmp_path / "out" / "model.json").exists()
    assert engine.handler_output is None
    log = tmp_path / "out" / "logs" / "faulty-tune.log"
    assert not (tmp_path / "out" / "logs").exists() or log.exists()


def test_faults_without_local_is_refused_before_any_aws_call(tmp_path, capsys):
    from smlt.cli import main

    assert main(["tune", str(small_study(tmp_path)), "--faults", "fail=0.2"]) != 0
    assert "faults: only on the local engine" in capsys.readouterr().err
