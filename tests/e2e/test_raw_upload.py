"""Raw data in, prepared in the cloud: raw data uploaded under incoming/<pipeline>/<version>/ and
then its completion marker `_SUCCESS` start the pipeline's run, whose PrepareData step prepares
the data with the pipeline's features before it trains and passes the gate.

Through `smlt local up` and the AWS CLI, as a team uses it (issue #31's "Done when"): no smlt
command before the rollback. On the session's engine: duplicates, failures that leave the
pipeline able to train again, and an archive of an image folder. Every call the Prepare
function makes is checked against its role (tests/e2e/conftest.py; the console's handlers record
into the session's log too)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from smlt import console
from smlt.local.eventbridge import UploadTrigger, deliver
from smlt.runtime import keys
from smlt.runtime import pipeline as pl
from smlt.runtime.store import S3Store
from tests.e2e.test_console import free_port
from tests.e2e.test_notify import subscribed
from tests.e2e.test_pipeline import ROWS, _houses

AWS = shutil.which("aws", path=str(Path(sys.executable).parent)) or shutil.which("aws")
JOB = {
    "name": "houses",
    "dataset": {"uri": "replaced-by-the-trigger"},
    "model": {"name": "logreg"},
    "training": {"max_rounds": 3, "local_steps": 15, "learning_rate": 0.3},
    "workers": {"initial": 2, "memory_mb": 1769},
}
SHORT = {**JOB, "training": {"max_rounds": 1, "local_steps": 5, "learning_rate": 0.3}}


def _executions(sfn, arn: str) -> list[str]:
    return [e["executionArn"] for e in sfn.list_executions(stateMachineArn=arn)["executions"]]


def _new_execution(sfn, arn: str, before: set[str], timeout: float = 30) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        new = set(_executions(sfn, arn)) - before
        if new:
            (one,) = new
            return one
        time.sleep(0.25)
    raise TimeoutError("the upload started no execution")


def _finished(sfn, arn: str, timeout: float = 300) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        desc = sfn.describe_execution(executionArn=arn)
        if desc["status"] != "RUNNING":
            return desc
        time.sleep(0.25)
    raise TimeoutError(arn)


@pytest.mark.skipif(AWS is None, reason="the AWS CLI (awscli, a dev dependency) is not installed")
def test_raw_versions_prepare_train_pass_the_gate_and_roll_back_on_the_console(local, iam_log, tmp_path):
    import boto3

    from smlt.local import iam_record

    _, start = iam_record.read(iam_log, iam_log.stat().st_size if iam_log.exists() else 0)
    state = tmp_path / "console"
    info = console.up(state, port=free_port())
    env = {**os.environ, **info.environment()}
    kw = dict(
        endpoint_url=info.endpoint_url,
        region_name=info.region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    sfn, s3 = boto3.client("stepfunctions", **kw), boto3.client("s3", **kw)
    artifacts = S3Store(info.artifacts_bucket, client=s3)
    data = f"s3://{info.data_bucket}/incoming/houses"

    def aws(*args: str) -> None:
        subprocess.run([AWS, *args, "--quiet"], env=env, check=True, capture_output=True, timeout=60)

    def smlt(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "smlt.cli", *args], env=env, capture_output=True, text=True, timeout=120
        )

    marker = tmp_path / "_SUCCESS"
    marker.write_bytes(b"")

    def version(name: str, path: str) -> tuple[dict, pl.VersionRecord]:
        """Upload a version's CSV, then its marker; the run it starts, finished, and its record."""
        before = set(_executions(sfn, info.state_machine_arn))
        aws("s3", "cp", path, f"{data}/{name}/houses.csv")
        aws("s3", "cp", str(marker), f"{data}/{name}/_SUCCESS")
        desc = _finished(sfn, _new_execution(sfn, info.state_machine_arn, before))
        assert desc["status"] == "SUCCEEDED", desc
        record = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("houses", name)))
        return json.loads(desc["output"]), record

    try:
        job = tmp_path / "job.json"
        job.write_text(json.dumps(JOB))
        aws("s3", "cp", str(job), f"{data}/job.json")

        # v1 by `aws s3 sync` of its folder, in whatever order sync takes: nothing starts until
        # the marker is there.
        folder = tmp_path / "v1"
        folder.mkdir()
        _houses(folder / "houses.csv", 1)
        before = set(_executions(sfn, info.state_machine_arn))
        aws("s3", "sync", str(folder), f"{data}/v1/")
        time.sleep(3)  # the console fires the trigger for new objects every second
        assert set(_executions(sfn, info.state_machine_arn)) == before, "data without its marker started a run"
        aws("s3", "cp", str(marker), f"{data}/v1/_SUCCESS")
        desc = _finished(sfn, _new_execution(sfn, info.state_machine_arn, before))
        assert desc["status"] == "SUCCEEDED", desc
        out1 = json.loads(desc["output"])
        v1 = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("houses", "v1")))
        # prepared into prepared/houses/v1/<tag>/, beside the raw upload (untouched), and the
        # first version fixed the pipeline's features
        run1 = out1["plan"]["run_id"]
        assert out1["prepared"]["action"] == "plan" and out1["prepared"]["run_id"] == run1
        assert v1.data == out1["prepared"]["dataset"] and v1.data.startswith(
            f"s3://{info.data_bucket}/prepared/houses/v1/"
        )
        assert "fixed pipeline houses's features, generation 1" in out1["prepared"]["reason"]
        assert out1["prepared"]["rows"] == ROWS
        spec = json.loads(s3.get_object(Bucket=info.data_bucket, Key="incoming/houses/features.json")["Body"].read())
        assert spec["generation"] == 1
        raw = s3.get_object(Bucket=info.data_bucket, Key="incoming/houses/v1/houses.csv")["Body"].read()
        assert raw == (folder / "houses.csv").read_bytes()
        assert v1.status == "promoted" and v1.start.startswith("cold")
        assert pl.champion(artifacts, "houses").version == "v1"
        job1 = json.loads(artifacts.get(keys.job_key(run1)))
        assert job1["dataset"]["uri"] == v1.data and job1["pipeline"] == "houses"

        # v2: a colour v1 never saw and two new columns: prepared with v1's features (the new
        # columns ignored, said in the execution's output), a warm start, both metrics recorded.
        out2, v2 = version("v2", _houses(tmp_path / "v2.csv", 2, colors=("red", "green", "blue"), extra=True))
        assert "with pipeline houses's features (generation 1" in out2["prepared"]["reason"]
        assert any("'garden', 'floor'" in n and "ignored" in n for n in out2["prepared"]["notes"]), out2
        assert v2.start.startswith("warm: from the champion v1") and v2.champion_run == run1
        assert v2.metric == "val_accuracy" and v2.challenger_value is not None and v2.champion_value is not None
        assert v2.status in ("promoted", "rejected") and v2.reason and v2.cost_usd and v2.cost_usd > 0
        champ = "v2" if v2.promoted else "v1"
        assert pl.champion(artifacts, "houses").version == champ

        # v3: the train split's labels shuffled (prepare's split, seed 0): worse, rejected.
        order = np.random.default_rng(0).permutation(ROWS)
        _, v3 = version("v3", _houses(tmp_path / "v3.csv", 3, shuffle_train=order[int(round(ROWS * 0.2)) :]))
        assert v3.status == "rejected" and not v3.promoted and "worse by" in v3.reason, v3
        assert v3.challenger_value is not None and v3.champion_value is not None
        assert v3.challenger_value < v3.champion_value
        assert pl.champion(artifacts, "houses").version == champ  # latest unchanged

        # the versions, a rollback: the first smlt commands, against the console's stack
        listing = smlt("models", "list", "houses")
        assert listing.returncode == 0, listing.stderr
        assert "rejected" in listing.stdout and f"champion (*): {champ}" in listing.stdout
        if champ == "v1":  # the gate kept v1: make v2 the champion by hand, so a rollback has somewhere to go
            assert smlt("models", "promote", "houses", "v2").returncode == 0
        rolled = smlt("models", "rollback", "houses")
        assert rolled.returncode == 0, rolled.stderr
        assert "champion is v1" in rolled.stdout
        assert pl.champion(artifacts, "houses").run_id == run1
    finally:
        console.down(state)
    # the console's handlers recorded their calls too: iam_checked checks them against the roles
    calls, _ = iam_record.read(iam_log, start)
    assert any("Prepare" in c["function"] for c in calls)


