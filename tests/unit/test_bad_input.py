"""Bad input ends with a named error that names the field, file, column or object and says what
to do, before any engine, stack or dataset is touched; `smlt` prints it without a traceback."""

import json
from pathlib import Path

import pytest

import smlt.runner
from smlt.cli import main
from smlt.runtime.errors import InvalidJob
from smlt.runtime.job import MAX_ROUND_SAMPLES, parse_job


@pytest.fixture(autouse=True)
def no_engine(monkeypatch, tmp_path):
    """Every case here must fail before the local engine starts."""
    monkeypatch.setenv("SMLT_HOME", str(tmp_path / "home"))

    def refuse(faults):
        raise AssertionError("the local engine was started for bad input")

    monkeypatch.setattr(smlt.runner, "start_engine", refuse)


def run(tmp_path, capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def job_file(tmp_path, data: bytes | dict) -> Path:
    path = tmp_path / "job.json"
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def csv_file(tmp_path, header: str, rows: list[str], name="data.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_job_file_not_utf8_names_the_file(tmp_path, capsys):
    path = job_file(tmp_path, b'{"dataset": {"uri": "sklearn:digits"}, "name": "\xff\xfe"}')
    rc, err = run(tmp_path, capsys, "run", "--local", str(path), "--out", str(tmp_path / "out"))
    assert rc == 2 and f"InvalidJob: job: {path} is not UTF-8" in err and "save it as UTF-8" in err
    assert not (tmp_path / "out").exists()


def test_job_over_256_kib_is_refused_before_the_engine(tmp_path, capsys):
    path = job_file(tmp_path, {"dataset": {"uri": "sklearn:digits"}, "model": {"params": {"pad": "x" * 300_000}}})
    rc, err = run(tmp_path, capsys, "run", "--local", str(path))
    assert rc == 2 and f"job: {path} is 300," in err and "262,144 bytes (256 KiB)" in err


@pytest.mark.parametrize(
    "text, needle",
    [
        ('{"name": ', "manifest.json is not valid JSON"),
        ('{"name": "x"}', "manifest.json is not an smlt dataset manifest: source: Field required"),
    ],
)
def test_corrupt_or_foreign_manifest_names_the_file_and_field(tmp_path, capsys, text, needle):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "manifest.json").write_text(text)
    rc, err = run(
        tmp_path, capsys, "run", "--local", str(job_file(tmp_path, {"dataset": {"uri": str(tmp_path / "ds")}}))
    )
    assert rc == 2 and "InvalidDataset" in err and needle in err and "smlt data prepare" in err


def test_accuracy_target_above_one():
    with pytest.raises(InvalidJob, match=r"training.target_value: val_accuracy is a fraction of at most 1"):
        parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"target_value": 96}})
    # A loss target has no such bound.
    assert parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"target_metric": "val_loss", "target_value": 2}})


def test_local_steps_are_bounded_before_any_memory_is_taken():
    with pytest.raises(
        InvalidJob, match=r"training.local_steps: 1000000000 steps of batch_size 32 .* lower local_steps"
    ):
        parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"local_steps": 10**9}})
    ok = MAX_ROUND_SAMPLES // 32
    assert parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"local_steps": ok}}).training.local_steps == ok


def test_ten_thousand_workers_are_refused():
    with pytest.raises(InvalidJob, match=r"workers.initial: at most 1000 workers"):
        parse_job({"dataset": {"uri": "s3://b/d/"}, "workers": {"initial": 10_000, "max": 10_000}})


def test_many_workers_on_few_local_processes_are_announced(caplog):
    from types import SimpleNamespace

    job = parse_job({"dataset": {"uri": "s3://b/d/"}, "workers": {"initial": 1000, "max": 1000}})
    engine = SimpleNamespace(pool=SimpleNamespace(size=2))
    with caplog.at_level("INFO", logger="smlt.runtime.progress"):
        smlt.runner._note_queueing(job, engine)
    assert "up to 1000 workers per round share 2 local handler processes" in caplog.text


