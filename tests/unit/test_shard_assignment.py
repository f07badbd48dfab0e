"""The planner's train shard assignment: lost shards handed out again, a shard a worker could not
read moved to another worker, every worker left with a shard."""

from smlt.runtime.steps.plan import assign_shards


def _held(out):
    return sorted({s for held in out for s in held})


def test_a_failed_shard_moves_to_the_least_loaded_other_worker():
    out = assign_shards(8, 4, lost=[0, 4], failed_on={0: 0})
    assert 0 not in out[0] and _held(out) == list(range(8))
    assert out == [[4], [1, 5, 4], [2, 6, 0], [3, 7]]  # 4 handed out as a lost shard, 0 moved


def test_one_shard_each_swaps_the_failed_one():
    out = assign_shards(4, 4, lost=[2], failed_on={2: 2})
    assert 2 not in out[2] and all(out) and _held(out) == list(range(4))


def test_more_workers_than_shards_share_another_one():
    out = assign_shards(2, 4, lost=[0], failed_on={0: 0})  # workers 0 and 2 share shard 0
    assert 0 not in out[0] and all(out) and _held(out) == [0, 1]


def test_a_single_worker_keeps_its_shard_for_the_retry():
    assert assign_shards(3, 1, lost=[0, 1, 2], failed_on={1: 0}) == [[0, 1, 2]]


def test_a_worker_of_a_larger_round_is_not_moved_into():
    out = assign_shards(8, 2, lost=[3], failed_on={3: 3})  # worker 3 is not in this round
    assert _held(out) == list(range(8)) and all(out)


def test_a_failed_validation_shard_moves_to_another_worker_and_is_evaluated_once():
    from smlt.runtime.steps.plan import assign_val_shards

    out = assign_val_shards(4, 4, failed_on={2: 2})
    assert out is not None and 2 not in out[2] and sorted(s for held in out for s in held) == [0, 1, 2, 3]
    assert out == [[0, 2], [1], [], [3]]  # the least loaded other worker takes it
    # More workers than shards: a worker that evaluates none takes it.
    assert assign_val_shards(2, 3, failed_on={1: 1}) == [[0], [], [1]]


def test_nothing_moves_without_another_worker_or_when_the_shard_is_elsewhere_already():
    from smlt.runtime.steps.plan import assign_val_shards

    assert assign_val_shards(3, 1, failed_on={1: 0}) is None  # a single worker is its own retry
    assert assign_val_shards(4, 2, failed_on={1: 0}) is None  # round-robin gives shard 1 to worker 1
    assert assign_val_shards(4, 2, failed_on={0: 3}) is None  # worker 3 is not in this round


def test_the_spec_reads_its_validation_assignment():
    from smlt.runtime.job import parse_job
    from smlt.runtime.roundspec import RoundSpec

    job = parse_job({"name": "j", "dataset": {"uri": "s3://b/p/"}})
    spec = RoundSpec(
        run_id="r",
        round=1,
        workers=2,
        memory_mb=1769,
        local_steps=5,
        function_name="f",
        planned_at=0.0,
        learning_rate=0.1,
        job=job,
        val_assignments=[[], [0, 1]],
    )
    assert spec.val_shards(0, 2) == [] and spec.val_shards(1, 2) == [0, 1]
    default = spec.model_copy(update={"val_assignments": None})
    assert default.val_shards(0, 2) == [0] and default.val_shards(1, 2) == [1]
