"""The study state machine and its controller in the synthesized stack: the shape the local
engine runs (a Map of trials started with startExecution.sync:2 beside the watcher loop) and
least-privilege IAM (the study machine starts and watches only the training machine's executions;
the controller reads and writes only the table and studies/ (and reads runs/ for the best model))."""

from __future__ import annotations

import json
from unittest.mock import ANY

from tests.infra import asl
from tests.infra.test_iam import _grants


def _study_definition(synth):
    (lid,) = [k for k in synth.resources("AWS::StepFunctions::StateMachine") if k.startswith("Study")]
    return lid, json.loads(
        asl.resolve(synth.template, synth.template["Resources"][lid]["Properties"]["DefinitionString"])
    )


def test_trials_are_training_executions_started_up_to_the_concurrency(synth):
    _, defn = _study_definition(synth)
    assert asl.structural_errors(defn) == []
    assert list(defn["States"]) == ["Init", "Run", "Finish", "Done"]
    trials, watcher = defn["States"]["Run"]["Branches"]
    m = trials["States"]["Trials"]
    assert m["Type"] == "Map" and m["MaxConcurrencyPath"] == "$.concurrency" and m["ItemsPath"] == "$.trials"
    run = m["ItemProcessor"]["States"]["RunTrial"]
    assert run["Resource"] == "arn:aws:states:::states:startExecution.sync:2"
    training = next(k for k in synth.resources("AWS::StepFunctions::StateMachine") if k.startswith("Workflow"))
    assert run["Parameters"]["StateMachineArn"] == asl.placeholder(synth.template, training, None)
    assert run["Catch"][0]["Next"] == "TrialFailed"
    # a StartExecution throttled for the account's rate is retried (jittered: the Map's trials
    # start together), not caught as a failed trial
    (start_retry,) = [r for r in run["Retry"] if "StepFunctions.ThrottlingException" in r["ErrorEquals"]]
    assert start_retry["JitterStrategy"] == "FULL" and start_retry["MaxAttempts"] >= 5, start_retry
    assert "StepFunctions.ExecutionLimitExceeded" in start_retry["ErrorEquals"]
    assert watcher["States"]["Poll"]["SecondsPath"] == "$.watch.poll_seconds"  # the watcher paces itself
    assert watcher["States"]["WatchDone"]["Choices"][0]["Next"] == "Watched"
    # the trials' end ends the watcher: their branch fails with one named error, which Run catches
    # into Finish (a Parallel would otherwise wait for the watcher's Wait, up to the deadline)
    assert trials["States"]["Trials"]["Next"] == "TrialsEnded"
    assert trials["States"]["TrialsEnded"] == {"Type": "Fail", "Error": "Study.TrialsEnded", "Cause": ANY}
    (catch,) = defn["States"]["Run"]["Catch"]
    assert catch == {"ErrorEquals": ["Study.TrialsEnded"], "ResultPath": None, "Next": "Finish"}


def test_the_study_machine_starts_and_watches_only_the_training_machine(synth):
    lid, _ = _study_definition(synth)
    training = next(k for k in synth.resources("AWS::StepFunctions::StateMachine") if k.startswith("Workflow"))
    g = _grants(synth, "StudyStateMachineRole")
    controller = next(k for k in synth.resources("AWS::Lambda::Function") if k.startswith("StudyController"))
    assert g.pop("lambda:InvokeFunction") == {f"<{controller}.Arn>", f"<{controller}.Arn>:*"}
    assert g.pop("states:StartExecution") == {f"<{training}>"}
    for action in ("states:DescribeExecution", "states:StopExecution"):
        (res,) = g.pop(action)
        assert res.endswith(f":execution:<{training}.Name>:*"), res
    for action in ("events:PutTargets", "events:PutRule", "events:DescribeRule"):
        (res,) = g.pop(action)
        assert res.endswith(":rule/StepFunctionsGetEventsForStepFunctionsExecutionRule")
    assert all(a.startswith(("xray:", "logs:")) for a in g), sorted(g)


def test_the_controller_reads_and_writes_only_its_items_and_studies(synth):
    g = _grants(synth, "StudyControllerRole")
    artifacts = next(k for k in synth.resources("AWS::S3::Bucket") if k.startswith("StorageArtifacts"))
    table = next(iter(synth.resources("AWS::DynamoDB::Table")))
    assert g.pop("s3:PutObject") == {f"<{artifacts}.Arn>/studies/*/*"}
    # its studies, and the best trial's final model (copied to studies/<id>/best/)
    assert g.pop("s3:GetObject") == {f"<{artifacts}.Arn>/studies/*/*", f"<{artifacts}.Arn>/runs/*/final/*"}
    assert all(res == {f"<{table}.Arn>"} for a, res in g.items() if a.startswith("dynamodb:"))
    assert not [a for a in g if a.startswith(("states:", "lambda:", "s3:"))]


def test_the_study_definition_passes_cfn_lint(synth):
    from tests.infra.test_cfn_lint import _definition_template, _describe, _lint

    _, defn = _study_definition(synth)
    matches = _lint(_definition_template(defn))
    assert _describe([m for m in matches if m.rule.id[0] in "EW"]) == []
