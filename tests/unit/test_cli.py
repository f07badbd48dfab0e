"""The CLI rejects bad input before starting anything, naming the problem."""

import json

import pytest

from smlt.cli import main


@pytest.mark.parametrize(
    "text, needle",
    [
        ("{not json", "job.json is not valid JSON"),
        (json.dumps({"dataset": {"uri": "sklearn:digits"}, "training": {"batch_size": "x"}}), "training.batch_size"),
        (json.dumps({"model": {"name": "mlp"}}), "dataset: field required"),
    ],
)
def test_run_rejects_bad_jobs(tmp_path, capsys, text, needle):
    job = tmp_path / "job.json"
    job.write_text(text)
    assert main(["run", "--local", str(job), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "InvalidJob" in err and needle in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name, text, needle",
    [
        (
            "job.json",
            '{"name": "x",\n "seed": 1,\n}',
            "job.json is not valid JSON (Expecting property name enclosed in "
            "double quotes at line 3 column 1): a comma before a closing bracket",
        ),
        ("job.json", '{"name": "x", // mine\n "seed": 1}', "at line 1 column 15): JSON has no comments: remove them"),
        ("job.json", "{'name': 'x'}", "JSON names and text take double quotes"),
        (
            "job.yaml",
            "name: x\ndataset:\n  uri: sklearn:digits\n",
            "job.yaml is not valid JSON (Expecting value at "
            "line 1 column 1): smlt reads a job as JSON, not YAML: write it as a .json file",
        ),
    ],
)
def test_a_job_file_that_is_not_json_is_named_with_the_likely_mistake(tmp_path, capsys, name, text, needle):
    job = tmp_path / name
    job.write_text(text)
    assert main(["quote", str(job)]) == 2
    err = capsys.readouterr().err
    assert "InvalidJob" in err and needle in err and "Traceback" not in err


def test_missing_job_file(tmp_path, capsys):
    assert main(["run", "--local", str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_bad_faults_spec(tmp_path, capsys):
    from smlt.faults import parse_faults

    with pytest.raises(ValueError, match="explode"):
        parse_faults("explode=0.1")
    with pytest.raises(ValueError, match="between 0 and 1"):
        parse_faults("fail=2")
    assert parse_faults("fail=0.2, duplicate=0.05") == {"fail": 0.2, "duplicate": 0.05}
    assert parse_faults("kill=0.3,store_outage=5") == {"kill": 0.3, "store_outage": 5.0}
    with pytest.raises(ValueError, match="store_outage must be between"):
        parse_faults("store_outage=0")


def test_kill_applies_to_control_steps_only():
    from smlt.faults import FaultInjector, is_control_step

    assert is_control_step({"op": "plan", "job": {}}) and is_control_step({"op": "finalize", "run_id": "r"})
    assert is_control_step({"op": "prepare_data", "trigger": {}, "execution": "e"})  # PrepareData too
    assert is_control_step({"run_id": "r", "round": 0, "outcomes": []})  # Aggregate sends no op
    assert not is_control_step({"run_id": "r", "round": 0, "worker": 1})
    assert is_control_step({"op": "chain", "run_id": "r"})  # Chain is retried when it dies too
    injector = FaultInjector({"kill": 1.0}, functions={"train"}, seed=1)
    assert injector("planner", {"op": "plan"}) == "kill"
    assert injector("train", {"run_id": "r", "round": 0, "worker": 0}) == "ok"
    assert injector.counts["kill"] == 1


def test_data_prepare_reports_bad_source(tmp_path, capsys):
    assert main(["data", "prepare", "sklearn:nope", "--out", str(tmp_path)]) == 2
    assert "InvalidDataset" in capsys.readouterr().err


def test_console_prints_the_librarys_progress_and_quiet_drops_the_per_round_lines(capsys):
    from smlt.cli.console import console
    from smlt.runtime.progress import notice, progress

    progress.info("round   0 | ...")
    notice.info("prepared")
    assert capsys.readouterr().out == ""  # the library alone prints nothing
    with console():
        progress.info("round   0 | ...")
        notice.info("started run r")
    assert capsys.readouterr().out == "round   0 | ...\nstarted run r\n"
    with console(quiet=True):
        progress.info("round   1 | ...")
        notice.info("started run r")
    assert capsys.readouterr().out == "started run r\n"


def test_exit_codes_of_named_errors(tmp_path, capsys, monkeypatch):
    import smlt.cloud
    import smlt.runner
    from smlt.runtime.errors import RunFailed, StackNotFound

    def missing(name, cfn=None):
        raise StackNotFound(f"stack {name!r} not found (x)")

    monkeypatch.setattr(smlt.cloud.Stack, "lookup", staticmethod(missing))
    assert main(["status", "r", "--stack", "Nope"]) == 1
    assert capsys.readouterr().err == "error: stack 'Nope' not found (x)\n"

    def failed(job_path, out, faults=None, code=None, replace=False):
        raise RunFailed("r1", "FAILED", "InvalidDataset", "no shards")

    import smlt.precheck

    monkeypatch.setattr(smlt.precheck, "check_job_file", lambda path, code=None, s3=False: None)
    monkeypatch.setattr(smlt.runner, "run_local", failed)
    job = tmp_path / "job.json"
    job.write_text("{}")
    assert main(["run", "--local", str(job)]) == 1
    assert capsys.readouterr().err == (
        "run r1 FAILED: InvalidDataset\n  cause: no shards\n"
        "  a resume would fail the same way: fix the cause and start the run again\n"
    )

    def diverged(job_path, out, faults=None, code=None, replace=False):
        raise RunFailed("r1", "FAILED", "Diverged", "round 1: NaN/Inf loss again after halving the learning rate")

    monkeypatch.setattr(smlt.runner, "run_local", diverged)  # a resume meets the halved rate and diverges again
    assert main(["run", "--local", str(job)]) == 1
    assert capsys.readouterr().err.endswith("a resume would fail the same way: fix the cause and start the run again\n")

    def died(job_path, out, faults=None, code=None, replace=False):
        raise RunFailed("r1", "FAILED", "Runtime.ExitError", "Runtime exited with error: signal: 9")

    monkeypatch.setattr(smlt.runner, "run_local", died)
    assert main(["run", "--local", str(job), "--out", "my out"]) == 1
    err = capsys.readouterr().err
    assert err.endswith("continue it from its last complete round with: smlt resume r1 --local --out 'my out'\n"), err
