"""A retraining pipeline on the local engine: fixed features across versions, the gate before
promotion, versions and rollback, and uploads whose shards arrive after the manifest."""

import json
import threading
import time

import numpy as np
import pytest

from smlt.local.eventbridge import UploadTrigger, deliver, object_created_event, upload_version
from smlt.runtime import keys
from smlt.runtime import pipeline as pl
from smlt.runtime.store import S3Store

ROWS = 600


def _houses(path, seed, *, colors=("red", "green"), extra=False, shuffle_train=None):
    """A learnable CSV: the label is 1 when size + the colour's offset is large. `extra` adds two
    columns; `shuffle_train` (the indices of the train split) shuffles those rows' labels."""
    rng = np.random.default_rng(seed)
    size = rng.normal(size=ROWS)
    rooms = rng.normal(size=ROWS)
    color = rng.choice(colors, size=ROWS)
    offset = np.select([color == "red", color == "green"], [1.0, -1.0], 0.0)
    label = (size + 0.5 * rooms + offset > 0).astype(int)
    if shuffle_train is not None:
        label[shuffle_train] = rng.permutation(label[shuffle_train])
    head = ["size", "rooms", "color"] + (["garden", "floor"] if extra else []) + ["label"]
    lines = [",".join(head)]
    for i in range(ROWS):
        cells = [f"{size[i]:.4f}", f"{rooms[i]:.4f}", color[i]]
        cells += [f"{rng.normal():.3f}", str(rng.integers(0, 5))] if extra else []
        lines.append(",".join(cells + [str(label[i])]))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _run(engine, arns):
    (arn,) = arns
    desc = engine.wait(arn, interval=0.1)
    assert desc["status"] == "SUCCEEDED", desc
    return json.loads(desc["output"])["plan"]["run_id"]


def test_versions_warm_start_through_the_gate_and_roll_back(engine_as_aws, tmp_path, capsys):
    from smlt.cli import main

    engine, names = engine_as_aws
    root = tmp_path / "watched"
    job = {
        "name": "houses",
        "dataset": {"uri": "replaced-by-the-trigger"},
        "model": {"name": "logreg"},
        "training": {"max_rounds": 3, "local_steps": 15, "learning_rate": 0.3},
        "workers": {"initial": 2, "memory_mb": 1769},
    }
    (root / "incoming/houses").mkdir(parents=True)
    (root / "incoming/houses/job.json").write_text(json.dumps(job))
    trigger = UploadTrigger(engine, names.data_bucket)
    trigger.prime()
    artifacts = S3Store(names.artifacts_bucket)

    # v1 fixes the pipeline's features (generation 1): 2 numbers + a one-hot of 2 colours.
    m1, said = pl.prepare_version(_houses(tmp_path / "v1.csv", 1), str(root / "incoming/houses/v1"), shards=4)
    assert m1.x.shape == [4] and m1.generation == 1 and "generation 1" in said
    run1 = _run(engine, upload_version(trigger, root / "incoming/houses/v1", root))
    v1 = artifacts.get(keys.pipeline_version_key("houses", "v1"))
    assert json.loads(v1)["status"] == "promoted" and pl.champion(artifacts, "houses").run_id == run1

    # v2: a colour v1 never saw and two new columns: the same 4 features, a warm start, the gate.
    m2, said = pl.prepare_version(
        _houses(tmp_path / "v2.csv", 2, colors=("red", "green", "blue"), extra=True),
        str(root / "incoming/houses/v2"),
        shards=4,
    )
    assert m2.x.shape == m1.x.shape and m2.columns == m1.columns and "generation 1" in said
    _run(engine, upload_version(trigger, root / "incoming/houses/v2", root))
    v2 = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("houses", "v2")))
    assert v2.start.startswith("warm: from the champion v1") and v2.champion_run == run1
    assert v2.metric == "val_accuracy" and v2.challenger_value is not None and v2.champion_value is not None
    assert v2.status in ("promoted", "rejected") and v2.reason and v2.cost_usd > 0 and v2.model_sha256
    champ = "v2" if v2.promoted else "v1"
    assert pl.champion(artifacts, "houses").version == champ

    # v3: the train split's labels shuffled (prepare's split, seed 0): a worse model, rejected.
    order = np.random.default_rng(0).permutation(ROWS)
    train_rows = order[int(round(ROWS * 0.2)) :]
    pl.prepare_version(_houses(tmp_path / "v3.csv", 3, shuffle_train=train_rows), str(root / "incoming/houses/v3"))
    run3 = _run(engine, upload_version(trigger, root / "incoming/houses/v3", root))
    v3 = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("houses", "v3")))
    assert v3.run_id == run3 and v3.status == "rejected" and not v3.promoted, v3
    assert v3.challenger_value < v3.champion_value and "worse by" in v3.reason
    assert pl.champion(artifacts, "houses").version == champ  # latest unchanged

    # smlt models against the stack (the local engine's endpoint, as against AWS).
    from smlt.console import publish_outputs

    publish_outputs(engine, "SmltPipelines")
    stack = ["--stack", "SmltPipelines"]
    assert main(["models", "list", "houses", *stack]) == 0
    listing = capsys.readouterr().out
    assert "v3" in listing and "rejected" in listing and f"champion (*): {champ}" in listing
    if champ == "v1":  # make v2 the champion by hand, so that a rollback has somewhere to go
        assert main(["models", "promote", "houses", "v2", *stack]) == 0
    assert main(["models", "rollback", "houses", *stack]) == 0
    assert "champion is v1" in capsys.readouterr().out
    assert pl.champion(artifacts, "houses").run_id == run1
    assert main(["models", "rollback", "houses", *stack]) == 2  # v1 alone: nothing before it, said
    assert main(["models", "promote", "houses", "v9", *stack]) == 2


