"""The Lambda events and answers (smlt/runtime/steps/events.py): the default op where the state machine
sends none, a bad event named by its field, and answers that dump to the JSON the state machine
reads (docs/architecture.md, "Payload shapes")."""

import pytest

from smlt.runtime.steps.events import (
    AGGREGATE_EVENTS,
    PLANNER_EVENTS,
    TRAIN_EVENTS,
    AggregateEvent,
    FinalizeEvent,
    InvalidEvent,
    NotPrepared,
    PlanEvent,
    PlanOther,
    PlanTrain,
    Prepared,
    RoundAnswer,
    SliceAnswer,
    SliceEvent,
    TrainAnswer,
    parse_event,
)


def test_the_default_op_applies_where_the_state_machine_sends_none():
    # The Aggregate task's payload has no op; the Plan task's has one, a direct invoke may not.
    agg = parse_event(AGGREGATE_EVENTS, {"run_id": "r", "round": 3, "outcomes": [{"worker": 0, "ok": True}]})
    assert isinstance(agg, AggregateEvent) and agg.op == "aggregate" and agg.round == 3
    plan = parse_event(PLANNER_EVENTS, {"job": {"name": "j"}, "execution": None})
    assert isinstance(plan, PlanEvent) and plan.op == "plan" and plan.execution == "run"
    assert isinstance(parse_event(PLANNER_EVENTS, {"op": "finalize", "run_id": "r"}), FinalizeEvent)
    sliced = parse_event(AGGREGATE_EVENTS, {"op": "slice", "run_id": "r", "round": 1, "slice": 2, "of": 8})
    assert isinstance(sliced, SliceEvent) and (sliced.slice, sliced.of) == (2, 8)
    # Step Functions sends numbers from JSONPath as numbers; integral floats are rounds too.
    assert parse_event(TRAIN_EVENTS, {"run_id": "r", "round": 1.0, "worker": 2}).round == 1


@pytest.mark.parametrize(
    "adapter, event, named",
    [
        (AGGREGATE_EVENTS, {"op": "slice", "run_id": "r", "round": 1, "slice": 0}, "slice.of: Field required"),
        (AGGREGATE_EVENTS, {"run_id": "r", "round": "x"}, "aggregate.round: Input should be a valid integer"),
        (AGGREGATE_EVENTS, {"op": "reduce", "run_id": "r", "round": 1}, "op: Input tag 'reduce'"),
        (PLANNER_EVENTS, {"op": "chain", "job": {}, "run_id": "r", "round": 1}, "chain.state_machine: Field required"),
        (TRAIN_EVENTS, {"run_id": "r", "round": 0, "wroker": 1}, "wroker: Extra inputs are not permitted"),
    ],
)
def test_a_bad_event_is_named_by_its_field(adapter, event, named):
    with pytest.raises(InvalidEvent) as e:
        parse_event(adapter, event)
    assert named in str(e.value)


def dumped(answer):
    """The answer as the handler returns it, keys in order."""
    d = answer.model_dump(mode="json")
    return list(d.items())


def test_answers_dump_to_the_json_the_state_machine_reads():
    train = PlanTrain(
        run_id="r",
        round=2,
        workers=[0, 1],
        function_name="f",
        memory_mb=1769,
        local_steps=5,
        max_concurrency=2,
        fanout="inline",
        aggregators=1,
        slices=[0],
        worker_timeout_s=30,
        reason="why",
    )
    assert [k for k, _ in dumped(train)] == [
        "action",
        "run_id",
        "round",
        "workers",
        "function_name",
        "memory_mb",
        "local_steps",
        "max_concurrency",
        "fanout",
        "aggregators",
        "slices",
        "worker_timeout_s",
        "reason",
    ]
    assert dumped(train)[0] == ("action", "train")
    assert dumped(PlanOther(action="chain", run_id="r", round=4, reason="x")) == [
        ("action", "chain"),
        ("run_id", "r"),
        ("round", 4),
        ("reason", "x"),
    ]
    done = RoundAnswer(round=1, stop=True, reason="target", val_accuracy=0.9, val_loss=0.3, cost_usd=0.01)
    assert dumped(done) == [
        ("round", 1),
        ("stop", True),
        ("reason", "target"),
        ("val_accuracy", 0.9),
        ("val_loss", 0.3),
        ("cost_usd", 0.01),
    ]
    # "retry" is there only for a quorum retry
    retry = RoundAnswer(round=1, stop=False, retry=True, reason="quorum not reached (attempt 1)")
    assert dumped(retry) == [
        ("round", 1),
        ("stop", False),
        ("retry", True),
        ("reason", "quorum not reached (attempt 1)"),
        ("val_accuracy", None),
        ("val_loss", None),
        ("cost_usd", None),
    ]
    assert dumped(NotPrepared(**retry.model_dump()))[-1] == ("proceed", False)
    assert dict(dumped(NotPrepared(**retry.model_dump()))) == {**dict(dumped(retry)), "proceed": False}
    assert dumped(Prepared(round=1, accepted=3, aggregators=8)) == [
        ("round", 1),
        ("proceed", True),
        ("stop", False),
        ("accepted", 3),
        ("aggregators", 8),
    ]
    assert dumped(SliceAnswer(slice=2, finite=False)) == [("slice", 2), ("finite", False)]
    assert dict(dumped(SliceAnswer(slice=2, finite=True, seconds=0.5, skipped=False))) == {
        "slice": 2,
        "finite": True,
        "seconds": 0.5,
        "skipped": False,
    }
    assert dumped(TrainAnswer(worker=3, samples=64)) == [("worker", 3), ("samples", 64)]
    assert dict(dumped(TrainAnswer(worker=3, samples=64, duplicate=True))) == {
        "worker": 3,
        "samples": 64,
        "duplicate": True,
    }