@pytest.fixture
def pipeline(engine_as_aws):
    """A pipeline on the session's engine: its job uploaded, the stack's trigger primed."""
    engine, names = engine_as_aws
    s3 = engine.client("s3")
    trigger = UploadTrigger(engine, names.data_bucket)
    trigger.prime()

    def setup(name: str, job: dict) -> None:
        s3.put_object(Bucket=names.data_bucket, Key=keys.pipeline_job_key(name), Body=json.dumps(job).encode())

    def upload(key: str, body: bytes) -> list[str]:
        if key in trigger.seen:  # the trigger tells uploads of a key apart by their second (LastModified)
            time.sleep(1.1)
        s3.put_object(Bucket=names.data_bucket, Key=key, Body=body)
        return trigger.poll()

    return engine, names, trigger, setup, upload


def _wait(engine, arns: list[str]) -> dict:
    (arn,) = arns
    return engine.wait(arn, interval=0.1)


def _models_list(engine, pipeline: str, capsys) -> str:
    """`smlt models list PIPELINE --stack SmltUploads`'s output (the stack's outputs published for
    the CLI once per session: a later publish of the same stack raises)."""
    from smlt.cli import main
    from smlt.console import publish_outputs

    try:
        publish_outputs(engine, "SmltUploads")
    except Exception:  # noqa: BLE001 - published by an earlier test of the session
        pass
    capsys.readouterr()
    assert main(["models", "list", pipeline, "--stack", "SmltUploads"]) == 0
    return capsys.readouterr().out