def test_a_first_version_too_small_to_measure_is_rejected_and_says_what_to_do(engine_as_aws, tmp_path, capsys):
    """No champion to compare with, but the gate's other rule holds: a first version of 60 rows (12
    validation rows) is kept rejected, saying why; the pipeline has no champion until a version with
    enough rows comes, or one is promoted by hand."""
    from smlt.cli import main
    from smlt.console import publish_outputs

    engine, names = engine_as_aws
    root = tmp_path / "watched"
    job = {
        "name": "cottages",
        "dataset": {"uri": "replaced-by-the-trigger"},
        "model": {"name": "logreg"},
        "training": {"max_rounds": 2, "local_steps": 10, "learning_rate": 0.3},
        "workers": {"initial": 1, "memory_mb": 1769},
    }
    (root / "incoming/cottages").mkdir(parents=True)
    (root / "incoming/cottages/job.json").write_text(json.dumps(job))
    trigger = UploadTrigger(engine, names.data_bucket)
    trigger.prime()
    artifacts = S3Store(names.artifacts_bucket)

    tiny = tmp_path / "v1.csv"
    _houses(tiny, 1)
    tiny.write_text("\n".join(tiny.read_text().splitlines()[:61]) + "\n")  # the header and 60 rows
    pl.prepare_version(str(tiny), str(root / "incoming/cottages/v1"), shards=2)
    _run(engine, upload_version(trigger, root / "incoming/cottages/v1", root))
    v1 = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("cottages", "v1")))
    assert v1.status == "rejected" and not v1.promoted and v1.model, v1
    assert v1.reason == (
        "no champion to compare with, but the version's validation split has "
        "12 rows, fewer than the 30 the gate compares on (the job's promotion_min_rows): the pipeline has no "
        "champion yet (upload the version "
        "again with more rows, or `smlt models promote cottages v1` to serve it anyway)"
    ), v1.reason
    assert pl.champion(artifacts, "cottages") is None

    publish_outputs(engine, "SmltTiny")
    stack = ["--stack", "SmltTiny"]
    assert main(["models", "list", "cottages", *stack]) == 0
    listing = capsys.readouterr().out
    print(listing)
    assert "v1" in listing and "rejected" in listing and "fewer than the 30" in listing
    assert "no champion yet (cottages@latest names none): `smlt models promote cottages VERSION`" in listing
    assert main(["models", "promote", "cottages", "v1", *stack]) == 0
    champ = pl.champion(artifacts, "cottages")
    assert champ is not None and champ.version == "v1" and champ.by != "gate"


