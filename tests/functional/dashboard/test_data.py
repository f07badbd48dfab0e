"""The dashboard's data access (smlt/dashboard/data.py) on moto: a stack found by its outputs,
runs and studies listed, a run's view, the stop request."""

import json

import boto3
import pytest
from moto import mock_aws

from smlt.dashboard import data
from smlt.runtime import keys
from smlt.runtime.errors import InvalidJob, RunNotFound
from smlt.runtime.items import MetaItem, PlanItem, RoundItem, WorkerItem
from smlt.runtime.job import Job
from smlt.runtime.records import RunTable, create_run_table
from smlt.runtime.study.items import StudyItem, StudyTable, TrialItem

OUTPUTS = {
    "StateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:sm",
    "ArtifactsBucketName": "art",
    "DataBucketName": "dat",
    "TableName": "runs",
}


@pytest.fixture
def source(monkeypatch):
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        create_run_table(boto3.client("dynamodb"), "runs")
        template = {
            "Resources": {"Q": {"Type": "AWS::SQS::Queue"}},
            "Outputs": {k: {"Value": v} for k, v in OUTPUTS.items()},
        }
        boto3.client("cloudformation").create_stack(StackName="Smlt", TemplateBody=json.dumps(template))
        yield data.Source.open("Smlt")


def job(name="digits", budget=0.5):
    return Job.model_validate(
        {
            "name": name,
            "dataset": {"uri": "s3://dat/datasets/digits/"},
            "model": {"name": "mlp"},
            "training": {"max_rounds": 10},
            "constraints": {"budget_usd": budget},
        }
    )


def add_run(source, run_id, created_at, rounds, status="RUNNING", workers=2):
    table = source.run(run_id)
    meta = MetaItem(
        run_id=run_id,
        execution=run_id,
        job=job(),
        status=status,
        created_at=created_at,
        train_rows=1000,
        train_shards=4,
        val_rows=200,
        features=64,
        outputs=10,
        task="classification",
    )
    table.put_once(keys.META, meta)
    for r in range(rounds + 1):  # round `rounds` is planned, not aggregated yet
        table.put_once(
            keys.plan_sk(r),
            PlanItem(
                run_id=run_id,
                round=r,
                action="train",
                reason=f"plan {r} because",
                planned_at=created_at + r,
                execution=run_id,
                workers=workers,
                memory_mb=1769,
                local_steps=10,
            ),
        )
        for w in range(workers):
            table.put_once(keys.worker_sk(r, w), WorkerItem(worker=w, samples=100 + r, memory_mb=1769, steps=10))
        if r < rounds:
            table.put_once(
                keys.round_sk(r),
                RoundItem(
                    round=r,
                    workers=workers,
                    memory_mb=1769,
                    local_steps=10,
                    batch_size=32,
                    train_loss=2.0 - r / 10,
                    val_loss=2.1 - r / 10,
                    val_accuracy=0.5 + r / 10,
                    cost_usd=0.001,
                    cost_total_usd=0.001 * (r + 1),
                    finished_at=created_at + 10 * (r + 1),
                ),
            )
    return table


def test_runs_are_listed_newest_first_with_their_ledger_and_metric(source):
    add_run(source, "old", created_at=1000.0, rounds=1, status="SUCCEEDED")
    add_run(source, "new", created_at=2000.0, rounds=3)
    rows = data.list_runs(source)
    assert [r.run_id for r in rows] == ["new", "old"]
    new = rows[0]
    assert new.status == "RUNNING" and new.rounds == 3 and new.cost_usd == pytest.approx(0.003)
    assert new.metric == "val_accuracy" and new.value == pytest.approx(0.7) and new.budget_usd == 0.5
    assert source.label == "stack Smlt on AWS us-east-1"


def test_a_run_view_has_curves_plans_and_the_current_workers(source):
    add_run(source, "r1", created_at=1000.0, rounds=3, workers=3)
    view = data.run_view(source, "r1")
    assert view is not None and view.status == "RUNNING"
    curve = view.curve()
    assert [p.round for p in curve] == [0, 1, 2]
    assert [p.elapsed_s for p in curve] == [10.0, 20.0, 30.0]
    assert [p.cost_usd for p in curve] == pytest.approx([0.001, 0.002, 0.003])
    assert [p.metric for p in curve] == pytest.approx([0.5, 0.6, 0.7])
    assert view.spent_usd == pytest.approx(0.003) and view.budget_usd == 0.5
    assert [p.reason for p in view.plans][-1] == "plan 3 because"
    # the workers of the round in flight (3), not of earlier rounds
    assert view.workers_round == 3 and [w.samples for w in view.workers] == [103, 103, 103]
    # a round just planned has no records yet: the newest round that has them
    source.run("r1").put_once(
        keys.plan_sk(4),
        PlanItem(run_id="r1", round=4, action="train", reason="next", planned_at=1.0, execution="r1", workers=3),
    )
    view = data.run_view(source, "r1")
    assert view.workers_round == 3 and len(view.workers) == 3 and view.plans[-1].round == 4
    assert data.run_view(source, "nope") is None


