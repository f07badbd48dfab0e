"""cdk context `data_buckets` and `data_kms_keys` (docs/deploy.md, "Datasets in your own buckets"):
the functions that read datasets (the planner, train_step at every tier) may read the user's
buckets (or only the folders named), and decrypt through S3 with the keys named; nothing else
is granted on them. Checked with the evaluator the local engine enforces with
(smlt/local/iam_record.py) on the synthesized policies."""

from __future__ import annotations

import pytest

from infra.stacks.settings import Settings
from smlt.local.iam_record import Request, RolePolicies, requests
from smlt.local.resolve import Resolver
from tests.infra.conftest import synthesize

KEY = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
CONTEXT = {"data_buckets": ["team-data", "shared.bucket/team-a/"], "data_kms_keys": [KEY]}


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> RolePolicies:
    syn = synthesize(tmp_path_factory.mktemp("cdk-data-buckets"), CONTEXT)
    return RolePolicies(syn.template, Resolver(syn.template, syn.stack.stack_name))


def _fn(policies: RolePolicies, part: str) -> list[str]:
    found = [f for f in policies.statements if part in f]
    assert found, part
    return found


def _get(bucket: str, key: str) -> list[Request]:
    return requests("s3", "GetObject", {"Bucket": bucket, "Key": key}, "us-east-1")


def _list(bucket: str, prefix: str) -> list[Request]:
    return requests("s3", "ListObjectsV2", {"Bucket": bucket, "Prefix": prefix}, "us-east-1")


def _decrypt(key: str, via: str) -> Request:
    return Request("kms:Decrypt", key, {"kms:ViaService": via})


def test_dataset_readers_read_the_given_buckets_and_folders_and_decrypt_through_s3(policies):
    readers = [*_fn(policies, "Planner"), *_fn(policies, "TrainStep")]
    for fn in readers:
        ok = [*_get("team-data", "any/ds/manifest.json"), *_list("team-data", "any/ds/")]
        ok += [*_get("shared.bucket", "team-a/ds/shard-0.bin"), *_list("shared.bucket", "team-a/ds/")]
        ok.append(_decrypt(KEY, "s3.eu-west-1.amazonaws.com"))
        assert all(policies.allowed(fn, r) for r in ok), fn
        # outside the folder, another bucket, writes, the key outside S3 or another key: refused
        refused = [*_get("shared.bucket", "team-b/x"), *_list("shared.bucket", "team-b/"), *_get("other", "x")]
        refused += requests("s3", "PutObject", {"Bucket": "team-data", "Key": "x"}, "us-east-1")
        refused += requests("s3", "DeleteObject", {"Bucket": "team-data", "Key": "x"}, "us-east-1")
        refused += [
            _decrypt(KEY, "secretsmanager.eu-west-1.amazonaws.com"),
            _decrypt(KEY.replace("1234abcd", "9"), "s3.eu-west-1.amazonaws.com"),
        ]
        assert not any(policies.allowed(fn, r) for r in refused), fn


def test_other_functions_get_nothing_of_the_users_buckets_and_prepare_only_the_keys(policies):
    for part in ("Aggregate", "Prepare", "StudyController"):
        for fn in _fn(policies, part):
            assert not any(policies.allowed(fn, r) for r in _get("team-data", "ds/manifest.json")), fn
    (prepare,) = _fn(policies, "Prepare")  # a raw upload under incoming/ encrypted with the user's key
    assert policies.allowed(prepare, _decrypt(KEY, "s3.eu-west-1.amazonaws.com"))
    (aggregate,) = _fn(policies, "Aggregate")
    assert not policies.allowed(aggregate, _decrypt(KEY, "s3.eu-west-1.amazonaws.com"))


class _Scope:
    def __init__(self, context):
        self.context = context
        self.node = self

    def try_get_context(self, key):
        return self.context.get(key)


@pytest.mark.parametrize(
    ("context", "says"),
    [
        ({"data_buckets": ["s3://Team_Data"]}, "context 'data_buckets': each entry a bucket name or BUCKET/PREFIX/"),
        ({"data_buckets": "team-data"}, "context 'data_buckets': expected JSON"),
        ({"data_kms_keys": ["alias/team"]}, "context 'data_kms_keys': each entry a KMS key's ARN"),
    ],
)
def test_a_malformed_entry_is_refused_naming_the_context_key(context, says):
    with pytest.raises(ValueError, match=says):
        Settings.from_context(_Scope(context))  # type: ignore[arg-type]


def test_an_s3_uri_is_taken_as_its_bucket_and_folder():
    s = Settings.from_context(_Scope({"data_buckets": '["s3://team-data/a/"]'}))  # type: ignore[arg-type]
    assert s.data_buckets == ("team-data/a/",)


def test_the_planner_knows_when_the_workers_are_in_the_vpc(synth, redis_synth):
    """redis_reducer puts the workers in a VPC that reaches only this region's buckets: the
    planner refuses another region's dataset bucket then (smlt/runtime/steps/plan.py, `_check_region`)."""

    def planner_env(s):
        (planner,) = [
            r for lid, r in s.resources("AWS::Lambda::Function").items() if lid.startswith("FunctionsPlanner")
        ]
        return planner["Properties"]["Environment"]["Variables"]

    assert planner_env(redis_synth)["SMLT_WORKERS_IN_VPC"] == "true"
    assert "SMLT_WORKERS_IN_VPC" not in planner_env(synth)