def test_manifest_before_its_shards_waits_and_a_reupload_retrains(engine_as_aws, tmp_path):
    engine, names = engine_as_aws
    s3 = engine.client("s3")
    job = {"name": "sync", "dataset": {"uri": "x"}, "training": {"max_rounds": 1, "local_steps": 2}}
    s3.put_object(Bucket=names.data_bucket, Key="incoming/sy/job.json", Body=json.dumps(job).encode())
    folder = tmp_path / "v1"
    pl.prepare_version(_houses(tmp_path / "v1.csv", 1), str(folder), shards=3)
    files = sorted(folder.iterdir())  # `aws s3 sync` order: manifest.json first, then the shards
    assert files[0].name == "manifest.json"
    put = lambda f: s3.put_object(Bucket=names.data_bucket, Key=f"incoming/sy/v1/{f.name}", Body=f.read_bytes())  # noqa: E731
    put(files[0])
    body = files[0].read_bytes()
    import hashlib

    event = object_created_event(
        names.data_bucket, "incoming/sy/v1/manifest.json", len(body), hashlib.md5(body).hexdigest()
    )
    (arn,) = deliver(engine, event)
    time.sleep(3)  # the run waits for the shards while they upload
    uploading = threading.Thread(target=lambda: [put(f) for f in files[1:]])
    uploading.start()
    desc = engine.wait(arn, interval=0.1)
    uploading.join()
    assert desc["status"] == "SUCCEEDED", desc
    run1 = json.loads(desc["output"])["plan"]["run_id"]
    # The same event again (at-least-once delivery): a duplicate, nothing trains.
    (dup,) = deliver(engine, event)
    assert json.loads(engine.wait(dup, interval=0.1)["output"])["plan"]["action"] == "duplicate"
    # The manifest uploaded again (a new S3 event, a new sequencer): a new run.
    again = object_created_event(
        names.data_bucket, "incoming/sy/v1/manifest.json", len(body), hashlib.md5(body).hexdigest()
    )
    desc = engine.wait(deliver(engine, again)[0], interval=0.1)
    assert desc["status"] == "SUCCEEDED" and json.loads(desc["output"])["plan"]["run_id"] != run1


def test_a_shard_that_never_arrives_is_named(engine_as_aws, tmp_path):
    engine, names = engine_as_aws
    folder = tmp_path / "v1"
    m = pl.prepare_version(_houses(tmp_path / "v1.csv", 1), str(folder), shards=2)[0]
    data = S3Store(names.data_bucket)
    for f in sorted(folder.iterdir()):
        if f.name != "validation-00000.safetensors":
            data.put(f"incoming/gone/v1/{f.name}", f.read_bytes())
    t0 = time.monotonic()
    with pytest.raises(pl.IncompleteUpload, match="validation-00000.safetensors"):
        pl.wait_for_shards(data, "incoming/gone/v1", m, wait_s=1.0)
    assert 1.0 <= time.monotonic() - t0 < 10


def _fraud(path, seed, fraud_share, *, ok_train=None, rows=ROWS):
    """A CSV of 'fraud'/'ok' rows: fraud rows are shifted on two of four features. `ok_train` (the
    indices of the train split) labels those rows 'ok' whatever they are."""
    rng = np.random.default_rng(seed)
    y = rng.random(rows) < fraud_share
    x = rng.normal(size=(rows, 4))
    x[y, :2] += 1.2  # separable enough to learn, not to be right on every row
    label = np.where(y, "fraud", "ok")
    if ok_train is not None:
        label[ok_train] = "ok"
    lines = ["a,b,c,d,label"] + [",".join([*(f"{v:.4f}" for v in x[i]), label[i]]) for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_gate_on_balanced_accuracy_rejects_a_challenger_that_stops_predicting_fraud(engine_as_aws, tmp_path, capsys):
    """The champion learned fraud on balanced data; the challenger (warm-started, its train split's
    fraud labelled 'ok') gains accuracy on the imbalanced validation rows and loses balanced
    accuracy: rejected, and `smlt models list` says its class warning."""
    from smlt.cli import main
    from smlt.console import publish_outputs

    engine, names = engine_as_aws
    root = tmp_path / "watched"
    job = {
        "name": "fraud",
        "dataset": {"uri": "replaced-by-the-trigger", "label": "label"},
        "model": {"name": "logreg"},
        "training": {
            "max_rounds": 4,
            "local_steps": 15,
            "learning_rate": 0.3,
            "target_metric": "val_balanced_accuracy",
        },
        "workers": {"initial": 2, "memory_mb": 1769},
    }
    (root / "incoming/fraud").mkdir(parents=True)
    (root / "incoming/fraud/job.json").write_text(json.dumps(job))
    trigger = UploadTrigger(engine, names.data_bucket)
    trigger.prime()
    artifacts = S3Store(names.artifacts_bucket)

    pl.prepare_version(_fraud(tmp_path / "v1.csv", 1, 0.5), str(root / "incoming/fraud/v1"), shards=4)
    run1 = _run(engine, upload_version(trigger, root / "incoming/fraud/v1", root))
    assert pl.champion(artifacts, "fraud").run_id == run1

    order = np.random.default_rng(0).permutation(ROWS)  # prepare's split (seed 0): validation first
    train_rows = order[int(round(ROWS * 0.2)) :]
    pl.prepare_version(_fraud(tmp_path / "v2.csv", 2, 0.08, ok_train=train_rows), str(root / "incoming/fraud/v2"))
    run2 = _run(engine, upload_version(trigger, root / "incoming/fraud/v2", root))
    v2 = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("fraud", "v2")))
    final = json.loads(artifacts.get(keys.final_metrics_key(run2)))
    round0 = final["rounds"][0]  # the champion scored on v2's validation rows
    print(f"\nchampion on v2: accuracy {round0['val_accuracy']:.4f}, balanced {round0['val_balanced_accuracy']:.4f}")
    print(
        f"challenger:     accuracy {final['final']['val_accuracy']:.4f}, balanced {final['final']['val_balanced_accuracy']:.4f}"
    )
    print(f"gate: {v2.status}: {v2.reason}")
    assert v2.metric == "val_balanced_accuracy" and v2.status == "rejected", v2
    assert final["final"]["val_accuracy"] > round0["val_accuracy"]  # plain accuracy would have promoted it
    assert v2.challenger_value < v2.champion_value and "worse by" in v2.reason
    assert pl.champion(artifacts, "fraud").run_id == run1

    publish_outputs(engine, "SmltFraud")
    assert main(["models", "list", "fraud", "--stack", "SmltFraud"]) == 0
    listing = capsys.readouterr().out
    print(listing)
    assert "val_balanced_accuracy" in listing and "warning: balanced accuracy" in listing


