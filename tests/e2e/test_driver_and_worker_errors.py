"""Issue #38 on the local engine's synthesized state machine: a repeatable worker error is named
and fatal (DataError for a shard, UserCodeError with the user's own frames), one execution drives
a run id (a second one ends RunInProgress, one after the end AlreadyFinished), and a control step
whose process dies is retried (`--faults kill=R`)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import smlt.runner
from smlt.cli import main
from smlt.datasets import local_dataset_folder, stage_dataset, upload_dataset
from smlt.faults import FaultInjector
from smlt.runner import execute
from smlt.runtime import keys
from smlt.runtime.errors import RunFailed
from smlt.runtime.records import RunTable
from smlt.runtime.store import S3Store
from tests.e2e.test_cloud_cli import deployed  # noqa: F401 - the "deployed stack" fixture
from tests.e2e.test_local_run import digits_job, reconciled, run


def _bad_labels_dataset(tmp_path: Path, shard: int = 2) -> Path:
    """Digits with train shard `shard` holding labels outside the 10 classes, its manifest entry
    rewritten to match (sha256 and size): the shard is intact as stored, its content is wrong."""
    src = local_dataset_folder("sklearn:digits", None)
    assert src is not None
    folder = tmp_path / "digits-bad-labels"
    shutil.copytree(src, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    info = manifest["train"]["shards"][shard]
    path = folder / info["key"]
    arrays = load_file(str(path))
    arrays["y"] = np.full_like(arrays["y"], 12)
    save_file(arrays, str(path))
    data = path.read_bytes()
    info.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _started(local, job: dict, run_id: str, name: str) -> str:
    engine, names = local
    return engine.start_execution({**job, "run_id": run_id}, name=name)


def test_a_shard_with_labels_outside_the_classes_ends_the_run_with_a_data_error(local, tmp_path):
    engine, names = local
    folder = _bad_labels_dataset(tmp_path)
    job = digits_job(max_rounds=6, target_value=None)
    job["dataset"] = {"uri": upload_dataset(folder, names.data_bucket, client=engine.client("s3"))}
    with pytest.raises(RunFailed) as failed:
        execute(engine, names, "bad-labels", job, tmp_path / "out")
    e = failed.value
    assert e.error == "DataError", (e.error, e.cause)
    # The shard, the exception and both workers are named.
    assert "train shard train-00002.safetensors failed twice with IndexError" in e.cause, e.cause
    assert "out of bounds" in e.cause and "labels are outside" in e.cause, e.cause
    table = RunTable(names.table, "bad-labels", client=engine.client("dynamodb"))
    recorded = [i for i in table.query("ERROR#")]
    workers = {(i["round"], i["worker"]) for i in recorded}
    assert len(workers) == 2 and len({w for _, w in workers}) == 2, recorded  # two rounds, two workers
    assert table.meta().status == "RUNNING"  # never SUCCEEDED: no model published
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    assert not art.exists(keys.final_model_key("bad-labels"))


BAD_MODEL = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, input_shape, output_dim):
        super().__init__()
        self.fc = nn.Linear(input_shape[0], output_dim)

    def forward(self, x):
        return self.scale(self.fc(x))

    def scale(self, y):
        raise ValueError(f"scale is not ready for a batch of {len(y)}")


def build(input_shape, output_dim):
    return Net(input_shape, output_dim)
"""


def test_the_users_code_raising_is_a_user_code_error_with_their_frames(local, tmp_path, monkeypatch, capsys):
    engine, names = local
    pkg = tmp_path / "src" / "smlt_e2e_badmodel"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(BAD_MODEL)
    job = digits_job(max_rounds=3, target_value=None)
    job.update(run_id="user-raises", model={"name": "smlt_e2e_badmodel.net:build", "params": {}})
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(job))
    monkeypatch.setattr(smlt.runner, "start_engine", lambda faults: (engine, names, None))
    monkeypatch.setattr(engine, "stop", lambda: None)
    # The CLI's own check (smlt.precheck, tests/unit/test_precheck.py) refuses this model before the
    # engine starts; here it is off, for what the workers do with a job that arrives without it
    # (`aws stepfunctions start-execution`, the console).
    monkeypatch.setattr("smlt.precheck.check_job_file", lambda *a, **k: None)
    rc = main(["run", "--local", str(job_path), "--out", str(tmp_path / "out"), "--code", str(pkg)])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "run user-raises FAILED: UserCodeError" in err, err
    assert "your code raised ValueError: scale is not ready for a batch of" in err, err
    # The last frames inside the user's package, with their lines, and nothing of smlt's or torch's.
    assert 'File "smlt_e2e_badmodel/net.py", line 14, in scale' in err, err
    assert 'File "smlt_e2e_badmodel/net.py", line 11, in forward' in err, err
    assert "site-packages" not in err and "smlt/runtime" not in err, err
    # What to do, said once (the cause's own words; the CLI adds no second line).
    assert err.count("start the run again") == 1 and "a resume would run the same code" in err, err
    # Round 0 stopped at the error: no quorum retry, nothing aggregated.
    table = RunTable(names.table, "user-raises", client=engine.client("dynamodb"))
    assert table.plan(0).attempts == 0 and table.rounds() == []