def test_the_stop_request_is_stored_once_and_refused_for_a_finished_run(source):
    add_run(source, "live", created_at=1000.0, rounds=2)
    add_run(source, "done", created_at=1000.0, rounds=2, status="SUCCEEDED")
    item = data.request_stop(source.run("live"), "not promising")
    assert (item.by, item.reason) == ("user", "not promising")
    assert data.request_stop(source.run("live"), "again").reason == "not promising"  # the first stands
    assert RunTable("runs", "live", client=source.ddb).get(keys.STOP, type(item)).reason == "not promising"
    assert data.run_view(source, "live").status == "STOPPING"
    assert {r.run_id: r.status for r in data.list_runs(source)}["live"] == "STOPPING"
    with pytest.raises(InvalidJob, match="has finished"):
        data.request_stop(source.run("done"), "late")
    with pytest.raises(RunNotFound, match="no run 'ghost'"):
        data.request_stop(source.run("ghost"), "x")


def test_studies_and_their_trials(source):
    table = StudyTable("runs", "s1", client=source.ddb)
    table.put_once(
        "META",
        StudyItem(
            study_id="s1",
            metric="val_accuracy",
            direction="max",
            search="asha",
            trials=3,
            status="RUNNING",
            created_at=1.0,
            budget_usd=1.0,
        ),
    )
    for n, status in enumerate(["SUCCEEDED", "STOPPED", "RUNNING"]):
        table.put_once(
            f"TRIAL#{n:05d}",
            TrialItem(
                trial=n,
                run_id=f"s1-t{n}",
                params={"lr": 0.1 * (n + 1)},
                status=status,
                stop_reason="rung 1" if status == "STOPPED" else None,
            ),
        )
    assert [s.study_id for s in data.studies(source)] == ["s1"]
    study, trials = data.study_view(source, "s1")
    assert study.search == "asha" and [t.status for t in trials] == ["SUCCEEDED", "STOPPED", "RUNNING"]
    assert data.study_view(source, "none") is None
    assert [r.run_id for r in data.list_runs(source)] == []  # a study's items are not runs


USER_NET = """\
def helper(width):
    raise ValueError(f"width {width} is not a power of two")

def build(input_shape, output_dim):
    return helper(input_shape[0] + 1)
"""


def test_a_run_the_users_code_failed_shows_its_error_in_the_view_and_on_the_page(source, tmp_path, monkeypatch):
    from smlt.dashboard.app import make_app
    from smlt.runtime.steps.events import TrainEvent
    from smlt.runtime.steps.train import _record_user_error
    from smlt.runtime.usercode import user_code_failure

    pkg = tmp_path / "dashnets"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(USER_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    from dashnets.net import build

    add_run(source, "bad", created_at=3000.0, rounds=0)
    user_job = job().model_copy(update={"model": job().model.model_copy(update={"name": "dashnets.net:build"})})
    try:
        build((64,), 10)
    except ValueError as e:  # what the worker records (smlt.runtime.steps.train.run_worker)
        error = user_code_failure(e, user_job)
    assert error is not None
    _record_user_error(source.run("bad"), TrainEvent(run_id="bad", round=0, worker=1), error)

    view = data.run_view(source, "bad")
    assert view.status == "FAILED" and {r.run_id: r.status for r in data.list_runs(source)}["bad"] == "FAILED"
    f = view.failure
    assert (f.error, f.exception, f.round, f.worker) == ("UserCodeError", "ValueError", 0, 1)
    assert f.message == "your code raised ValueError: width 65 is not a power of two"
    assert f.frames == [
        "dashnets/net.py:5 in build: return helper(input_shape[0] + 1)",
        'dashnets/net.py:2 in helper: raise ValueError(f"width {width} is not a power of two")',
    ]
    assert f.text == str(error)  # what the CLI and `smlt status` print
    add_run(source, "fine", created_at=1000.0, rounds=1)
    assert data.run_view(source, "fine").failure is None

    # the page's data endpoint (Dash's callback request, as the browser sends it every poll)
    app = make_app(source)
    client = app.server.test_client()
    client.get("/")
    (output,) = [k for k in app.callback_map if "run-failure.children" in k]
    outputs = output.strip(".").split("...")
    body = {
        "output": output,
        "outputs": [{"id": o.split(".")[0], "property": o.split(".")[1]} for o in outputs],
        "inputs": [
            {"id": "tick", "property": "n_intervals", "value": 1},
            {"id": "run-id", "property": "data", "value": "bad"},
        ],
        "changedPropIds": ["tick.n_intervals"],
        "state": [],
    }
    resp = client.post("/_dash-update-component", json=body)
    assert resp.status_code == 200
    got = resp.get_json()["response"]
    assert got["run-status"]["children"].startswith("FAILED | job digits")
    assert got["stop-button"]["disabled"] is True

    def texts(node):  # every string in the components' tree, in order
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [t for n in node for t in texts(n)]
        if isinstance(node, dict):
            return texts(node.get("props", {}).get("children", []))
        return []

    shown = texts(got["run-failure"]["children"])
    assert shown[:2] == ["Failed: UserCodeError (ValueError) in round 0, worker 1", f.message]
    assert shown[2:4] == f.frames