def test_after_a_rollback_the_next_version_starts_from_the_champion_rolled_back_to(engine_as_aws, tmp_path):
    """A rollback then a new version: its warm start and its gate are the rolled-back-to
    champion's. A rollback from a new features generation to the older one's champion holds: a
    later version of the newer generation, which starts cold and cannot be compared with it, is
    rejected saying so instead of replacing it unseen (before: promoted, "no champion to compare
    with")."""
    engine, names = engine_as_aws
    root = tmp_path / "watched"
    job = {
        "name": "back",
        "dataset": {"uri": "replaced-by-the-trigger"},
        "model": {"name": "logreg"},
        "training": {"max_rounds": 1, "local_steps": 5, "learning_rate": 0.3},
        "workers": {"initial": 2, "memory_mb": 1769},
    }
    (root / "incoming/back").mkdir(parents=True)
    (root / "incoming/back/job.json").write_text(json.dumps(job))
    trigger = UploadTrigger(engine, names.data_bucket)
    trigger.prime()
    artifacts = S3Store(names.artifacts_bucket)

    def version(name: str, seed: int, **kw) -> pl.VersionRecord:
        pl.prepare_version(_houses(tmp_path / f"{name}.csv", seed), str(root / f"incoming/back/{name}"), **kw)
        run = _run(engine, upload_version(trigger, root / f"incoming/back/{name}", root))
        record = pl.VersionRecord.model_validate_json(artifacts.get(keys.pipeline_version_key("back", name)))
        assert record.run_id == run and record.decided_at is not None, record
        return record

    v1 = version("v1", 1)
    v2 = version("v2", 2)
    if not v2.promoted:
        pl.promote(artifacts, "back", "v2", "test")
    assert pl.rollback(artifacts, "back", "test").run_id == v1.run_id
    v3 = version("v3", 3)
    assert v3.champion_run == v1.run_id and v3.start.startswith("warm: from the champion v1"), v3
    assert v3.champion_value is not None, v3  # the gate compared with v1, not v2
    champ = pl.champion(artifacts, "back")
    assert champ.version in ("v1", "v3")

    # a new generation, promoted cold, then rolled back from
    v4 = version("v4", 4, new_features=True)
    assert v4.generation == 2 and v4.start.startswith("cold: feature generation 2") and v4.promoted, v4
    assert pl.rollback(artifacts, "back", "test").run_id == champ.run_id
    v5 = version("v5", 5)
    assert v5.generation == 2 and v5.champion_run is None and v5.status == "rejected", v5
    assert (
        f"the champion {champ.version} (generation 1) was chosen over generation 2's v4 (rolled back to, or "
        "promoted by hand)" in v5.reason
    ), v5.reason
    assert "`smlt models promote back v5`" in v5.reason
    assert pl.champion(artifacts, "back").run_id == champ.run_id