def test_a_second_execution_of_a_run_id_ends_run_in_progress_and_trains_nothing(local, tmp_path):
    engine, names = local
    job = digits_job(max_rounds=3, target_value=None)
    job["dataset"] = {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))}
    first = _started(local, job, "one-driver", "one-driver-a")
    second = _started(local, job, "one-driver", "one-driver-b")
    ends = {arn: engine.wait(arn, interval=0.2, timeout=300) for arn in (first, second)}
    statuses = sorted((d["status"], d.get("error", "")) for d in ends.values())
    assert statuses == [("FAILED", "RunInProgress"), ("SUCCEEDED", "")], statuses
    loser = next(arn for arn, d in ends.items() if d["status"] == "FAILED")
    assert "one driver per run" in ends[loser]["cause"]
    # The refused execution entered Plan only (after the start's routing): no Map, no aggregation, no Finalize.
    entered = {e["stateEnteredEventDetails"]["name"] for e in engine.history(loser) if "stateEnteredEventDetails" in e}
    assert entered == {"Start", "HowToStart", "Plan"}, entered
    # The run's cost is one run's: each round trained once, by one set of workers.
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    metrics = json.loads(art.get(keys.final_metrics_key("one-driver")))
    assert metrics["final"]["rounds"] == 3 and reconciled(local, "one-driver") == []
    single = digits_job(max_rounds=3, target_value=None)
    single["dataset"] = job["dataset"]
    alone = engine.wait(_started(local, single, "one-driver-alone", "one-driver-alone"), interval=0.2, timeout=300)
    assert alone["status"] == "SUCCEEDED"
    solo = json.loads(art.get(keys.final_metrics_key("one-driver-alone")))
    # At most the refused execution's one Plan (its check) more than the same run alone.
    billed, alone_billed = metrics["final"]["billed_invocations"], solo["final"]["billed_invocations"]
    assert alone_billed <= billed <= alone_billed + 1, (billed, alone_billed)
    # After the end, another execution of the run id is refused as finished, and changes nothing.
    late = engine.wait(_started(local, job, "one-driver", "one-driver-c"), interval=0.2, timeout=120)
    assert late["status"] == "FAILED" and late["error"] == "AlreadyFinished", late
    assert json.loads(art.get(keys.final_metrics_key("one-driver"))) == metrics


def test_control_steps_whose_process_dies_are_retried_to_the_same_model(local, tmp_path):
    engine, names = local
    job = digits_job(max_rounds=3, target_value=None)
    assert run(local, job, tmp_path / "clean", "kill-clean") == 0
    injector = FaultInjector.from_spec("kill=0.3,seed=3", functions=names.train_functions)
    assert run(local, job, tmp_path / "killed", "kill-faulty", injector) == 0
    assert injector.counts["kill"] >= 2, injector.counts
    died = [c for c in engine.invocations if c[2] == "Runtime.ExitError"]
    assert len(died) >= injector.counts["kill"]
    clean = json.loads((tmp_path / "clean" / "metrics.json").read_text())
    faulty = json.loads((tmp_path / "killed" / "metrics.json").read_text())
    # Every round once, every update applied once, the whole split trained.
    final = faulty["final"]
    assert final["rounds"] == 3 and final["trained_fraction"] == 1.0 and final["val_accuracy"] > 0.9, final
    assert reconciled(local, "kill-faulty") == []
    # A killed step's handler ran and wrote its ATTEMPT item before the process died: the bill has
    # it beside its retry (issue #38: no attempt of a round is lost from the bill).
    assert final["billed_invocations"] >= clean["final"]["billed_invocations"] + injector.counts["kill"], (
        final["billed_invocations"],
        clean["final"]["billed_invocations"],
        injector.counts,
    )
    # The same model as without the deaths when the workers' rounds were the same (a slow
    # replacement process can make a worker miss its round on a busy machine: another model).
    same_rounds = [(r["samples"], r["accepted"]) for r in clean["rounds"]] == [
        (r["samples"], r["accepted"]) for r in faulty["rounds"]
    ]
    if same_rounds:  # the weights (the files differ: each model card names its run)
        from safetensors.numpy import load_file

        a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("clean", "killed"))
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_deployed_refuses_a_second_driver_and_status_names_the_worker_error(deployed, tmp_path, capsys):  # noqa: F811
    import time

    from smlt import cloud
    from smlt.cli.console import console
    from smlt.runtime.errors import RunInProgress

    engine, stack = deployed
    folder = _bad_labels_dataset(tmp_path)
    job = digits_job(max_rounds=6, target_value=None)
    job.update(run_id="cli-bad-labels")
    job["dataset"] = {"uri": upload_dataset(folder, stack.data_bucket, client=engine.client("s3"))}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    cloud.start(path, stack)
    table = RunTable(stack.table, "cli-bad-labels", client=engine.client("dynamodb"))
    deadline = time.time() + 60
    while table.meta() is None and time.time() < deadline:
        time.sleep(0.2)
    # While it runs: neither a resume nor a second start begins another driver.
    with pytest.raises(RunInProgress, match="still running"):
        cloud.resume("cli-bad-labels", stack)
    with pytest.raises(RunInProgress, match="still running"):
        cloud.start(path, stack)
    sfn = engine.client("stepfunctions")
    runs = [
        e
        for e in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
        if e["name"].startswith("cli-bad-labels")
    ]
    assert len(runs) == 1
    assert engine.wait(runs[0]["executionArn"], interval=0.2, timeout=300)["error"] == "DataError"
    capsys.readouterr()
    with console():
        cloud.status("cli-bad-labels", stack)
    out = capsys.readouterr().out
    assert "run cli-bad-labels: FAILED: DataError" in out, out
    assert "WorkerError on train shard train-00002.safetensors: IndexError" in out, out
    # a DataError is fixed and started again (errors.START_AGAIN), never resumed: the same shard fails again
    assert "a resume would fail the same way" in out and "smlt resume cli-bad-labels" not in out, out


