"""The state machine definition: valid ASL, JSONPath only, and the shape of docs/architecture.md."""

from __future__ import annotations

import inspect

import pytest

from smlt.runtime.fanout import INLINE_MAX, plan_slices
from tests.infra import asl

SERVICE_ERRORS = {
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.ClientExecutionTimeoutException",
}


@pytest.fixture(scope="module")
def defn(synth):
    return asl.definition(synth.template)


@pytest.fixture(scope="module")
def states(defn):
    return asl.all_states(defn)


def _fn_arn(synth, prefix):
    (lid,) = [k for k in synth.resources("AWS::Lambda::Function") if k.startswith(prefix)]
    return asl.placeholder(synth.template, lid, "Arn")


def test_definition_is_valid_asl(defn):
    assert asl.structural_errors(defn) == []


def test_jsonpath_only(defn, synth):
    text = str(defn)
    assert "JSONata" not in text and "{%" not in text
    assert "QueryLanguage" not in defn or defn["QueryLanguage"] == "JSONPath"


def test_every_task_has_a_timeout_and_retries(states):
    tasks = {n: s for n, s in states.items() if s["Type"] == "Task"}
    assert set(tasks) == {
        "Plan",
        "TrainWorker",
        "TrainWorkerDistributed",
        "Aggregate",
        "AggregatePrepare",
        "AggregateSlice",
        "AggregateFinish",
        "Finalize",
        "Chain",
        "PrepareData",
        "PrepareFailed",
        "PartStatsPart",
        "MergeStats",
        "PartMomentsPart",
        "MergeMoments",
        "PartShardsPart",
        "FinishParts",
    }
    for name, st in tasks.items():
        assert "TimeoutSeconds" in st or "TimeoutSecondsPath" in st, name
        if "TimeoutSeconds" in st:
            assert 0 < st["TimeoutSeconds"] <= 960, name
        retried = {}
        for r in st["Retry"]:
            for e in r["ErrorEquals"]:
                retried[e] = r
        assert SERVICE_ERRORS <= set(retried), name
        throttle = retried["Lambda.TooManyRequestsException"]
        assert throttle["BackoffRate"] > 1 and throttle["MaxAttempts"] >= 3, name
        assert retried["Lambda.ServiceException"]["BackoffRate"] > 1, name
        # The idempotent control steps run again when their process died (not the workers: a
        # worker's failure is the Map's business, nor PrepareFailed, which tells the
        # topic; PrepareData once: out of memory on an input would die again).
        # A part's child neither: it prepares its part as PrepareData prepares an input.
        if name == "PrepareData":
            died = retried["Runtime.ExitError"]
            assert retried["Lambda.Unknown"] is died and died["MaxAttempts"] == 1, name
        elif name not in ("TrainWorker", "TrainWorkerDistributed", "PrepareFailed") and not name.endswith("Part"):
            died = retried["Runtime.ExitError"]
            assert retried["Lambda.Unknown"] is died and died["BackoffRate"] > 1 and died["MaxAttempts"] >= 2, name
        else:
            assert "Runtime.ExitError" not in retried, name
        # The idempotent control steps (PrepareData and the steps after a table's parts too) run
        # again, after a pause, when a request of theirs stayed throttled through botocore's
        # attempts (smlt.runtime.retry.named_throttles): 5, 10, 20 s, then the execution fails.
        if name in ("TrainWorker", "TrainWorkerDistributed", "PrepareFailed") or name.endswith("Part"):
            assert "Throttled" not in retried, name
        else:
            assert retried["Throttled"] == {
                "ErrorEquals": ["Throttled"],
                "IntervalSeconds": 5,
                "MaxAttempts": 3,
                "BackoffRate": 2,
            }, name