def test_batch_larger_than_the_dataset(tmp_path, capsys):
    csv = csv_file(tmp_path, "a,b,label", [f"{i},{i % 3},{i % 2}" for i in range(20)])
    path = job_file(tmp_path, {"dataset": {"uri": str(csv)}, "training": {"batch_size": 64}})
    rc, err = run(tmp_path, capsys, "run", "--local", str(path))
    assert rc == 2 and "training.batch_size: 64 is larger than the whole training split (16 rows" in err


def test_augmenting_tabular_data_is_refused_before_the_engine_starts(tmp_path, capsys):
    csv = csv_file(tmp_path, "a,b,label", [f"{i},{i % 3},{i % 2}" for i in range(20)])
    path = job_file(tmp_path, {"dataset": {"uri": str(csv)}, "training": {"batch_size": 4, "augment": ["flip"]}})
    rc, err = run(tmp_path, capsys, "run", "--local", str(path))
    assert rc == 2 and "training.augment: flip augment images (channels x height x width)" in err
    assert "samples are 2: leave training.augment empty" in err


def test_prepare_with_a_missing_label_column_lists_the_columns(tmp_path, capsys):
    csv = csv_file(tmp_path, "a,b,label", ["1,2,0", "3,4,1"])
    rc, err = run(tmp_path, capsys, "data", "prepare", str(csv), "--label", "y", "--out", str(tmp_path / "p"))
    assert rc == 2 and "no label column 'y'; the columns are a, b, label" in err
    assert not (tmp_path / "p").exists()


def test_prepare_with_zero_shards(tmp_path, capsys):
    csv = csv_file(tmp_path, "a,b,label", ["1,2,0", "3,4,1"])
    rc, err = run(tmp_path, capsys, "data", "prepare", str(csv), "--shards", "0", "--out", str(tmp_path / "p"))
    assert rc == 2 and "shards: need at least 1 shard, got 0" in err
    assert not (tmp_path / "p").exists()


def test_prepare_a_classification_csv_with_one_class(tmp_path, capsys):
    csv = csv_file(tmp_path, "a,b,label", ["1,2,0", "3,4,0", "5,6,0"])
    rc, err = run(tmp_path, capsys, "data", "prepare", str(csv), "--out", str(tmp_path / "p"))
    assert rc == 2 and "every label is 0.0: a classifier needs at least 2 classes" in err
    assert not (tmp_path / "p").exists()


def test_float_labels_are_not_guessed_to_be_hundreds_of_classes(tmp_path, capsys):
    csv = csv_file(tmp_path, "a,price", [f"{i},{25 + i % 291}.0" for i in range(600)])
    rc, err = run(tmp_path, capsys, "data", "prepare", str(csv), "--out", str(tmp_path / "p"))
    assert rc == 2 and "label column 'price' has 291 distinct whole-number values" in err
    assert "--task regression" in err and not (tmp_path / "p").exists()
    rc, _ = run(tmp_path, capsys, "data", "prepare", str(csv), "--task", "regression", "--out", str(tmp_path / "p"))
    assert rc == 0
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["task"] == "regression"
    # Decimal-written whole numbers look like a quantity past 10 values; a 0.0/1.0 flag is classes.
    ages = csv_file(tmp_path, "a,age", [f"{i},{18 + i % 50}.0" for i in range(200)], name="ages.csv")
    rc, err = run(tmp_path, capsys, "data", "prepare", str(ages), "--out", str(tmp_path / "a"))
    assert rc == 2 and "label column 'age' has 50 distinct whole-number values written as decimals" in err
    flags = csv_file(tmp_path, "a,flag", [f"{i},{i % 2}.0" for i in range(40)], name="flags.csv")
    assert run(tmp_path, capsys, "data", "prepare", str(flags), "--out", str(tmp_path / "f"))[0] == 0
    assert json.loads((tmp_path / "f" / "manifest.json").read_text())["task"] == "classification"


