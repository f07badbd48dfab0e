"""The dashboard in headless Chromium against the local console: the run list, a run's curves
growing while it trains, the stop button ending the run with its best model finalized, a run the
user's code failed with that error shown, and a study's trials with the stopped ones marked."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from smlt.datasets import local_dataset_folder, upload_dataset
from smlt.runtime.store import S3Store
from smlt.runtime.study.items import StudyItem, StudyTable, TrialItem

ROOT = Path(__file__).resolve().parents[2]
# The points of the first trace of the time chart, as plotly.js holds them in the page.
POINTS = "(() => { const el = document.querySelector('#curve-time .js-plotly-plot'); return el && el.data && el.data[0] ? el.data[0].x.length : 0; })()"


def start_run(source, console_info, run_id: str) -> None:
    import boto3

    kw = dict(endpoint_url=console_info.endpoint_url, region_name=console_info.region)
    s3 = boto3.client("s3", **kw)
    uri = upload_dataset(local_dataset_folder("sklearn:digits"), console_info.data_bucket, client=s3)
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job.update(run_id=run_id)
    job["dataset"]["uri"] = uri
    job["training"].update(max_rounds=40, target_value=None)
    job["workers"].update(initial=2, max=2)
    boto3.client("stepfunctions", **kw).start_execution(
        stateMachineArn=console_info.state_machine_arn, name=run_id, input=json.dumps(job)
    )


def points(page) -> int:
    return int(page.evaluate(POINTS))


def wait_for(predicate, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_run_list_live_curves_and_the_stop_button(page, dashboard_url, source, console_info, screenshot):
    start_run(source, console_info, "live-digits")
    page.goto(dashboard_url + "/")
    row = page.locator('#runs-table tr[data-run="live-digits"]')
    row.wait_for()
    assert "RUNNING" in row.inner_text()
    screenshot(page, "runs")

    row.locator("a").click()  # the run's page
    page.wait_for_url("**/run/live-digits")
    first = wait_for(lambda: points(page), 90, "the first round on the chart")
    # the chart grows while the run trains, without a reload
    wait_for(lambda: points(page) >= first + 2, 60, "two more rounds on the chart")
    assert "RUNNING" in page.inner_text("#run-status")
    assert page.locator("#plans-table tbody tr").count() >= 3 and "fixed plan" in page.inner_text("#plans-table")
    # the current round's workers, as they report (a poll may catch a round with one reported yet)
    wait_for(lambda: page.locator("#workers-table tbody tr").count() == 2, 30, "both workers of a round")
    assert "reported" in page.inner_text("#workers-title")
    screenshot(page, "run-live")

    page.fill("#stop-reason", "good enough for the demo")
    page.click("#stop-button")
    page.locator("#stop-result", has_text="stop requested by user: good enough for the demo").wait_for()
    page.locator("#run-status", has_text="SUCCEEDED").wait_for(timeout=90_000)
    assert "stop reason: stopped by user: good enough for the demo" in page.inner_text("#run-status")
    assert page.is_disabled("#stop-button")
    screenshot(page, "run-stopped")

    # the run ended with its best model: finalized, metrics.json says why
    meta = source.run("live-digits").meta()
    assert meta.status == "SUCCEEDED" and meta.final.rounds < 40
    import boto3

    store = S3Store(
        console_info.artifacts_bucket,
        client=boto3.client("s3", endpoint_url=console_info.endpoint_url, region_name=console_info.region),
    )
    metrics = json.loads(store.get("runs/live-digits/final/metrics.json"))
    assert metrics["final"]["stop_reason"] == "stopped by user: good enough for the demo"
    assert metrics["final"]["val_accuracy"] > 0.5
    assert store.get("runs/live-digits/final/model.safetensors")

    page.goto(dashboard_url + "/")
    page.locator('#runs-table tr[data-run="live-digits"]', has_text="SUCCEEDED").wait_for()


USER_NET = """\
from torch import nn


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.width = width
        self.head = nn.Linear(64, width)  # something to train: a model without is refused before its forward

    def forward(self, x):
        return self.project(x)

    def project(self, x):
        raise ValueError(f"project: width {self.width} is not ready")


def build(input_shape, output_dim):
    return Net(output_dim)
