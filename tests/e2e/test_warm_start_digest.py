"""A warm start from a published model is checked against the digest recorded when it was
published: a model replaced since then is refused before round 0 starts from it."""

from smlt.runtime import keys
from tests.e2e.test_iam_calls import short_job


def test_a_replaced_warm_start_model_is_refused(local, tmp_path):
    engine, names = local
    desc = engine.wait(engine.start_execution(short_job(names, engine), name="ws-src"), interval=0.2, timeout=300)
    assert desc["status"] == "SUCCEEDED", desc
    s3 = engine.client("s3")
    uri = f"s3://{names.artifacts_bucket}/{keys.final_model_key('ws-src')}"

    # the published model, as recorded: the warm start is taken
    ok = {**short_job(names, engine), "warm_start": uri}
    ok["training"]["max_rounds"] = 1
    desc = engine.wait(engine.start_execution(ok, name="ws-ok"), interval=0.2, timeout=300)
    assert desc["status"] == "SUCCEEDED", desc

    # replaced since: refused, naming the object and both digests, before anything of the run is written
    s3.put_object(Bucket=names.artifacts_bucket, Key=keys.final_model_key("ws-src"), Body=b"not the published model")
    bad = {**ok}
    desc = engine.wait(engine.start_execution(bad, name="ws-bad"), interval=0.2, timeout=300)
    assert desc["status"] == "FAILED" and desc["error"] == "DigestMismatch", desc
    assert keys.final_model_key("ws-src") in desc["cause"] and "recorded" in desc["cause"]
    assert s3.list_objects_v2(Bucket=names.artifacts_bucket, Prefix=keys.rounds_prefix("ws-bad")).get("KeyCount") == 0