def test_a_duplicate_event_trains_once_and_a_new_marker_retrains(pipeline, tmp_path):
    engine, names, trigger, setup, upload = pipeline
    setup("dup", SHORT)
    assert upload("incoming/dup/v1/houses.csv", Path(_houses(tmp_path / "h.csv", 1)).read_bytes()) == []
    desc = _wait(engine, upload("incoming/dup/v1/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    run = json.loads(desc["output"])["plan"]["run_id"]
    artifacts = S3Store(names.artifacts_bucket)
    rounds = artifacts.list(keys.rounds_prefix(run))

    # the same event again (EventBridge delivers at least once): prepared and trained once
    dup = engine.wait(deliver(engine, trigger.sent["incoming/dup/v1/_SUCCESS"])[0], interval=0.1)
    assert dup["status"] == "SUCCEEDED", dup
    out = json.loads(dup["output"])
    assert out["prepared"]["action"] == "duplicate" and out["prepared"]["run_id"] == run and "plan" not in out
    assert artifacts.list(keys.rounds_prefix(run)) == rounds
    prepared = S3Store(names.data_bucket).list(keys.PREPARED + "dup/")
    assert len([k for k in prepared if k.endswith(keys.MANIFEST)]) == 1

    # the marker uploaded again: a new upload, a new run, prepared into a prefix of its own
    again = _wait(engine, upload("incoming/dup/v1/_SUCCESS", b""))
    assert again["status"] == "SUCCEEDED", again
    out = json.loads(again["output"])
    assert (
        out["plan"]["run_id"] != run and out["prepared"]["dataset"] != json.loads(desc["output"])["prepared"]["dataset"]
    )
    assert pl.champion(artifacts, "dup").run_id == out["plan"]["run_id"]


@pytest.fixture
def refusals(pipeline):
    """`received(want)`: the envelopes the team's topic (the session's stack has one) sent a queue
    that takes the refusals alone (filter policy decision=refused) during the test."""
    with subscribed(pipeline[0], "refusals", {"decision": ["refused"]}) as received:
        yield received


def test_a_version_of_the_same_rows_as_an_earlier_one_is_refused_naming_it(pipeline, refusals, tmp_path, capsys):
    """v2 uploaded with v1's very bytes (an export uploaded again under a new name): refused before
    training under the same job, naming v1 and what to do, no record, the champion unchanged; the
    same file under another name or compressed differently prepares to the same rows and is refused
    alike; under a changed job the same rows train; v1's own marker uploaded again retrains v1."""
    import gzip

    engine, names, _, setup, upload = pipeline
    setup("same", SHORT)
    artifacts = S3Store(names.artifacts_bucket)
    body = Path(_houses(tmp_path / "v1.csv", 1)).read_bytes()
    upload("incoming/same/v1/houses.csv", body)
    assert _wait(engine, upload("incoming/same/v1/_SUCCESS", b""))["status"] == "SUCCEEDED"
    v1 = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("same", "v1")))
    assert v1.status == "promoted" and v1.data_sha256, v1
    executions = []
    for version, name, blob in (("v2", "houses.csv", body), ("v3", "export.csv.gz", gzip.compress(body))):
        upload(f"incoming/same/{version}/{name}", blob)
        desc = _wait(engine, upload(f"incoming/same/{version}/_SUCCESS", b""))
        assert desc["status"] == "FAILED" and desc["error"] == "InvalidDataset", desc
        executions.append(desc["name"])
        assert f"holds the same rows as pipeline same's version v1 (run {v1.run_id}, promoted)" in desc["cause"], desc
        assert "upload version v1's _SUCCESS (or manifest.json) again" in desc["cause"], desc["cause"]
        assert "and its job is unchanged" in desc["cause"] and "or change the job first" in desc["cause"]
    assert [v.version for v in pl.versions(artifacts, "same")] == ["v1"]
    assert pl.champion(artifacts, "same").run_id == v1.run_id
    # each refusal (raised at the run's first Plan, after PrepareData) told the team's topic once
    envelopes = refusals(2)
    envelopes += refusals(0)
    assert [e["Subject"] for e in envelopes] == ["smlt: same v2 refused", "smlt: same v3 refused"], envelopes
    for envelope, version, execution in zip(envelopes, ("v2", "v3"), executions):
        body = json.loads(envelope["Message"])
        assert (
            body["error"] == "InvalidDataset" and "holds the same rows as pipeline same's version v1" in body["message"]
        )
        assert body["execution"] == execution, body
        assert body["upload"] == f"s3://{names.data_bucket}/incoming/same/{version}/_SUCCESS", body
    assert "holds the same rows as pipeline same's version v1" in _models_list(engine, "same", capsys)
    # the same rows under a changed job (another learning rate): a retraining with other settings
    setup("same", {**SHORT, "training": {**SHORT["training"], "learning_rate": 0.1}})
    assert _wait(engine, upload("incoming/same/v3/_SUCCESS", b""))["status"] == "SUCCEEDED"
    v3 = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("same", "v3")))
    assert v3.data_sha256 == v1.data_sha256 and v3.decided_at is not None, v3
    setup("same", SHORT)
    # new rows in v2: trained, warm from v1
    upload("incoming/same/v2/houses.csv", Path(_houses(tmp_path / "v2.csv", 2)).read_bytes())
    assert _wait(engine, upload("incoming/same/v2/_SUCCESS", b""))["status"] == "SUCCEEDED"
    v2 = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("same", "v2")))
    assert v2.start.startswith("warm: from the champion") and v2.data_sha256 != v1.data_sha256, v2
    # v1's marker again: the same rows trained again on purpose, as v1's new run
    desc = _wait(engine, upload("incoming/same/v1/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    again = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("same", "v1")))
    assert again.run_id != v1.run_id and again.data_sha256 == v1.data_sha256, again


def test_a_marker_without_data_fails_by_name_and_the_pipeline_trains_again(pipeline, refusals, tmp_path, capsys):
    engine, names, _, setup, upload = pipeline
    setup("nodata", SHORT)
    artifacts = S3Store(names.artifacts_bucket)
    refused = []

    desc = _wait(engine, upload("incoming/nodata/v1/_SUCCESS", b""))
    assert desc["status"] == "FAILED" and desc["error"] == "NoDataFile", desc
    assert f"s3://{names.data_bucket}/incoming/nodata/v1/ has a _SUCCESS marker but no data" in desc["cause"]
    assert pl.champion(artifacts, "nodata") is None and pl.versions(artifacts, "nodata") == []
    refused.append(desc)

    # two data sources, or a format smlt does not prepare: named, and nothing of the pipeline changes
    upload("incoming/nodata/v1/a.csv", b"x,label\n1,0\n2,1\n")
    upload("incoming/nodata/v1/notes.docx", b"not a table")
    desc = _wait(engine, upload("incoming/nodata/v1/_SUCCESS", b""))
    assert desc["status"] == "FAILED" and desc["error"] == "UnsupportedFormat", desc
    assert "notes.docx is not a format smlt prepares" in desc["cause"]
    refused.append(desc)
    S3Store(names.data_bucket).delete("incoming/nodata/v1/notes.docx")
    S3Store(names.data_bucket).delete("incoming/nodata/v1/a.csv")

    # `smlt models list` shows the refused uploads, which record nothing of the pipeline
    from smlt.cli import main

    out = _models_list(engine, "nodata", capsys)
    assert "uploads refused before training (fix them and upload the version's _SUCCESS again):" in out, out
    assert "v1" in out and "NoDataFile: s3://" in out and "UnsupportedFormat: " in out and "notes.docx" in out, out

    # a good upload then trains, and is the pipeline's first version
    upload("incoming/nodata/v1/houses.csv", Path(_houses(tmp_path / "h.csv", 4)).read_bytes())
    desc = _wait(engine, upload("incoming/nodata/v1/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    assert pl.champion(artifacts, "nodata").version == "v1"
    assert main(["models", "list", "nodata", "--stack", "SmltUploads"]) == 0
    out = capsys.readouterr().out
    assert "champion (*): v1" in out and "refused" not in out, out  # the later upload replaced them

    # each refusal told the team once, by the error the execution failed with; the promotion is
    # filtered out (decision=promoted), and it was published before its execution ended
    envelopes = refusals(2)
    envelopes += refusals(0)
    assert [e["Subject"] for e in envelopes] == ["smlt: nodata v1 refused"] * 2, envelopes
    for envelope, failed in zip(envelopes, refused):
        body = json.loads(envelope["Message"])
        assert body["error"] == failed["error"] and body["message"] == json.loads(failed["cause"])["errorMessage"]
        assert body["execution"] == failed["name"] and body["decision"] == "refused", body
        assert body["upload"] == f"s3://{names.data_bucket}/incoming/nodata/v1/_SUCCESS", body
        assert {k: a["Value"] for k, a in envelope["MessageAttributes"].items()}["decision"] == "refused"


def _image_zip(rng: np.random.Generator) -> bytes:
    """A zip of an image folder: two classes of 8x8 grey squares, dark and light."""
    from PIL import Image

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for label, base in (("dark", 40), ("light", 210)):
            for i in range(30):
                pixels = np.clip(base + rng.normal(0, 20, size=(8, 8)), 0, 255).astype(np.uint8)
                png = io.BytesIO()
                Image.fromarray(pixels, mode="L").save(png, format="PNG")
                z.writestr(f"squares/{label}/{i:03d}.png", png.getvalue())
        z.writestr("squares/.DS_Store", b"")
    return buf.getvalue()


def test_a_zip_of_an_image_folder_prepares_and_trains(pipeline):
    engine, names, _, setup, upload = pipeline
    setup("squares", {**SHORT, "name": "squares", "model": {"name": "mlp"}, "dataset": {"uri": "x", "channels": 1}})
    upload("incoming/squares/v1/squares.zip", _image_zip(np.random.default_rng(0)))
    desc = _wait(engine, upload("incoming/squares/v1/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    out = json.loads(desc["output"])
    manifest = json.loads(S3Store(names.data_bucket).get(out["prepared"]["dataset"].split("/", 3)[3] + "manifest.json"))
    assert manifest["classes"] == ["dark", "light"] and manifest["x"]["shape"] == [1, 8, 8]
    assert out["prepared"]["rows"] == 60


def test_a_jsonl_upload_prepares_and_trains(pipeline, tmp_path):
    engine, names, _, setup, upload = pipeline
    setup("lines", {**SHORT, "name": "lines"})
    head, *rows = Path(_houses(tmp_path / "h.csv", 6)).read_text().splitlines()
    records = [dict(zip(head.split(","), r.split(","))) for r in rows]
    body = "".join(json.dumps({k: v if k == "color" else float(v) for k, v in r.items()}) + "\n" for r in records)
    upload("incoming/lines/v1/houses.jsonl", body.encode())
    desc = _wait(engine, upload("incoming/lines/v1/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    out = json.loads(desc["output"])
    manifest = json.loads(S3Store(names.data_bucket).get(out["prepared"]["dataset"].split("/", 3)[3] + "manifest.json"))
    kinds = [(c["name"], c["kind"]) for c in manifest["columns"]]
    assert kinds == [("size", "numeric"), ("rooms", "numeric"), ("color", "onehot")] and manifest["classes"] == [
        "0",
        "1",
    ]
    assert out["prepared"]["rows"] == ROWS
    assert pl.champion(S3Store(names.artifacts_bucket), "lines").version == "v1"


def test_watch_folder_uploads_a_raw_version_marker_last_and_fetches_its_run(local, tmp_path, caplog):
    from smlt.watch import watch_folder

    engine, names = local
    root, out = tmp_path / "watched", tmp_path / "out"
    (root / "incoming/wr/v1").mkdir(parents=True)
    (root / "incoming/wr/job.json").write_text(json.dumps(SHORT))
    _houses(root / "incoming/wr/v1/houses.csv", 5)
    (root / "incoming/wr/v1/_SUCCESS").write_bytes(b"")
    caplog.set_level("INFO", logger="smlt.notice")
    (arn,) = watch_folder(engine, names, root, out, once=True, interval=0.1)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    assert json.loads((run_dir / "metrics.json").read_text())["final"]["rounds"] == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "smlt.notice"]
    assert f"s3://{names.data_bucket}/incoming/wr/v1/_SUCCESS: started execution {arn.rsplit(':', 1)[-1]}" in lines
    assert any(
        line.startswith(f"  prepared s3://{names.data_bucket}/incoming/wr/v1/ fixed pipeline wr's") for line in lines
    )


@pytest.mark.skipif(AWS is None, reason="the AWS CLI (awscli, a dev dependency) is not installed")
def test_watch_folder_waits_for_a_data_file_still_written_when_its_marker_appears(local, tmp_path, caplog):
    """The marker written while the CSV is still being copied in (its last line cut): the watcher
    uploads the folder once it has stopped changing, so the run prepares all 600 rows, not the
    part written so far (which failed on its cut line, or trained on fewer rows)."""
    import threading

    from smlt.watch import watch_folder

    engine, names = local
    root, out = tmp_path / "watched", tmp_path / "out"
    (root / "incoming/grow/v1").mkdir(parents=True)
    (root / "incoming/grow/job.json").write_text(json.dumps(SHORT))
    whole = Path(_houses(tmp_path / "whole.csv", 5)).read_bytes()
    data = root / "incoming/grow/v1/houses.csv"
    data.write_bytes(whole[:3001])  # a cut line
    (root / "incoming/grow/v1/_SUCCESS").write_bytes(b"")

    def finish() -> None:
        time.sleep(0.6)
        with data.open("ab") as f:
            f.write(whole[3001:])

    writer = threading.Thread(target=finish)
    writer.start()
    caplog.set_level("INFO", logger="smlt.notice")
    (arn,) = watch_folder(engine, names, root, out, once=True, interval=0.1, settle=1.0)
    writer.join()
    desc = engine.wait(arn, interval=0.1)
    assert desc["status"] == "SUCCEEDED", desc
    prepared = json.loads(desc["output"])["prepared"]["dataset"]
    bucket, prefix = keys.parse_s3_uri(prepared)
    manifest = json.loads(S3Store(bucket, client=engine.client("s3")).get(prefix.rstrip("/") + "/manifest.json"))
    assert manifest["train"]["rows"] + manifest["validation"]["rows"] == ROWS, manifest
    lines = [r.getMessage() for r in caplog.records if r.name == "smlt.notice"]
    assert any("still changing, its upload waits" in line for line in lines), lines


def test_the_gate_rejects_a_version_too_small_or_missing_a_class_to_compare_on(pipeline, tmp_path):
    engine, names, _, setup, upload = pipeline
    setup("few", {**SHORT, "training": {**SHORT["training"], "batch_size": 4}})
    head, *rows = Path(_houses(tmp_path / "h.csv", 7)).read_text().splitlines()
    upload("incoming/few/v1/houses.csv", "\n".join([head, *rows]).encode())
    assert _wait(engine, upload("incoming/few/v1/_SUCCESS", b""))["status"] == "SUCCEEDED"
    artifacts = S3Store(names.artifacts_bucket)

    def version(name: str, body: list[str]) -> pl.VersionRecord:
        upload(f"incoming/few/{name}/houses.csv", "\n".join([head, *body]).encode())
        desc = _wait(engine, upload(f"incoming/few/{name}/_SUCCESS", b""))
        assert desc["status"] == "SUCCEEDED", desc
        return pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("few", name)))

    # a filtered export (label 1 alone): a model that predicts 1 everywhere scores 1 on its rows
    ones = version("v2", [r for r in rows if r.endswith(",1")])
    assert ones.status == "rejected" and ones.challenger_value is not None, ones
    assert "hold 1 of the pipeline's 2 classes (none of '0': a filtered export?)" in ones.reason, ones.reason
    # 10 rows: 2 of them to validate on
    tiny = version("v3", rows[:10])
    assert tiny.status == "rejected" and "validation split has 2 rows, fewer than the 30" in tiny.reason, tiny.reason
    assert pl.champion(artifacts, "few").version == "v1"


def test_a_job_changed_between_versions_is_refused_before_the_version_is_recorded(pipeline, tmp_path, capsys):

    engine, names, _, setup, upload = pipeline
    setup("changed", SHORT)
    data = Path(_houses(tmp_path / "h.csv", 8)).read_bytes()
    upload("incoming/changed/v1/houses.csv", data)
    assert _wait(engine, upload("incoming/changed/v1/_SUCCESS", b""))["status"] == "SUCCEEDED"
    artifacts = S3Store(names.artifacts_bucket)
    upload("incoming/changed/v2/houses.csv", Path(_houses(tmp_path / "h2.csv", 9)).read_bytes())  # new rows

    # another label than the pipeline's features, another model than the champion's: the
    # execution fails by name, and no v2 is recorded (before: a v2 "starting" for ever)
    setup("changed", {**SHORT, "dataset": {"uri": "x", "label": "color"}})
    desc = _wait(engine, upload("incoming/changed/v2/_SUCCESS", b""))
    assert desc["status"] == "FAILED" and desc["error"] == "InvalidJob", desc
    assert (
        "incoming/changed/job.json against version v2: dataset.label: 'color', but houses was prepared with label "
        "'label' (a pipeline's label and task are its features'" in desc["cause"]
    ), desc
    assert [v.version for v in pl.versions(artifacts, "changed")] == ["v1"]

    setup("changed", {**SHORT, "model": {"name": "mlp"}})
    desc = _wait(engine, upload("incoming/changed/v2/_SUCCESS", b""))
    assert desc["status"] == "FAILED" and desc["error"] == "InvalidJob", desc
    cause = json.loads(desc["cause"])["errorMessage"]
    assert (
        cause.startswith("model: incoming/changed/job.json names 'mlp', but the champion v1 (run changed-v1-")
        and "), which this version's run starts from, is 'logreg': its weights fit that model only." in cause
    ), cause
    assert "--new-features" in cause
    assert [v.version for v in pl.versions(artifacts, "changed")] == ["v1"]
    out = _models_list(engine, "changed", capsys)
    assert "starting" not in out and "InvalidJob: model: incoming/changed/job.json names 'mlp'" in out, out

    # the job put back: the same upload trains
    setup("changed", SHORT)
    assert _wait(engine, upload("incoming/changed/v2/_SUCCESS", b""))["status"] == "SUCCEEDED"
    assert [v.version for v in pl.versions(artifacts, "changed")] == ["v1", "v2"]


def test_a_version_uploaded_again_keeps_its_earlier_record_and_rolls_back_to_its_run(pipeline, tmp_path, capsys):

    engine, names, _, setup, upload = pipeline
    setup("again", SHORT)
    artifacts = S3Store(names.artifacts_bucket)

    def version(name: str, seed: int, **kw) -> pl.VersionRecord:
        upload(f"incoming/again/{name}/houses.csv", Path(_houses(tmp_path / f"{seed}.csv", seed, **kw)).read_bytes())
        assert _wait(engine, upload(f"incoming/again/{name}/_SUCCESS", b""))["status"] == "SUCCEEDED"
        return pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("again", name)))

    version("v1", 1)
    first = version("v2", 2)
    if not first.promoted:
        pl.promote(artifacts, "again", "v2", "test")
    # v2 again, its train labels shuffled: a new run whose record replaces the first's as v2's
    order = np.random.default_rng(0).permutation(ROWS)
    second = version("v2", 3, shuffle_train=order[int(round(ROWS * 0.2)) :])
    assert second.run_id != first.run_id
    kept = pl.replaced(artifacts, "again")["v2"]
    assert [r.run_id for r in kept] == [first.run_id] and kept[0].promoted  # before: overwritten

    out = _models_list(engine, "again", capsys)
    assert f"uploaded again since: the earlier upload's run {first.run_id} (" in out, out

    # v1 by hand, then a rollback: back to v2's first run, the champion before v1 (before: to
    # v2's latest record, the second run, which was never champion if the gate rejected it)
    assert second.status == "rejected", second  # its train labels shuffled (as v3 of the console's test)
    pl.promote(artifacts, "again", "v1", "test")
    assert pl.rollback(artifacts, "again", "test").run_id == first.run_id
    assert pl.champion(artifacts, "again").run_id == first.run_id


def _prepare_dies(after_write: int, times: int = 1):
    """An invoke filter: the first `times` PrepareData invocations die right after their
    `after_write`-th write (`--faults crash`'s fault); the ops it saw, in order."""
    seen: list[str] = []

    def fate(function: str, payload: object) -> str:
        op = payload.get("op") if isinstance(payload, dict) else None
        if op in ("prepare_data", "prepare_failed"):
            seen.append(op)
            if op == "prepare_data" and seen.count("prepare_data") <= times:
                return f"crash:{after_write}"
        return "ok"

    return fate, seen


def _dataset(names, desc: dict) -> tuple[dict[str, str], dict]:
    """The run's prepared dataset: its objects' sha256 by name (the manifest apart), and its
    manifest's split sizes and features."""
    import hashlib

    prepared = json.loads(desc["output"])["prepared"]["dataset"]
    folder = prepared.removeprefix(f"s3://{names.data_bucket}/")
    data = S3Store(names.data_bucket)
    objects = {k.removeprefix(folder): hashlib.sha256(data.get(k)).hexdigest() for k in data.list(folder)}
    manifest = json.loads(data.get(folder + keys.MANIFEST))
    objects.pop(keys.MANIFEST)
    return objects, {s: manifest[s]["rows"] for s in ("train", "validation")} | {"features": manifest.get("features")}


def test_a_prepare_data_dying_between_its_writes_is_retried_to_the_same_dataset(pipeline, refusals, tmp_path):
    engine, names, _, setup, upload = pipeline
    setup("prepdies", SHORT)
    upload("incoming/prepdies/v1/houses.csv", Path(_houses(tmp_path / "h.csv", 1)).read_bytes())
    desc = _wait(engine, upload("incoming/prepdies/v1/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    baseline = _dataset(names, desc)
    artifacts = S3Store(names.artifacts_bucket)
    # the first claim (k=1), a few shards written (k=3), every shard and the manifest (k=9)
    for k in (1, 3, 9):
        fate, seen = _prepare_dies(k)
        engine.invoke_filter = fate
        try:
            desc = _wait(engine, upload("incoming/prepdies/v1/_SUCCESS", b""))
        finally:
            engine.invoke_filter = None
        assert desc["status"] == "SUCCEEDED", (k, desc)
        assert seen == ["prepare_data", "prepare_data"], (k, seen)  # died once, retried once
        assert _dataset(names, desc) == baseline, k
        run = json.loads(desc["output"])["plan"]["run_id"]
        record = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("prepdies", "v1")))
        assert record.run_id == run and record.status in ("promoted", "rejected"), (k, record)
    assert refusals(0) == []  # nothing refused


def test_a_prepare_data_that_dies_on_its_retry_too_fails_told_once(pipeline, refusals, tmp_path, capsys):
    engine, names, _, setup, upload = pipeline
    setup("prepdead", SHORT)
    upload("incoming/prepdead/v1/houses.csv", Path(_houses(tmp_path / "h.csv", 1)).read_bytes())
    fate, seen = _prepare_dies(1, times=2)
    engine.invoke_filter = fate
    try:
        desc = _wait(engine, upload("incoming/prepdead/v1/_SUCCESS", b""))
    finally:
        engine.invoke_filter = None
    assert desc["status"] == "FAILED" and desc["error"] == "Runtime.ExitError", desc
    assert seen == ["prepare_data", "prepare_data", "prepare_failed"], seen
    where = f"s3://{names.data_bucket}/incoming/prepdead/v1/"
    message = json.loads(desc["cause"])["errorMessage"]
    assert message.startswith(f"the Prepare function preparing {where} died (out of memory, or killed), on its retry")
    assert f"smlt data prepare SOURCE --out {where}" in message, message
    artifacts = S3Store(names.artifacts_bucket)
    assert pl.versions(artifacts, "prepdead") == [] and pl.champion(artifacts, "prepdead") is None
    (envelope,) = refusals(1) + refusals(0)  # told once
    body = json.loads(envelope["Message"])
    assert envelope["Subject"] == "smlt: prepdead v1 refused" and body["error"] == "Runtime.ExitError", body
    assert body["message"] == message and body["execution"] == desc["name"], body
    out = _models_list(engine, "prepdead", capsys)
    assert "v1 " in out and f"Runtime.ExitError: the Prepare function preparing {where} died" in out, out


def test_a_prepare_data_failed_for_good_leaves_no_shards_and_keeps_the_earlier_dataset(pipeline, tmp_path):
    """The version's marker uploaded again; its PrepareData dies after a few shards, on its retry
    too: PrepareFailed deletes what it wrote into its own prepared folder (before, those shards
    stayed, a dataset without a manifest), and the first upload's dataset is kept byte for byte."""
    import hashlib

    engine, names, _, setup, upload = pipeline
    setup("prepleft", SHORT)
    upload("incoming/prepleft/v1/houses.csv", Path(_houses(tmp_path / "h.csv", 1)).read_bytes())
    desc = _wait(engine, upload("incoming/prepleft/v1/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    data = S3Store(names.data_bucket)

    def stored() -> dict[str, str]:
        return {k: hashlib.sha256(data.get(k)).hexdigest() for k in data.list(keys.PREPARED + "prepleft/")}

    before = stored()
    assert any(k.endswith(keys.MANIFEST) for k in before) and len(before) > 2, before
    fate, seen = _prepare_dies(3, times=2)  # the claim, then shards: dies after its 3rd write, twice
    engine.invoke_filter = fate
    try:
        desc = _wait(engine, upload("incoming/prepleft/v1/_SUCCESS", b""))
    finally:
        engine.invoke_filter = None
    assert desc["status"] == "FAILED" and desc["error"] == "Runtime.ExitError", desc
    assert seen == ["prepare_data", "prepare_data", "prepare_failed"], seen
    assert stored() == before


def _reshaped(path: Path, lines: list[str], order: list[str], *, rename: dict | None = None, cells=None) -> bytes:
    """`lines` (a CSV with a header) written with its columns in `order` (a column not in the
    header is filled by `cells(row index, cells by name)`), its header renamed by `rename`."""
    head, *rows = [line.split(",") for line in lines]
    out = [",".join((rename or {}).get(c, c) for c in order)]
    for i, row in enumerate(rows):
        by = dict(zip(head, row))
        out.append(",".join(by[c] if c in by else cells(i, by) for c in order))
    path.write_text("\n".join(out) + "\n")
    return path.read_bytes()


def test_a_version_whose_columns_changed_trains_on_the_same_encoding_or_is_refused_by_name(pipeline, tmp_path, capsys):
    """A pipeline's later versions whose table changed shape, the job unchanged, in sequence: the
    columns in another order, a new column, a new level of the text column and labels written
    `1.0` prepare to exactly what the same rows in v1's shape prepare to (the features of v1, the
    champion's warm start, the gate's validation rows encoded as for the champion); a column
    renamed (its letter case), removed, a number column holding text and a new class are refused
    before training, naming the column (or label) and what to do, and listed by `smlt models list`."""
    from safetensors.numpy import load

    engine, names, _, setup, upload = pipeline
    setup("shape", SHORT)
    data, artifacts = S3Store(names.data_bucket), S3Store(names.artifacts_bucket)
    upload("incoming/shape/v1/houses.csv", Path(_houses(tmp_path / "v1.csv", 1)).read_bytes())
    assert _wait(engine, upload("incoming/shape/v1/_SUCCESS", b""))["status"] == "SUCCEEDED"
    features = data.get(keys.pipeline_features_key("shape"))

    # v2: the columns in another order, a new column `garden`, a colour v1 never had, labels `1.0`
    lines = Path(_houses(tmp_path / "v2.csv", 2, colors=("red", "green", "blue"))).read_text().splitlines()
    body = _reshaped(
        tmp_path / "v2-shaped.csv",
        [lines[0]] + [",".join(r.split(",")[:-1] + [r.split(",")[-1] + ".0"]) for r in lines[1:]],
        ["label", "garden", "color", "rooms", "size"],
        cells=lambda i, _: str(i % 7),
    )
    upload("incoming/shape/v2/houses.csv", body)
    desc = _wait(engine, upload("incoming/shape/v2/_SUCCESS", b""))
    assert desc["status"] == "SUCCEEDED", desc
    out = json.loads(desc["output"])
    notes = "\n".join(out["prepared"]["notes"])
    assert "column 'garden' is not among the pipeline's features (generation 1): ignored" in notes, notes
    assert "column 'color':" in notes and "values new to the pipeline's features ('blue')" in notes, notes
    assert data.get(keys.pipeline_features_key("shape")) == features  # v1's features kept
    record = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("shape", "v2")))
    assert record.start.startswith("warm: from the champion v1") and record.champion_value is not None, record
    assert record.status in ("promoted", "rejected") and record.challenger_value is not None, record

    # the same rows in v1's shape, prepared on a machine with the pipeline's features: the same
    # shards, so the warm start and the gate read v2's rows encoded as the champion's were
    spec = tmp_path / "same" / "incoming" / "shape"
    spec.mkdir(parents=True)
    (spec / "features.json").write_bytes(features)
    pl.prepare_version(str(tmp_path / "v2.csv"), str(spec / "v2") + "/", seed=0)
    bucket, prefix = keys.parse_s3_uri(out["prepared"]["dataset"])
    cloud = sorted(k for k in data.list(prefix.rstrip("/") + "/") if k.endswith(".safetensors"))
    assert [k.rsplit("/", 1)[-1] for k in cloud] == sorted(p.name for p in (spec / "v2").glob("*.safetensors"))
    for key in cloud:
        theirs, ours = load(data.get(key)), load((spec / "v2" / key.rsplit("/", 1)[-1]).read_bytes())
        assert theirs.keys() == ours.keys() and all(np.array_equal(theirs[k], ours[k]) for k in ours), key

    # refused before training, each naming the column or label and what to do
    v1 = Path(tmp_path / "v1.csv").read_text().splitlines()
    cases = {
        "v3": (
            _reshaped(tmp_path / "v3.csv", v1, ["size", "rooms", "color", "label"], rename={"rooms": "Rooms"}),
            "no column 'rooms', which the pipeline's features (generation 1) use; its column 'Rooms' differs from it only "
            "in letter case or spacing: rename that header 'rooms' and upload the version again",
        ),
        "v4": (
            _reshaped(tmp_path / "v4.csv", v1, ["size", "color", "label"]),
            "no column 'rooms', which the pipeline's features (generation 1) use; add it",
        ),
        "v5": (
            "\n".join(v1[:5] + ["unknown," + v1[5].split(",", 1)[1]] + v1[6:]).encode(),
            "column 'size', line 6: 'unknown' is not a number, and the pipeline's features read column 'size' as numbers",
        ),
        "v6": (
            "\n".join(v1[:3] + [v1[3].rsplit(",", 1)[0] + ",2"] + v1[4:]).encode(),
            "label '2' is not one of the pipeline's classes (0, 1); a new class changes the model's outputs",
        ),
    }
    for version, (body, said) in cases.items():
        upload(f"incoming/shape/{version}/houses.csv", body)
        desc = _wait(engine, upload(f"incoming/shape/{version}/_SUCCESS", b""))
        assert desc["status"] == "FAILED" and desc["error"] == "InvalidDataset", desc
        assert said in desc["cause"] and f"incoming/shape/{version}/houses.csv" in desc["cause"], desc["cause"]
    assert [v.version for v in pl.versions(artifacts, "shape")] == ["v1", "v2"]
    assert data.get(keys.pipeline_features_key("shape")) == features
    listed = _models_list(engine, "shape", capsys)
    refused = listed.split("uploads refused before training", 1)[1]
    for version in cases:
        assert f"  {version} " in refused, listed
    assert refused.count("InvalidDataset: ") == 4 and "'Rooms'" in refused and "'unknown'" in refused, listed
