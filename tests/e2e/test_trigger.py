"""Retraining on upload, through the stack's own EventBridge rule, on the local engine."""

import json

from smlt.local.eventbridge import UploadTrigger, deliver, object_created_event, upload_version
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.pipeline import prepare_version


def _finish(engine, arn):
    desc = engine.wait(arn, interval=0.1)
    assert desc["status"] == "SUCCEEDED", desc
    return json.loads(desc["output"])["plan"]


def test_manifest_upload_starts_one_run_that_warm_starts_the_next(local, tmp_path):
    engine, names = local
    s3 = engine.client("s3")
    root = tmp_path / "watched"
    job = {
        "name": "retrain",
        "dataset": {"uri": "replaced-by-the-trigger"},
        "training": {"max_rounds": 2, "local_steps": 5},
        "workers": {"initial": 2, "memory_mb": 1769},
    }
    (root / "incoming/digits").mkdir(parents=True)
    (root / "incoming/digits/job.json").write_text(json.dumps(job))

    # A manifest outside incoming/<pipeline>/<version>/ matches no rule.
    s3.put_object(Bucket=names.data_bucket, Key="elsewhere/manifest.json", Body=b"{}")
    assert deliver(engine, object_created_event(names.data_bucket, "elsewhere/manifest.json", 2, "x")) == []

    trigger = UploadTrigger(engine, names.data_bucket)
    trigger.prime()
    prepare_version("sklearn:digits", str(root / "incoming/digits/v1"), shards=4)  # fixes the pipeline's features
    (arn,) = upload_version(trigger, root / "incoming/digits/v1", root)
    run1 = _finish(engine, arn)["run_id"]
    final = json.loads(
        s3.get_object(Bucket=names.artifacts_bucket, Key=f"runs/{run1}/final/metrics.json")["Body"].read()
    )
    assert final["final"]["rounds"] == 2 and final["job"]["pipeline"] == "digits"

    # The same event delivered again (EventBridge is at-least-once): nothing new runs.
    (dup_arn,) = deliver(engine, trigger.sent["incoming/digits/v1/manifest.json"])
    dup = _finish(engine, dup_arn)
    assert dup["action"] == "duplicate" and dup["run_id"] == run1
    rounds = s3.list_objects_v2(Bucket=names.artifacts_bucket, Prefix=f"runs/{run1}/rounds/")["KeyCount"]

    # New data, prepared with the pipeline's features: a new run, warm-started from the pipeline's
    # latest model (run 1's final model).
    prepare_version("sklearn:digits", str(root / "incoming/digits/v2"), shards=4, seed=1)
    (arn2,) = upload_version(trigger, root / "incoming/digits/v2", root)
    run2 = _finish(engine, arn2)["run_id"]
    assert run2 != run1
    get = lambda key: s3.get_object(Bucket=names.artifacts_bucket, Key=key)["Body"].read()  # noqa: E731
    assert get(f"runs/{run2}/rounds/000000/model.safetensors") == get(f"runs/{run1}/final/model.safetensors")
    assert json.loads(get(f"runs/{run2}/job.json"))["warm_start"].endswith(f"runs/{run1}/final/model.safetensors")
    # The duplicate touched nothing of run 1.
    assert s3.list_objects_v2(Bucket=names.artifacts_bucket, Prefix=f"runs/{run1}/rounds/")["KeyCount"] == rounds


def test_watch_folder_starts_a_run_per_new_manifest_and_fetches_it(local, tmp_path, caplog):
    from smlt.watch import watch_folder

    engine, names = local
    root, out = tmp_path / "watched", tmp_path / "out"
    job = {"name": "watched", "dataset": {"uri": "replaced"}, "training": {"max_rounds": 1, "local_steps": 2}}
    (root / "incoming/wp").mkdir(parents=True)
    (root / "incoming/wp/job.json").write_text(json.dumps(job))
    prepare_dataset("sklearn:digits", str(root / "incoming/wp/v1"), shards=2)
    caplog.set_level("INFO", logger="smlt.notice")
    (arn,) = watch_folder(engine, names, root, out, once=True, interval=0.1)  # one run, then a pass finds nothing new
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    assert json.loads((run_dir / "metrics.json").read_text())["final"]["rounds"] == 1
    assert (run_dir / "model.safetensors").stat().st_size > 0
    lines = [r.getMessage() for r in caplog.records if r.name == "smlt.notice"]
    assert f"s3://{names.data_bucket}/incoming/wp/v1/manifest.json: started execution {arn.rsplit(':', 1)[-1]}" in lines
    assert any(line.startswith(f"  run {run_dir.name}: val accuracy ") for line in lines)
