"""Files and values a new user gets wrong, each named: an Excel CSV's byte-order mark, an --out that
is a file, a prepare folder holding an earlier dataset, JSON's Infinity and booleans for numbers,
skipped files in an image folder, a study deadline no trial fits, a failed trial's cause."""

import json
import logging

import numpy as np
import pytest

from smlt.cli import main
from smlt.runtime.data.manifest import parse_manifest
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidDataset, InvalidJob
from smlt.runtime.job import parse_job
from smlt.runtime.study.cause import trial_cause
from smlt.runtime.study.spec import parse_study


def test_an_excel_csv_with_a_byte_order_mark_finds_its_label_column(tmp_path):
    rows = ["label,a,b"] + [f"{i % 2},{i},{i * 2 % 7}" for i in range(40)]
    (tmp_path / "x.csv").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(rows).encode())
    m = prepare_dataset(str(tmp_path / "x.csv"), str(tmp_path / "p"), shards=2)
    assert m.label == "label" and m.task == "classification" and m.outputs == 2
    assert [c.name for c in m.columns] == ["a", "b"]


@pytest.mark.parametrize("cmd", [["run", "--local", "job.json"], ["tune", "study.json", "--local"]])
def test_an_out_that_is_a_file_is_named(tmp_path, capsys, monkeypatch, cmd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results.txt").write_text("mine")
    assert main([*cmd, "--out", "results.txt"]) == 2
    assert capsys.readouterr().err.startswith("error: InvalidJob: --out results.txt is a file: name a folder")
    assert (tmp_path / "results.txt").read_text() == "mine"


def test_prepare_refuses_a_folder_with_an_earlier_dataset_and_replace_leaves_no_stale_shard(tmp_path, capsys):
    out = tmp_path / "ds"
    prepare_dataset("sklearn:digits", str(out), shards=16)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(
        InvalidDataset, match=r"holds an earlier dataset \(manifest.json and 24 shards\): pass --replace"
    ):
        prepare_dataset("sklearn:iris", str(out), shards=2)
    assert sorted(p.name for p in out.iterdir()) == before  # nothing touched
    assert main(["data", "prepare", "sklearn:iris", "--out", str(out), "--shards", "2", "--replace"]) == 0
    assert "--replace: removed the earlier dataset" in capsys.readouterr().out
    m = parse_manifest((out / "manifest.json").read_bytes(), "m")
    listed = {sh.key for sh in m.train.shards + m.validation.shards} | {"manifest.json"}
    assert {p.name for p in out.iterdir()} == listed


@pytest.mark.parametrize(
    "section, field, value, message",
    [
        ("constraints", "budget_usd", float("inf"), "constraints.budget_usd: must be a finite number (got Infinity)"),
        ("constraints", "deadline_seconds", float("inf"), "constraints.deadline_seconds: must be a finite number"),
        ("training", "target_value", float("nan"), "training.target_value: must be a finite number (got NaN)"),
        ("training", "local_steps", True, "training.local_steps: expected a whole number, not a boolean (got true)"),
        ("training", "learning_rate", True, "training.learning_rate: expected a number, not a boolean"),
        ("workers", "memory_mb", False, "workers.memory_mb: expected a whole number, not a boolean"),
        ("dataset", "channels", True, "dataset.channels: expected 1 or 3, not a boolean"),
    ],
)
def test_non_finite_numbers_and_booleans_for_numbers_are_refused_naming_the_field(section, field, value, message):
    raw = {"dataset": {"uri": "sklearn:iris"}}
    raw.setdefault(section, {})[field] = value
    with pytest.raises(InvalidJob) as e:
        parse_job(json.dumps(raw))  # JSON text with Infinity / NaN, as a job file holds them
    assert message in str(e.value)


def test_booleans_stay_booleans_and_numbers_in_text_still_read():
    j = parse_job(
        {"dataset": {"uri": "sklearn:iris"}, "constraints": {"best_effort": True}, "training": {"batch_size": "16"}}
    )
    assert j.constraints.best_effort is True and j.training.batch_size == 16


def test_skipped_files_of_an_image_folder_are_named(tmp_path, caplog):
    from PIL import Image

    for cls in ("cat", "dog"):
        (tmp_path / "img" / cls).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((8, 8, 3), i * 40 + (cls == "dog") * 9, np.uint8)).save(
                tmp_path / "img" / cls / f"{i}.png"
            )
    (tmp_path / "img" / "cat" / "notes.txt").write_text("found at the shelter")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        prepare_dataset(str(tmp_path / "img"), str(tmp_path / "p"), shards=1)
    assert "skipped 1 file that is not an image (PNG, JPEG, GIF, WebP, AVIF, BMP or TIFF): cat/notes.txt" in caplog.text


def test_a_study_deadline_no_trial_fits_names_the_least_that_would():
    raw = {
        "job": {"dataset": {"uri": "sklearn:digits"}},
        "space": {"training.learning_rate": {"choices": [0.1]}},
        "trials": 2,
        "budget_usd": 1,
        "deadline_seconds": 25,
    }
    with pytest.raises(InvalidJob, match=r"study.deadline_seconds: 25 s leaves no trial time to run.* at least 40 s"):
        parse_study(raw)
    with pytest.raises(InvalidJob, match=r"study.budget_usd: must be a finite number"):
        parse_study(json.dumps({**raw, "budget_usd": float("inf"), "deadline_seconds": 100}))


def test_a_failed_trials_cause_is_the_runs_named_error_not_step_functions_json():
    lambda_error = json.dumps(
        {"errorType": "UserCodeError", "errorMessage": "building model.name 'p.m:b': your code raised TypeError: x"}
    )
    execution = json.dumps({"status": "FAILED", "Error": "UserCodeError", "Cause": lambda_error, "input": "x" * 900})
    cause = trial_cause({"Error": "States.TaskFailed", "Cause": execution})
    assert cause == "UserCodeError: building model.name 'p.m:b': your code raised TypeError: x"
    assert trial_cause(None) is None
    assert (
        trial_cause({"Error": "States.Timeout", "Cause": "the trial timed out"})
        == "States.Timeout: the trial timed out"
    )


def test_a_failed_executions_cause_is_its_named_error_and_whole_message():
    """The watch's line for a run that failed (smlt/watch.py): the Lambda's errorType and its whole
    errorMessage, not its JSON with the stack trace cut at 300 characters."""
    from smlt.runtime.study.cause import MAX_CAUSE, execution_cause

    reason = "train shard train-00002.safetensors holds inputs that are not finite numbers: " + "x" * 400
    lambda_error = json.dumps({"errorType": "DataError", "errorMessage": reason, "stackTrace": ["  File ..."] * 40})
    assert execution_cause("DataError", lambda_error) == f"DataError: {reason}"
    assert execution_cause("States.Timeout", "the run timed out") == "States.Timeout: the run timed out"
    assert execution_cause(None, None) == "no error recorded"
    # Bounded, but never inside the first line (the reason): frames after it are cut first.
    long_reason = "r" * (MAX_CAUSE + 50)
    cut = execution_cause("UserCodeError", json.dumps({"errorType": "UserCodeError", "errorMessage": long_reason}))
    assert cut == f"UserCodeError: {long_reason}"
    framed = execution_cause("UserCodeError", json.dumps({"errorMessage": "short\n" + "f" * 3000}))
    assert framed.startswith("UserCodeError: short\n") and len(framed) == MAX_CAUSE and framed.endswith("…")