"""


def test_a_run_the_users_code_failed_shows_their_error(page, dashboard_url, source, console_info, tmp_path, screenshot):
    """Started on the console as `aws stepfunctions start-execution` would (no client check): a
    worker meets the user's error, records it, the run fails, and the page says so."""
    import boto3

    from smlt.runtime.usercode import package_code, stage_code, with_code

    pkg = tmp_path / "browsernet"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(USER_NET)
    kw = dict(endpoint_url=console_info.endpoint_url, region_name=console_info.region)
    s3 = boto3.client("s3", **kw)
    uri = upload_dataset(local_dataset_folder("sklearn:digits"), console_info.data_bucket, client=s3)
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job.update(run_id="user-fails", model={"name": "browsernet.net:build"})
    job["dataset"]["uri"] = uri
    job["workers"].update(initial=2, max=2)
    job = with_code(job, stage_code(package_code(pkg), console_info.artifacts_bucket, client=s3))
    sfn = boto3.client("stepfunctions", **kw)
    arn = sfn.start_execution(stateMachineArn=console_info.state_machine_arn, name="user-fails", input=json.dumps(job))
    wait_for(lambda: sfn.describe_execution(executionArn=arn["executionArn"])["status"] != "RUNNING", 120, "the end")
    assert sfn.describe_execution(executionArn=arn["executionArn"])["error"] == "UserCodeError"

    page.goto(dashboard_url + "/")
    page.locator('#runs-table tr[data-run="user-fails"]', has_text="FAILED").wait_for()
    page.goto(dashboard_url + "/run/user-fails")
    page.locator("#run-status", has_text="FAILED").wait_for()
    heading = page.locator("#run-failure h3")
    heading.wait_for()
    assert heading.inner_text().startswith("Failed: UserCodeError (ValueError) in round 0, worker ")
    assert page.inner_text("#failure-message") == "your code raised ValueError: project: width 10 is not ready"
    frames = page.locator("#failure-frames li").all_inner_texts()
    assert frames == [
        "browsernet/net.py:11 in forward: return self.project(x)",
        'browsernet/net.py:14 in project: raise ValueError(f"project: width {self.width} is not ready")',
    ]
    assert page.is_disabled("#stop-button")
    screenshot(page, "run-user-error")


def test_a_study_shows_its_trials_with_the_stopped_ones_marked(page, dashboard_url, source, screenshot):
    table = StudyTable(source.stack.table, "digits-asha", client=source.ddb)
    table.put_once(
        "META",
        StudyItem(
            study_id="digits-asha",
            metric="val_accuracy",
            direction="max",
            search="asha",
            trials=4,
            status="RUNNING",
            created_at=time.time(),
            budget_usd=0.5,
            spent_usd=0.0123,
            best_trial=0,
            best_run_id="digits-asha-t0",
            best_metric=0.975,
        ),
    )
    trials = [
        ("SUCCEEDED", 2, 0.975, None),
        ("STOPPED", 1, 0.61, "stopped at rung 1: 0.61 below the top third"),
        ("RUNNING", 2, 0.90, None),
        ("STOPPED", 0, 0.42, "stopped at rung 0: 0.42 below the top third"),
    ]
    for n, (status, rung, metric, why) in enumerate(trials):
        table.put_once(
            f"TRIAL#{n:05d}",
            TrialItem(
                trial=n,
                run_id=f"digits-asha-t{n}",
                params={"learning_rate": 0.01 * (n + 1), "batch_size": 32},
                status=status,
                rung=rung,
                rounds=4,
                metric=metric,
                cost_usd=0.003,
                stop_reason=why,
            ),
        )
    page.goto(dashboard_url + "/")
    page.locator('#studies-table tr[data-study="digits-asha"] a').click()
    page.wait_for_url("**/study/digits-asha")
    page.locator("#trials-table tbody tr").nth(3).wait_for()
    stopped = page.locator("#trials-table tr.trial-stopped")
    assert stopped.count() == 2
    assert [stopped.nth(i).get_attribute("data-trial") for i in range(2)] == ["1", "3"]
    assert "STOPPED ✕" in stopped.nth(0).inner_text() and "rung 1: 0.61 below" in stopped.nth(0).inner_text()
    assert page.locator("#trials-table tr.trial-succeeded").count() == 1
    assert "2 stopped early" in page.inner_text("#study-summary")
    screenshot(page, "study")
    # a trial is a run: its link opens the run's page (and its stop button)
    page.locator('#trials-table tr[data-trial="2"] a').click()
    page.wait_for_url("**/run/digits-asha-t2")


def test_a_stack_it_cannot_read_is_said_on_the_page(page, browser):
    import boto3
    from botocore.config import Config

    from smlt.cloud import Stack
    from smlt.dashboard.app import make_app, serve
    from smlt.dashboard.data import Source

    gone = boto3.client(
        "dynamodb",
        endpoint_url="http://127.0.0.1:9",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1),
    )
    source = Source(stack=Stack("arn:sm", "art", "dat", "runs"), ddb=gone, label="stack Gone on http://127.0.0.1:9")
    server = serve(make_app(source, interval_s=0.5), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page.goto(f"http://127.0.0.1:{server.server_port}/")
        page.locator("#error", has_text="cannot read stack Gone on http://127.0.0.1:9").wait_for()
        assert page.locator("#runs-table tbody tr").count() == 0
    finally:
        server.shutdown()
        server.server_close()
