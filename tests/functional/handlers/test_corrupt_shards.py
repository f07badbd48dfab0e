"""A training shard that cannot be read (corrupt, missing) is retried by another worker the next
round and then fails the run naming it; a shard fine on its retry costs no data. On moto."""

import pytest
from botocore.exceptions import ClientError

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime.errors import CorruptShard
from smlt.runtime.records import RunTable
from tests.functional.handlers.conftest import job

SHARD = "datasets/digits/train-00000.safetensors"  # train shard 0


def plan(j, run):
    return planner({"op": "plan", "job": j, "execution": run}, None)


def train_round(run, p):
    """Run every worker of the planned round; the workers that raised CorruptShard."""
    failed = []
    for w in p["workers"]:
        try:
            train_step({"run_id": run, "round": p["round"], "worker": w}, None)
        except CorruptShard:
            failed.append(w)
    return failed


def assignments(run, rnd):
    spec = RunTable("smlt-runs", run).plan(rnd).spec
    return [spec.train_shards(w, 8) for w in range(spec.workers)]


def owners(run, rnd, shard):
    return [w for w, held in enumerate(assignments(run, rnd)) if shard in held]


def first_failure(aws, run, j, damage):
    """Round 0 with shard 0 damaged: its worker fails and names the shard; the round still
    aggregates (3 of 4 is a quorum) and round 1's plan gives shard 0 to another worker."""
    damage()
    p = plan(j, run)
    assert train_round(run, p) == owners(run, 0, 0) == [0]
    errors = RunTable("smlt-runs", run).errors(0)
    assert errors[0].error == "CorruptShard"
    assert errors[0].shard is not None and errors[0].shard.key == "train-00000.safetensors"
    assert errors[0].shard.split == "train" and errors[0].shard.index == 0
    assert aggregate({"run_id": run, "round": 0}, None)["round"] == 0
    p1 = plan(j, run)
    assert p1["round"] == 1
    retry_by = owners(run, 1, 0)
    assert retry_by and 0 not in retry_by  # the retry is by different hands
    assert sorted({s for held in assignments(run, 1) for s in held}) == list(range(8))
    return p1, retry_by, errors[0].shard.reason


@pytest.mark.parametrize(
    "kind,reason",
    [
        ("corrupt", "digest"),
        ("missing", "missing"),
    ],
)
def test_a_shard_failing_on_two_workers_fails_the_run_naming_it(digits, aws, kind, reason):
    run = f"bad-{kind}"
    j = job(digits, target_value=None)

    def damage():
        if kind == "corrupt":
            aws.put_object(Bucket="smlt-data", Key=SHARD, Body=b"garbage")
        else:
            aws.delete_object(Bucket="smlt-data", Key=SHARD)

    p1, retry_by, seen = first_failure(aws, run, j, damage)
    assert seen == reason
    assert train_round(run, p1) == retry_by
    with pytest.raises(CorruptShard, match=r"train shard train-00000\.safetensors failed twice") as e:
        aggregate({"run_id": run, "round": 1}, None)
    assert f"on worker 0 in round 0 and on worker {retry_by[0]} in round 1" in str(e.value)
    assert "prepare the dataset again" in str(e.value)
    assert "s3://smlt-data/datasets/digits/train-00000.safetensors" in str(e.value)


def test_a_shard_fine_on_its_retry_costs_no_data(digits, aws):
    run = "flaky"
    j = job(digits, target_value=None)
    good = aws.get_object(Bucket="smlt-data", Key=SHARD)["Body"].read()
    p1, retry_by, _ = first_failure(aws, run, j, lambda: aws.put_object(Bucket="smlt-data", Key=SHARD, Body=b"x"))
    aws.put_object(Bucket="smlt-data", Key=SHARD, Body=good)  # repaired before the retry
    assert train_round(run, p1) == []
    r1 = aggregate({"run_id": run, "round": 1}, None)
    assert r1["round"] == 1 and not r1["stop"]
    rounds = RunTable("smlt-runs", run).rounds()
    # Every worker of round 1 applied, and between them they held every shard.
    assert sorted(a.worker for a in rounds[1].accepted) == p1["workers"]
    assert plan(j, run)["round"] == 2


def test_a_transient_read_error_does_not_count_against_the_shard(digits, aws, monkeypatch):
    from smlt.runtime.store import S3Store

    run = "transient"
    j = job(digits, target_value=None)
    real_get = S3Store.get

    def flaky_get(self, key, *a, **kw):
        if key.endswith("train-00000.safetensors"):
            raise ClientError(
                {"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."}}, "GetObject"
            )
        return real_get(self, key, *a, **kw)

    monkeypatch.setattr(S3Store, "get", flaky_get)
    for rnd in range(2):  # the read fails in two rounds running: still not the shard's fault
        p = plan(j, run)
        assert p["round"] == rnd
        for w in p["workers"]:
            try:
                train_step({"run_id": run, "round": rnd, "worker": w}, None)
            except ClientError:
                assert 0 in assignments(run, rnd)[w]
        assert RunTable("smlt-runs", run).errors(rnd) == {}
        assert aggregate({"run_id": run, "round": rnd}, None)["round"] == rnd