def test_contract_shape(states, synth):
    planner, aggregate = _fn_arn(synth, "FunctionsPlanner"), _fn_arn(synth, "FunctionsAggregate")
    assert states["Start"] == {
        "Type": "Pass",
        "Parameters": {"job.$": "$", "execution.$": "$$.Execution.Name"},
        "Next": "HowToStart",
    }
    # A raw upload's marker (smlt.runtime.trigger) is prepared first; anything else is planned.
    how_to_start = states["HowToStart"]
    assert how_to_start["Choices"] == [
        {
            "And": [
                {"Variable": "$.job.trigger.key", "IsPresent": True},
                {"Variable": "$.job.trigger.key", "StringMatches": "incoming/*/_SUCCESS"},
            ],
            "Next": "PrepareData",
        }
    ]
    assert how_to_start["Default"] == "Plan"
    prepare = states["PrepareData"]
    assert prepare["Resource"] == _fn_arn(synth, "FunctionsPrepare")
    assert prepare["Parameters"] == {"op": "prepare_data", "trigger.$": "$.job.trigger", "execution.$": "$.execution"}
    assert prepare["ResultPath"] == "$.prepared" and prepare["Next"] == "DataPrepared"
    assert prepare["TimeoutSeconds"] == 960  # the function's 15 minutes and the task's headroom
    # failed for good (after its retry): PrepareFailed tells the topic, then the execution fails
    # with PrepareData's own error (and its cause as PrepareFailed words it)
    (catch,) = prepare["Catch"]
    assert catch == {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "PrepareFailed"}
    failed = states["PrepareFailed"]
    assert failed["Parameters"] == {
        "op": "prepare_failed",
        "trigger.$": "$.job.trigger",
        "execution.$": "$.execution",
        "error.$": "$.error",
    }
    assert failed["Next"] == "PrepareDataFailed" and failed["Catch"][0]["Next"] == "PrepareDataFailedUntold"
    assert states["PrepareDataFailed"] == {
        "Type": "Fail",
        "ErrorPath": "$.error.Error",
        "CausePath": "$.failed.cause",
    }
    assert states["PrepareDataFailedUntold"]["CausePath"] == "$.error.Cause"
    # so are the steps after a table's parts' Maps, failed for good: the same PrepareFailed, which
    # tells the topic once (not again when the step told it: a named data error, a part's)
    for step in ("MergeStats", "MergeMoments", "FinishParts"):
        (catch,) = states[step]["Catch"]
        assert catch == {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "PrepareFailed"}, step
    prepared = states["DataPrepared"]
    assert prepared["Choices"] == [
        {"Variable": "$.prepared.action", "StringEquals": "duplicate", "Next": "Duplicate"},
        {"Variable": "$.prepared.action", "StringEquals": "parts", "Next": "PartStats"},
    ]
    assert prepared["Default"] == "Plan"
    # A table in many files (smlt.runtime.steps.prepare_parts): a Distributed Map per pass over
    # $.prepared.parts, each child's error caught in the child, the step after the Map raising it.
    chain = [
        ("PartStats", "part_stats", "MergeStats"),
        ("PartMoments", "part_moments", "MergeMoments"),
        ("PartShards", "part_shards", "FinishParts"),
    ]
    for fan, op, after in chain:
        m = states[fan]
        assert m["Type"] == "Map" and m["ItemProcessor"]["ProcessorConfig"]["Mode"] == "DISTRIBUTED"
        assert m["ItemsPath"] == "$.prepared.parts" and m["ResultPath"] == "$.part_results" and m["Next"] == after
        assert m["ItemSelector"]["op"] == op
        assert m["ItemSelector"]["part.$"] == "$$.Map.Item.Value.part"
        child = m["ItemProcessor"]["States"][f"{fan}Part"]
        assert child["Resource"] == _fn_arn(synth, "FunctionsPrepare") and "Parameters" not in child  # the item
        (catch,) = child["Catch"]
        assert catch["ErrorEquals"] == ["States.ALL"] and catch["Next"] == f"{fan}Failed"
        assert states[after]["Parameters"]["results.$"] == "$.part_results"
    assert states["MergeStats"]["Next"] == "StatsMerged"
    assert states["StatsMerged"]["Default"] == "PartMoments"
    assert states["ReadAsText"]["Next"] == "PartStats"
    assert states["FinishParts"]["ResultPath"] == "$.prepared" and states["FinishParts"]["Next"] == "Plan"
    plan = states["Plan"]
    assert plan["Resource"] == planner
    assert plan["Parameters"] == {
        "op": "plan",
        "job.$": "$.job",
        "execution.$": "$.execution",
        "state_machine.$": "$$.StateMachine.Id",
    }
    assert plan["ResultPath"] == "$.plan" and plan["Next"] == "ShouldTrain"

    should = states["ShouldTrain"]
    routes = {c["StringEquals"]: c["Next"] for c in should["Choices"] if c["Variable"] == "$.plan.action"}
    assert routes == {"stop": "Finalize", "chain": "Chain", "duplicate": "Duplicate"}
    assert should["Default"] == "HowToTrain"

    # The planner names the round's Map (smlt.runtime.fanout): inline for a few workers, Distributed above.
    how_to_train = states["HowToTrain"]
    assert how_to_train["Choices"] == [
        {"Variable": "$.plan.fanout", "StringEquals": "distributed", "Next": "TrainDistributed"}
    ]
    assert how_to_train["Default"] == "Train"
    for suffix, mode in (("", "INLINE"), ("Distributed", "DISTRIBUTED")):
        train = states[f"Train{suffix}"]
        assert train["Type"] == "Map"
        assert train["ItemProcessor"].get("ProcessorConfig", {}).get("Mode", "INLINE") == mode
        # Standard children: a worker may run 15 minutes, an Express child only 5.
        assert train["ItemProcessor"].get("ProcessorConfig", {}).get("ExecutionType", "STANDARD") == "STANDARD"
        assert train["ItemsPath"] == "$.plan.workers"
        assert train["MaxConcurrencyPath"] == "$.plan.max_concurrency"
        assert train["ItemSelector"] == {
            "run_id.$": "$.plan.run_id",
            "round.$": "$.plan.round",
            "worker.$": "$$.Map.Item.Value",
            "function_name.$": "$.plan.function_name",
            "timeout_s.$": "$.plan.worker_timeout_s",
        }
        assert train["ResultPath"] == "$.outcomes" and train["Next"] == "HowToAggregate"
        if "ToleratedFailurePercentage" in train:  # moto's grammar needs a float
            assert isinstance(train["ToleratedFailurePercentage"], float)
        assert train["ItemProcessor"]["StartAt"] == f"TrainWorker{suffix}"

        worker = states[f"TrainWorker{suffix}"]
        assert worker["Resource"] == "arn:aws:states:::lambda:invoke"
        assert worker["Parameters"] == {
            "FunctionName.$": "$.function_name",
            "Payload": {"run_id.$": "$.run_id", "round.$": "$.round", "worker.$": "$.worker"},
        }
        assert worker["ResultSelector"] == {"worker.$": "$.Payload.worker", "ok": True}
        assert worker["TimeoutSecondsPath"] == "$.timeout_s"
        failed = f"WorkerFailed{suffix}"
        assert worker["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": failed}]
        assert states[failed]["Parameters"] == {"worker.$": "$.worker", "ok": False, "error.$": "$.error.Error"}
        assert states[failed]["End"] is True and worker["End"] is True

    how = states["HowToAggregate"]
    assert how["Choices"] == [
        {
            "And": [
                {"Variable": "$.plan.aggregators", "IsPresent": True},
                {"Variable": "$.plan.aggregators", "NumericGreaterThan": 1},
            ],
            "Next": "AggregatePrepare",
        }
    ]
    assert how["Default"] == "Aggregate"

    agg = states["Aggregate"]
    assert agg["Resource"] == aggregate
    assert agg["Parameters"] == {"run_id.$": "$.plan.run_id", "round.$": "$.plan.round", "outcomes.$": "$.outcomes"}
    assert agg["ResultPath"] == "$.agg" and agg["Next"] == "Continue"

    # sharded aggregation: prepare → Map of slices (inline) → finish, all the Aggregate function
    prep = states["AggregatePrepare"]
    assert prep["Resource"] == aggregate
    assert prep["Parameters"] == {"op": "prepare", "run_id.$": "$.plan.run_id", "round.$": "$.plan.round"}
    assert prep["ResultPath"] == "$.agg" and prep["Next"] == "Prepared"
    prepared = states["Prepared"]
    assert prepared["Choices"] == [{"Variable": "$.agg.proceed", "BooleanEquals": True, "Next": "AggregateSlices"}]
    assert prepared["Default"] == "Continue"
    slices = states["AggregateSlices"]
    assert slices["Type"] == "Map" and slices["ItemsPath"] == "$.plan.slices"
    assert slices["ItemProcessor"]["ProcessorConfig"]["Mode"] == "INLINE"
    assert slices["ItemSelector"] == {
        "run_id.$": "$.plan.run_id",
        "round.$": "$.plan.round",
        "slice.$": "$$.Map.Item.Value",
        "of.$": "$.plan.aggregators",
    }
    assert slices["ResultPath"] is None and slices["Next"] == "AggregateFinish"
    # the planner never plans more aggregators than the Map runs at once (one constant, read by both)
    assert (
        slices["MaxConcurrency"] == INLINE_MAX == inspect.signature(plan_slices).parameters["max_aggregators"].default
    )
    one = states["AggregateSlice"]
    assert one["Resource"] == aggregate and one["ResultPath"] is None and one["End"] is True
    assert one["Parameters"] == {
        "op": "slice",
        "run_id.$": "$.run_id",
        "round.$": "$.round",
        "slice.$": "$.slice",
        "of.$": "$.of",
    }
    fin_agg = states["AggregateFinish"]
    assert fin_agg["Resource"] == aggregate
    assert fin_agg["Parameters"] == {"op": "finish", "run_id.$": "$.plan.run_id", "round.$": "$.plan.round"}
    assert fin_agg["ResultPath"] == "$.agg" and fin_agg["Next"] == "Continue"

    cont = states["Continue"]
    assert cont["Choices"] == [{"Variable": "$.agg.stop", "BooleanEquals": True, "Next": "Finalize"}]
    assert cont["Default"] == "Plan"

    fin = states["Finalize"]
    assert fin["Resource"] == planner
    assert fin["Parameters"] == {"op": "finalize", "run_id.$": "$.plan.run_id"}
    assert fin["ResultPath"] == "$.final" and fin["Next"] == "Done"
    assert states["Done"]["Type"] == "Succeed"

    chain = states["Chain"]
    assert chain["Resource"] == planner
    assert chain["Parameters"] == {
        "op": "chain",
        "job.$": "$.job",
        "run_id.$": "$.plan.run_id",
        "round.$": "$.plan.round",
        "state_machine.$": "$$.StateMachine.Id",
    }
    assert chain["ResultPath"] == "$.chain" and chain["Next"] == "Chained"
    assert states["Chained"]["Type"] == "Succeed"
    assert states["Duplicate"]["Type"] == "Succeed"


def test_structural_checker_catches_mistakes():
    bad = {
        "StartAt": "A",
        "States": {
            "A": {"Type": "Pass", "Next": "Missing"},
            "B": {"Type": "Pass", "End": True},
            "C": {"Type": "Task", "Resource": "x"},
        },
    }
    errors = asl.structural_errors(bad)
    assert any("Missing" in e for e in errors)
    assert any("B: unreachable" in e for e in errors)
    assert any("C: neither Next nor End" in e for e in errors)
