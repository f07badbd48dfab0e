"""`smlt.load_model("PIPELINE@latest" | "PIPELINE@VERSION")`, `smlt predict` and `smlt export` on a
retraining pipeline's versions, trained on the local engine through the stack's own trigger: from
the stack (its artifacts bucket) and from the local console's saved state."""

import json

import numpy as np
import pytest
import torch

import smlt
from smlt.local.eventbridge import UploadTrigger, upload_version
from smlt.runtime import pipeline as pl
from smlt.runtime.store import S3Store
from tests.e2e.test_pipeline import _houses, _run


@pytest.fixture(scope="module")
def shop(local, tmp_path_factory):
    """Two versions of pipeline `shop` trained and gated on the session's engine; its stack's
    outputs published (as `smlt local up` does) and its buckets saved as the console saves them."""
    from smlt.console import SavedState, publish_outputs
    from smlt.runtime import clients

    engine, names = local
    tmp = tmp_path_factory.mktemp("shop")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {
            "AWS_ENDPOINT_URL": engine.endpoint_url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            mp.setenv(k, v)
        clients.reset()
        root = tmp / "watched"
        job = {
            "name": "shop",
            "dataset": {"uri": "replaced-by-the-trigger"},
            "model": {"name": "logreg"},
            "training": {"max_rounds": 2, "local_steps": 15, "learning_rate": 0.3},
            "workers": {"initial": 2, "memory_mb": 1769},
        }
        (root / "incoming/shop").mkdir(parents=True)
        (root / "incoming/shop/job.json").write_text(json.dumps(job))
        trigger = UploadTrigger(engine, names.data_bucket)
        trigger.prime()
        runs = {}
        for n in (1, 2):
            pl.prepare_version(_houses(tmp / f"v{n}.csv", n), str(root / f"incoming/shop/v{n}"), shards=2)
            runs[f"v{n}"] = _run(engine, upload_version(trigger, root / f"incoming/shop/v{n}", root))
        publish_outputs(engine, "SmltModels")
        state = tmp / "console-state"
        s3, ddb = engine.client("s3"), engine.client("dynamodb")
        SavedState(state).save(s3, ddb, [names.artifacts_bucket, names.data_bucket], names.table)
        yield {"runs": runs, "state": state, "tmp": tmp, "root": root, "artifacts": S3Store(names.artifacts_bucket)}
    clients.reset()


def test_latest_and_a_version_from_the_stack(shop, engine_as_aws):
    champ = pl.champion(shop["artifacts"], "shop")
    latest = smlt.load_model("shop@latest", stack="SmltModels")
    assert latest.card.run_id == champ.run_id and latest.source == champ.model
    v1 = smlt.load_model("shop@v1", stack="SmltModels")
    assert v1.card.run_id == shop["runs"]["v1"]
    # the model the v1 record names gives the run's own accuracy on v1's validation rows
    record = pl.VersionRecord.model_validate_json(shop["artifacts"].get("pipelines/shop/versions/v1.json"))
    preds = v1.predict(shop["root"] / "incoming/shop/v1")
    assert preds.accuracy == pytest.approx(record.challenger_value, abs=1e-6)


def test_unknown_versions_and_pipelines_list_what_exists(shop, engine_as_aws):
    with pytest.raises(pl.NoSuchVersion, match=r"pipeline shop has no version 'v9'; its versions: v1, v2$"):
        smlt.load_model("shop@v9", stack="SmltModels")
    with pytest.raises(pl.NoSuchVersion, match=r"no pipeline 'nope' has a version recorded; the pipelines: .*\bshop\b"):
        smlt.load_model("nope@latest", stack="SmltModels")


def test_the_local_consoles_saved_state_gives_the_same_models(shop, engine_as_aws):
    state = shop["state"]
    for ref in ("shop@latest", "shop@v1", "shop@v2"):
        there = smlt.load_model(ref, stack="SmltModels")
        here = smlt.load_model(ref, out=state)
        assert here.source.startswith(str(state / "s3"))
        assert here.card.run_id == there.card.run_id
        for (k, a), (_, b) in zip(here.module.state_dict().items(), there.module.state_dict().items()):
            assert torch.equal(a, b), k
    with pytest.raises(pl.NoSuchVersion, match="its versions: v1, v2"):
        smlt.load_model("shop@v3", out=state)


def test_predict_and_export_take_the_reference(shop, engine_as_aws, capsys):
    from smlt.cli import main

    csv = str(shop["tmp"] / "v2.csv")
    out = shop["tmp"] / "predictions.csv"
    assert main(["predict", "shop@latest", csv, "--out", str(out), "--stack", "SmltModels"]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("id,prediction,probability") and len(lines) == 601
    assert "accuracy" in capsys.readouterr().out

    pt2 = shop["tmp"] / "v1.pt2"
    args = ["export", "shop@v1", "--runs", str(shop["state"]), "--format", "torch-export", "--out", str(pt2)]
    assert main(args) == 0
    program = torch.export.load(str(pt2)).module()
    v1 = smlt.load_model("shop@v1", out=shop["state"])
    x = v1.transform(csv)
    # the served program: the encoded rows in, each class's probability out
    assert np.allclose(program(x).detach().numpy(), torch.softmax(v1(x), 1).numpy(), atol=1e-6)

    assert main(["predict", "shop@v7", csv, "--out", str(out), "--stack", "SmltModels"]) == 2
    assert "pipeline shop has no version 'v7'; its versions: v1, v2" in capsys.readouterr().err


def test_export_of_latest_after_a_rollback_is_the_champion_rolled_back_to(shop, engine_as_aws, tmp_path, monkeypatch):
    """`smlt export shop@latest` after a promotion by hand and `smlt models rollback` exports the
    champion the rollback made (pipelines/shop/latest.json), not the version rolled back from: its
    default file is named by that run, and the spec inside names it. The champion is as before after."""
    from smlt.cli import main

    artifacts = shop["artifacts"]
    before = pl.champion(artifacts, "shop")
    other = "v1" if before.version == "v2" else "v2"
    stack = ["--stack", "SmltModels"]
    assert main(["models", "promote", "shop", other, *stack]) == 0
    assert pl.champion(artifacts, "shop").run_id == shop["runs"][other] != before.run_id
    assert main(["models", "rollback", "shop", *stack]) == 0
    assert pl.champion(artifacts, "shop").run_id == before.run_id
    monkeypatch.chdir(tmp_path)
    assert main(["export", "shop@latest", *stack, "--format", "torch-export"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == [f"{before.run_id}.pt2"]
    extra = {"smlt.serving": ""}
    torch.export.load(str(tmp_path / f"{before.run_id}.pt2"), extra_files=extra)
    assert json.loads(extra["smlt.serving"])["run_id"] == before.run_id