def test_resume_of_an_unknown_run_or_of_no_saved_state(tmp_path, capsys):
    rc, err = run(tmp_path, capsys, "resume", "r1", "--local", "--out", str(tmp_path / "out"))
    assert rc == 1 and f"error: no saved state in {tmp_path / 'out' / '.state'}" in err
    state = tmp_path / "out" / ".state"
    state.mkdir(parents=True)
    (state / "items.json").write_text(json.dumps([{"pk": "RUN#other", "sk": "META", "run_id": "other"}]))
    rc, err = run(tmp_path, capsys, "resume", "r1", "--local", "--out", str(tmp_path / "out"))
    assert rc == 1 and "error: no run 'r1' in the saved state" in err and "(it holds: 'other')" in err


@pytest.mark.parametrize("missing", ["region", "credentials"])
def test_start_without_region_or_credentials(tmp_path, capsys, monkeypatch, missing):
    for var in (
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr("boto3.DEFAULT_SESSION", None)  # one made earlier may hold a region or credentials
    if missing == "credentials":
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    path = job_file(tmp_path, {"dataset": {"uri": "s3://bucket/data/"}})
    rc, err = run(tmp_path, capsys, "start", str(path))
    assert rc == 1 and err.startswith(f"error: no AWS {missing}: ")


def test_a_garbage_object_names_its_key():
    from smlt.runtime.tensors.format import HeaderError
    from smlt.runtime.tensors.layout import read_layout

    class Store:
        def get_range(self, key, start, end):
            return b"garbage!" * 4

    key = "runs/r/rounds/00000/updates/00003.safetensors"
    with pytest.raises(HeaderError, match=f"^{key}: not a safetensors file .*damaged or not written by smlt"):
        read_layout(Store(), key)


def test_the_end_of_a_run_stopped_before_its_first_round(tmp_path):
    final = {
        "rounds": 0,
        "val_accuracy": None,
        "val_loss": None,
        "estimated_cost_usd": 0.0,
        "stop_reason": "budget: $0.00000 left cannot pay the worst case of one more round",
        "model_key": None,
    }
    (tmp_path / "metrics.json").write_text("{}")
    lines = smlt.runner.done_lines("r", final, 1.0, tmp_path)
    assert lines[0].startswith("done: run r: 0 rounds, val accuracy n/a, val loss n/a, 1.0 s")
    assert lines[1].endswith("(no round was trained)") and lines[2] == f"  outputs in {tmp_path}/: metrics.json"


@pytest.mark.parametrize(
    "error, rc, shown",
    [
        ("smlt.runtime.errors:InvalidDataset", 2, "error: InvalidDataset: boom"),
        ("smlt.runtime.tensors.format:HeaderError", 2, "error: HeaderError: boom"),
        ("smlt.runtime.errors:RunNotFound", 1, "error: boom"),
        ("smlt.runtime.errors:AwsNotConfigured", 1, "error: boom"),
        ("smlt.local.limits:LimitError", 2, "error: LimitError: boom"),
        ("smlt.local.synth:SynthError", 1, "error: the local engine: SynthError: boom"),
        ("smlt.local.errors:MotoVersionError", 1, "error: the local engine: MotoVersionError: boom"),
        ("smlt.local.resolve:UnresolvableError", 1, "error: the local engine: UnresolvableError: boom"),
    ],
)
def test_the_cli_prints_every_error_class_of_smlts_own(tmp_path, capsys, monkeypatch, error, rc, shown):
    import importlib

    module, name = error.split(":")
    cls = getattr(importlib.import_module(module), name)

    def fails(job_path, out, faults=None, code=None, replace=False):
        raise cls("boom")

    import smlt.precheck

    monkeypatch.setattr(smlt.precheck, "check_job_file", lambda path, code=None, s3=False: None)
    monkeypatch.setattr(smlt.runner, "run_local", fails)
    assert run(tmp_path, capsys, "run", "--local", str(job_file(tmp_path, {}))) == (rc, shown + "\n")
