"""build_app: context handling, overrides, validation errors and synth time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.infra.conftest import DEFAULT_TIERS, LARGE_TIERS, NEW_ACCOUNT_MAX_MB, synthesize

REPO = Path(__file__).resolve().parents[2]


def test_cdk_json_runs_the_app_and_holds_the_defaults():
    from smlt.runtime import deployed

    cfg = json.loads((REPO / "cdk.json").read_text())
    assert "infra.app" in cfg["app"]
    ctx = cfg["context"]
    assert deployed.context() == ctx  # the one source the stack and the runtime read
    assert ctx["memory_tiers"] == list(DEFAULT_TIERS)
    assert ctx["max_concurrency"] == 64
    assert ctx["architecture"] == "x86_64"
    assert ctx["redis_reducer"] is False
    assert set(ctx["prices"]) >= {"lambda_gb_second", "lambda_request", "sfn_transition", "s3_put", "s3_get"}


def test_stack_id_and_name(synth):
    assert synth.stack.node.id == "Smlt"
    assert synth.stack.stack_name == "Smlt"
    assert [s.stack_name for s in synth.assembly.stacks] == ["Smlt"]


def test_the_stack_declares_the_outputs_the_cli_reads(synth, redis_synth):
    from smlt import stack_outputs

    named = {v for k, v in vars(stack_outputs).items() if k.isupper() and isinstance(v, str)}
    plain, redis = set(synth.template["Outputs"]), set(redis_synth.template["Outputs"])
    assert set(stack_outputs.REQUIRED) | {stack_outputs.STUDY_STATE_MACHINE} <= plain
    assert plain | redis == named  # one name list: a new output is added there, or nowhere
    assert redis - plain == {stack_outputs.REDIS_ENDPOINT}


def test_warm_synth_is_fast(synth):
    # The first synth of the session pays for importing aws_cdk and starting jsii; the local
    # engine's target is ~3-4 s warm. Generous bound to stay robust on slow CI machines.
    assert synth.seconds < 30


def test_no_bundling_no_docker_only_staging(synth):
    """With bundling off the layer points at layers/ (not built) and the image is only staged."""
    manifest = json.loads((synth.outdir / "Smlt.assets.json").read_text())
    assert len(manifest["dockerImages"]) == 1
    layer = next(iter(synth.resources("AWS::Lambda::LayerVersion").values()))
    assert Path(layer["Metadata"]["aws:asset:path"]).resolve() == (REPO / "layers").resolve()


def _train_tiers(s) -> dict[int, int]:
    """{tier in the logical id: the function's MemorySize} of the synthesized train_step functions."""
    fns = s.resources("AWS::Lambda::Function")
    return {
        int(k[len("FunctionsTrainStep") : -8]): v["Properties"]["MemorySize"]
        for k, v in fns.items()
        if k.startswith("FunctionsTrainStep")
    }


def test_default_stack_fits_a_new_accounts_memory_quota(synth):
    """New and low-quota accounts accept at most 3,008 MB per function: the default deploys there."""
    assert _train_tiers(synth) == {mb: mb for mb in DEFAULT_TIERS}
    sizes = [fn["Properties"]["MemorySize"] for fn in synth.resources("AWS::Lambda::Function").values()]
    assert max(sizes) <= NEW_ACCOUNT_MAX_MB, sizes


def test_larger_tiers_are_a_context_option(tmp_path):
    """docs/deploy.md's option for a raised quota: `-c memory_tiers='[1769,3008,5120,10240]'`."""
    s = synthesize(tmp_path, {"memory_tiers": json.dumps(list(LARGE_TIERS))})
    assert _train_tiers(s) == {mb: mb for mb in LARGE_TIERS}
    docs = (REPO / "docs" / "deploy.md").read_text()
    assert f"-c memory_tiers='{json.dumps(list(LARGE_TIERS), separators=(',', ':'))}'" in docs


def test_context_overrides_from_cli_strings(tmp_path):
    """`-c key=value` arrives as strings; tiers, architecture and concurrency follow context."""
    s = synthesize(
        tmp_path,
        {"memory_tiers": "[2048, 1769]", "architecture": "arm64", "max_concurrency": "16"},
    )
    fns = s.resources("AWS::Lambda::Function")
    tiers = sorted(int(k[len("FunctionsTrainStep") : -8]) for k in fns if k.startswith("FunctionsTrainStep"))
    assert tiers == [1769, 2048]
    for lid, fn in fns.items():
        assert fn["Properties"]["Architectures"] == ["arm64"]
        if not lid.startswith(("StudyController", "FunctionsPrepare")):  # they read only table and bucket names
            assert fn["Properties"]["Environment"]["Variables"]["SMLT_ARCHITECTURE"] == "arm64"
    planner = next(v for k, v in fns.items() if k.startswith("FunctionsPlanner"))
    assert planner["Properties"]["Environment"]["Variables"]["SMLT_MAX_CONCURRENCY"] == "16"
    (image,) = json.loads((tmp_path / "Smlt.assets.json").read_text())["dockerImages"].values()
    assert image["source"]["platform"] == "linux/arm64"
    assert s.seconds < 15  # warm (same process): the local engine's budget is ~3-4 s


@pytest.mark.parametrize(
    "context, message",
    [
        ({"memory_tiers": [64]}, "memory_tiers"),
        ({"memory_tiers": [1769, 1769]}, "duplicate"),
        ({"architecture": "sparc"}, "architecture"),
        ({"redis_reducer": "maybe"}, "redis_reducer"),
        ({"redis_node_type": "r7g.large"}, "redis_node_type"),
        ({"redis_reducer": True, "exchange_url": "redis://10.0.0.1:6379/0"}, "exchange_url"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"lambda_python": "3.11"}, "lambda_python"),
        ({"log_retention_days": 31}, "log_retention_days"),
        ({"fanout": {"inline_max_workers": 41}}, r"fanout\.inline_max_workers"),
        ({"fanout": {"distributed_overhead": 5}}, r"fanout\.distributed_overhead"),
    ],
)
def test_bad_context_fails_with_a_named_setting(tmp_path, context, message):
    from infra.app import build_app

    with pytest.raises(Exception, match=message):
        build_app(outdir=str(tmp_path), context={"aws:cdk:bundling-stacks": [], **context})


def test_smlt_bundle_false_turns_bundling_off(tmp_path, monkeypatch):
    """`cdk synth -c smlt:bundle=false` (the CLI forbids user keys starting with aws:)."""
    from infra.app import BUNDLING_STACKS, build_app

    monkeypatch.setenv("CDK_CONTEXT_JSON", json.dumps({"smlt:bundle": "false"}))
    app = build_app(outdir=str(tmp_path))
    assert app.node.try_get_context(BUNDLING_STACKS) == []
