"""Bad input met inside a run, on moto: the handlers' named errors name the object and say what
to do, and leave what is stored as it was."""

import numpy as np
import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.train_step.handler import handler as train_step
from smlt.runtime import keys
from smlt.runtime.errors import InvalidDataset, InvalidJob, QuorumNotReached
from smlt.runtime.tensors.format import decode, encode
from tests.functional.handlers.conftest import job, run_keys
from tests.functional.handlers.test_failures import plan


def test_quorum_lost_in_round_0_does_not_advise_a_resume(digits, aws):
    plan(job(digits), "q0")
    for _ in range(2):  # a quorum retry, then Plan hands the round out again
        aggregate({"run_id": "q0", "round": 0}, None)
        plan(job(digits), "q0")
    with pytest.raises(QuorumNotReached) as e:
        aggregate({"run_id": "q0", "round": 0}, None)
    msg = str(e.value)
    assert "none recorded a named error" in msg
    assert "nothing to resume: start the run again" in msg and "smlt resume" not in msg


def _lose_round_1(uri, run_id, damage=None):
    """Round 0 aggregated, model 1 damaged by `damage(key)`, then round 1 without a worker:
    the QuorumNotReached message."""
    p = plan(job(uri), run_id)
    for w in p["workers"]:
        train_step({"run_id": run_id, "round": 0, "worker": w}, None)
    aggregate({"run_id": run_id, "round": 0}, None)
    plan(job(uri), run_id)
    if damage:
        damage(keys.model_key(run_id, 1))
    for _ in range(2):  # a quorum retry, then Plan hands the round out again
        aggregate({"run_id": run_id, "round": 1}, None)
        plan(job(uri), run_id)
    with pytest.raises(QuorumNotReached) as e:
        aggregate({"run_id": run_id, "round": 1}, None)
    return str(e.value)


def test_quorum_lost_after_round_0_advises_the_resume(digits, aws):
    msg = _lose_round_1(digits, "q1")
    assert "round 1: fewer than 2 of 4" in msg and "resume the run with `smlt resume q1`" in msg


def _get(s3, key):
    return s3.get_object(Bucket="smlt-artifacts", Key=key)["Body"].read()


def _missing(s3, key):
    s3.delete_object(Bucket="smlt-artifacts", Key=key)


def _truncated(s3, key):
    s3.put_object(Bucket="smlt-artifacts", Key=key, Body=_get(s3, key)[:200])


def _nan(s3, key):
    state = decode(_get(s3, key))
    name = sorted(state)[0]
    state[name] = np.full_like(state[name], np.nan)
    s3.put_object(Bucket="smlt-artifacts", Key=key, Body=encode(state))


@pytest.mark.parametrize(
    "damage, needle", [(_missing, "is missing"), (_truncated, "is unreadable"), (_nan, "holds NaN or Inf")]
)
def test_quorum_lost_to_a_damaged_model_names_it(digits, aws, damage, needle):
    msg = _lose_round_1(digits, "dmg", lambda key: damage(aws, key))
    assert f"model 1 ({keys.model_key('dmg', 1)}) {needle}" in msg
    assert "start the run again (a resume would read the same model)" in msg and "smlt resume" not in msg


def test_a_garbage_update_is_named_by_its_key(digits, aws):
    """An update replaced in storage no longer matches its record's digest: it is refused with a
    reason naming its key (it used to fail the round with HeaderError) and never averaged."""
    from smlt.runtime.items import RoundItem
    from smlt.runtime.records import RunTable

    p = plan(job(digits), "garbage")
    for w in p["workers"]:
        train_step({"run_id": "garbage", "round": 0, "worker": w}, None)
    key = keys.update_key("garbage", 0, 2)
    aws.put_object(Bucket="smlt-artifacts", Key=key, Body=b"not a safetensors file")
    aggregate({"run_id": "garbage", "round": 0}, None)
    item = RunTable("smlt-runs", "garbage").get(keys.round_sk(0), RoundItem)
    assert item is not None and [a.worker for a in item.accepted] == [0, 1, 3]
    assert [r.worker for r in item.rejected] == [2] and key in item.rejected[0].reason


@pytest.mark.parametrize(
    "body, needle",
    [(b'{"name": ', "is not valid JSON"), (b'{"name": "x"}', "is not an smlt dataset manifest: source")],
)
def test_a_corrupt_manifest_on_s3_names_its_uri(digits, aws, body, needle):
    from smlt.runtime.data.shards import read_manifest

    aws.put_object(Bucket="smlt-data", Key="datasets/bad/manifest.json", Body=body)
    read_manifest.cache_clear()
    with pytest.raises(InvalidDataset, match=f"dataset.uri: s3://smlt-data/datasets/bad/manifest.json {needle}"):
        plan(job("s3://smlt-data/datasets/bad/"), "badman")
    assert run_keys(aws, "badman") == []


def test_a_batch_larger_than_the_training_split_on_s3_is_refused_by_the_planner(digits, aws):
    with pytest.raises(InvalidJob, match="training.batch_size: 5000 is larger than the whole training split"):
        plan(job(digits, batch_size=5000), "bigbatch")
    assert run_keys(aws, "bigbatch") == []
