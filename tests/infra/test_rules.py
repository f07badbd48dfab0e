"""The rules the stack and the runtime must agree on, from the synthesized template: the
environment contract (smlt.runtime.config.Settings), the deployed sizes, the price table, the update tag."""

from __future__ import annotations

import json
import os

import pytest

from smlt.runtime import deployed, keys
from smlt.runtime.config import AGGREGATE, PLANNER, PREPARE, STUDY, TRAIN, Settings
from smlt.runtime.prices import Prices
from smlt.runtime.steps.prepare import PrepareSettings
from smlt.runtime.study.events import StudySettings

KINDS = {
    "FunctionsPlanner": PLANNER,
    "FunctionsAggregate": AGGREGATE,
    "FunctionsTrainStep": TRAIN,
    "StudyController": STUDY,
    "FunctionsPrepare": PREPARE,
}


def _functions(synth) -> dict[str, tuple[str, dict]]:
    out = {}
    for lid, fn in synth.resources("AWS::Lambda::Function").items():
        kind = next(k for prefix, k in KINDS.items() if lid.startswith(prefix))
        out[lid] = (kind, fn["Properties"])
    assert sorted({k for k, _ in out.values()}) == sorted(KINDS.values())
    return out


def _resolved(name: str) -> str:
    """A stand-in for a CloudFormation reference (a function or bucket name)."""
    return json.dumps({"1769": "fn"}) if name == "SMLT_TRAIN_FUNCTIONS" else "resource-name"


def _env(props: dict) -> dict:
    return props["Environment"]["Variables"]


@pytest.mark.parametrize("which", ["synth", "redis_synth"])
def test_every_variable_a_function_reads_is_written_and_none_other(which, request):
    synth = request.getfixturevalue(which)
    every = {Settings.variable(f) for f in Settings.model_fields}
    for lid, (kind, props) in _functions(synth).items():
        written = set(_env(props))
        always, optional = Settings.contract(kind)
        assert always <= written, (lid, sorted(always - written))
        assert written <= every, (lid, sorted(written - every))  # nothing the model does not know
        assert written <= always | optional, (lid, sorted(written - always - optional))


def test_a_function_reads_back_what_the_stack_set(synth, monkeypatch):
    """Settings.from_env on each function's environment alone (references replaced by names; no
    cdk.json, as in a deployed function) gives the deployed memory sizes and timeout the stack gave
    the functions themselves."""
    ctx = deployed.context()
    monkeypatch.setattr(deployed, "CDK_JSON", deployed.CDK_JSON.with_name("absent.json"))
    deployed._context_text.cache_clear()
    monkeypatch.setattr(deployed, "context", lambda: pytest.fail("a function read cdk.json"))
    fns = _functions(synth)
    memory = {kind: props["MemorySize"] for kind, props in fns.values() if kind != TRAIN}
    timeouts = {props["Timeout"] for kind, props in fns.values() if kind == TRAIN}
    for lid, (kind, props) in fns.items():
        for name in list(os.environ):
            if name.startswith("SMLT_"):
                monkeypatch.delenv(name)
        for name, value in _env(props).items():
            monkeypatch.setenv(name, value if isinstance(value, str) else _resolved(name))
        if kind == STUDY:  # reads its own two fields only (smlt.runtime.study.events.StudySettings)
            assert StudySettings().table, lid
            continue
        if kind == PREPARE:  # the data bucket and the table (smlt.runtime.steps.prepare.PrepareSettings)
            assert PrepareSettings().table and PrepareSettings().data_bucket, lid
            continue
        s = Settings.from_env()
        assert s.prices == Prices.model_validate(ctx["prices"]), lid
        if kind == TRAIN:
            assert s.memory_mb == props["MemorySize"], lid
            continue
        assert s.planner_memory_mb == memory[PLANNER] == ctx["planner_memory_mb"], lid
        assert s.aggregate_memory_mb == memory[AGGREGATE] == ctx["aggregate_memory_mb"], lid
        if kind == PLANNER:
            assert {s.worker_timeout_s} == timeouts == {ctx["worker_timeout_s"]}, lid


def test_price_table_and_tiers_come_from_cdk_json_only(synth):
    ctx = json.loads((deployed.CDK_JSON).read_text())["context"]
    assert Prices().model_dump() == Prices.model_validate(ctx["prices"]).model_dump()
    for kind, props in _functions(synth).values():
        # the study controller and Prepare price nothing (the trials' ledgers are the runs'; a
        # Prepare attempt is priced with its run's, at Finalize)
        if kind not in (STUDY, PREPARE):
            assert json.loads(_env(props)["SMLT_PRICES"]) == ctx["prices"]
    tiers = sorted(props["MemorySize"] for kind, props in _functions(synth).values() if kind == TRAIN)
    assert tiers == sorted(ctx["memory_tiers"])


def test_a_stack_without_context_reads_the_same_file():
    import aws_cdk as cdk

    from infra.stacks.settings import Settings as StackSettings

    stack = cdk.Stack(cdk.App(), "Bare")
    s = StackSettings.from_context(stack)
    ctx = deployed.context()
    assert list(s.memory_tiers) == sorted(ctx["memory_tiers"])
    assert s.prices == ctx["prices"]
    assert (s.planner_memory_mb, s.aggregate_memory_mb, s.worker_timeout_s) == (
        ctx["planner_memory_mb"],
        ctx["aggregate_memory_mb"],
        ctx["worker_timeout_s"],
    )


def test_the_lifecycle_rule_expires_the_tag_the_workers_put(synth):
    """One update tag: smlt.runtime.keys.UPDATE_TAG (the worker's PUT, smlt/runtime/steps/train.py) is what the
    artifacts bucket's lifecycle rule filters on."""
    key, _, value = keys.UPDATE_TAG.partition("=")
    buckets = synth.resources("AWS::S3::Bucket")
    (artifacts,) = [b for lid, b in buckets.items() if lid.startswith("StorageArtifacts")]
    rules = {r["Id"]: r for r in artifacts["Properties"]["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-worker-updates"]["TagFilters"] == [{"Key": key, "Value": value}]
    source = (deployed.CDK_JSON.parent / "smlt" / "runtime" / "steps" / "train.py").read_text()
    assert "tagging=keys.UPDATE_TAG" in source
