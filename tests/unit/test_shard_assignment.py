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
