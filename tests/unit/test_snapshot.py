"""What a local run's snapshot keeps: the run up to its newest aggregated round and the next
round's model, never half a round."""

from smlt import keys
from smlt.snapshot import _kept


def test_objects_kept_up_to_the_newest_round_and_the_next_model():
    run, newest = "r", 3
    assert _kept(keys.job_key(run), newest)
    assert _kept(keys.model_key(run, 3), newest)
    assert not _kept(keys.update_key(run, 3, 0), newest)  # aggregated: never read again
    assert _kept(keys.model_key(run, 4), newest)  # what round 4 starts from
    assert _kept(keys.slice_key(run, 4, 0, 2), newest) and _kept(keys.slices_manifest_key(run, 4), newest)
    assert not _kept(keys.update_key(run, 4, 1), newest)  # round 4 is in progress
    assert not _kept(keys.accepted_key(run, 4), newest)
    assert not _kept(keys.sync_prefix(run, 4) + "000001/grad/00000.safetensors", newest)
    assert not _kept(keys.model_key(run, 5), newest)
    assert _kept(keys.final_model_key(run), newest)