def test_a_run_that_never_trained_a_shard_fails_unless_the_job_allows_it(local, tmp_path):
    engine, names = local
    folder = _bad_labels_dataset(tmp_path)
    uri = upload_dataset(folder, names.data_bucket, client=engine.client("s3"))
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    # One round: the worker holding the bad shard fails once (not twice: no DataError), the round
    # keeps its quorum, and its shards are never trained.
    job = digits_job(max_rounds=1, target_value=None)
    job["dataset"] = {"uri": uri}
    with pytest.raises(RunFailed) as failed:
        execute(engine, names, "partial", job, tmp_path / "partial")
    assert failed.value.error == "PartialData", failed.value.cause
    assert "trained" in failed.value.cause and "train-00002.safetensors" in failed.value.cause
    assert "training.allow_partial_data" in failed.value.cause
    final = json.loads(art.get(keys.final_metrics_key("partial")))["final"]
    assert 0.5 < final["trained_fraction"] < 1.0 and 2 in final["untrained_shards"], final
    assert RunTable(names.table, "partial", client=engine.client("dynamodb")).meta().status == "RUNNING"

    job["training"]["allow_partial_data"] = True
    metrics = execute(engine, names, "partial-allowed", job, tmp_path / "allowed")
    final = metrics["final"]
    assert final["trained_fraction"] < 1.0 and 2 in final["untrained_shards"]
    assert "allowed by training.allow_partial_data" in final["stop_reason"]


HANGS_LATER = """import time

from torch import nn

STEPS = 0


class Net(nn.Module):
    def __init__(self, input_shape, output_dim):
        super().__init__()
        self.fc = nn.Linear(input_shape[0], output_dim)

    def forward(self, x):
        global STEPS
        STEPS += self.training
        if STEPS > 12:
            time.sleep(3600)  # a read that waits forever, after some calls
        return self.fc(x)


def build(input_shape, output_dim):
    return Net(input_shape, output_dim)
"""


def test_a_forward_that_hangs_mid_run_is_stopped_and_ends_the_run_with_a_user_code_error(
    local, tmp_path, monkeypatch, capsys
):
    """A forward that hangs after some calls, past the client's check: the worker's watchdog stops
    the step at 20x the job's slowest measured step (at least 10 s), names the line, and the run
    ends with UserCodeError. Before, the Map gave up on the worker, the run went on and published
    its model (exit 0, `workers 1/2`, the hung worker never named), the hung Lambda billed until its
    900 s timeout."""
    engine, names = local
    pkg = tmp_path / "src" / "smlt_e2e_hang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(HANGS_LATER)
    job = digits_job(max_rounds=40, target_value=None, local_steps=10)  # a process's 13th step hangs: round 1
    job.update(run_id="user-hangs", model={"name": "smlt_e2e_hang.net:build", "params": {}})
    job["workers"].update(initial=2, max=2)
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(job))
    monkeypatch.setattr(smlt.runner, "start_engine", lambda faults: (engine, names, None))
    monkeypatch.setattr(engine, "stop", lambda: None)
    monkeypatch.setattr("smlt.precheck.check_job_file", lambda *a, **k: None)  # it would pass: 12 steps are fine
    rc = main(["run", "--local", str(job_path), "--out", str(tmp_path / "out"), "--code", str(pkg)])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "run user-hangs FAILED: UserCodeError" in err, err
    assert "your code hung: a training step's transform, forward and backward of model.name" in err, err
    assert "20x the slowest training step this job measured" in err, err
    assert 'File "smlt_e2e_hang/net.py", line 17, in forward\n    time.sleep(3600)' in err, err
    assert err.count("start the run again") == 1, err
    meta = RunTable(names.table, "user-hangs", client=engine.client("dynamodb")).meta()
    assert meta is not None and meta.status == "RUNNING"  # never SUCCEEDED: no model published
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    assert not art.exists(keys.final_model_key("user-hangs"))
