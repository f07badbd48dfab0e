"""`smlt quote JOB`: the planner's first-plan forecast with a range, the limits that would work,
and the same job on one VM, with no AWS and no engine (the dataset is prepared locally)."""

import json

import pytest

from smlt.cli import main
from smlt.cli.quote import VmInstance, VmOption, VmPrices, _history, _verdict, quote, vm_options
from smlt.datasets import checked_dataset_folder
from smlt.runtime.job import parse_job

pytestmark = pytest.mark.unit

JOB = {
    "name": "digits-cnn-quote",
    "dataset": {"uri": "sklearn:digits?shape=1x8x8"},
    "model": {"name": "lenet"},
    "training": {
        "optimizer": "sgd",
        "learning_rate": 0.05,
        "momentum": 0.9,
        "batch_size": 32,
        "local_steps": 20,
        "max_rounds": 60,
        "target_metric": "val_accuracy",
        "target_value": 0.97,
    },
    "constraints": {"deadline_seconds": 900, "budget_usd": 0.05},
    "workers": {"initial": 4, "min": 1, "max": 8, "planner": "adaptive"},
}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SMLT_HOME", str(tmp_path_factory.mktemp("home")))
    yield
    mp.undo()


def _job(**constraints):
    raw = json.loads(json.dumps(JOB))
    raw["constraints"].update(constraints)
    return parse_job(json.dumps(raw))


def _quote(job):
    return quote(job, _history(job, checked_dataset_folder(job)))


def test_a_roomy_job_is_feasible_with_an_ordered_range_and_the_limits_that_work(home):
    q = _quote(_job())
    assert q.feasible and q.plan
    assert q.rounds and q.seconds and q.cost_usd
    lo, mid, hi = q.seconds
    assert 0 < lo <= mid <= hi < 900
    assert q.cost_usd[0] <= q.cost_usd[1] <= q.cost_usd[2] < 0.05
    # the limits that would work are below the ones set, and consistent with the forecast
    assert q.earliest_deadline_s is not None and 0 < q.earliest_deadline_s <= 900
    assert q.min_budget_usd is not None and 0 < q.min_budget_usd <= 0.05
    # every instance in cdk.json, on-demand and spot where it has a spot price
    names = {(v.instance, v.pricing) for v in q.vm}
    assert ("c7i.2xlarge", "on-demand") in names and ("c7i.2xlarge", "spot") in names
    assert ("ml.c5.2xlarge", "on-demand") in names
    assert q.verdict


def test_a_deadline_below_the_earliest_is_refused_with_the_deadline_to_set(home):
    roomy = _quote(_job())
    assert roomy.earliest_deadline_s is not None
    q = _quote(_job(deadline_seconds=roomy.earliest_deadline_s / 10))
    assert not q.feasible
    assert "constraints.deadline_seconds" in q.reason
    assert q.earliest_deadline_s is not None and q.earliest_deadline_s > roomy.earliest_deadline_s / 10


def test_vm_time_and_cost_grow_with_the_steps_and_spot_is_cheaper():
    job = _job()
    from smlt.runtime.planner.types import RunHistory

    h = RunHistory(param_count=60_000, flops_per_sample=2e7, train_rows=1000, val_rows=300)
    vm = VmPrices(
        instances=[
            VmInstance(name="c7i.2xlarge", service="ec2", vcpus=8, memory_gib=16, on_demand_hour=0.357, spot_hour=0.1)
        ]
    )
    short = {v.pricing: v for v in vm_options(job, h, 10, vm)}
    long = {v.pricing: v for v in vm_options(job, h, 1_000_000, vm)}
    assert long["on-demand"].seconds > short["on-demand"].seconds
    assert long["on-demand"].cost_usd > short["on-demand"].cost_usd
    assert long["spot"].cost_usd < long["on-demand"].cost_usd
    # a short job pays the VM's minimum billing
    assert short["on-demand"].cost_usd == pytest.approx(60 / 3600 * 0.357, rel=0.05)
    assert not long["on-demand"].meets_deadline  # a million steps do not fit 900 s


def test_the_verdict_names_the_cheaper_side():
    vm = VmOption(
        instance="c7i.2xlarge", service="ec2", pricing="spot", seconds=120, cost_usd=0.004, meets_deadline=True
    )
    assert _verdict(0.001, 30, [vm]).startswith("cheaper on Lambda")
    dear = _verdict(0.04, 300, [vm])
    assert dear.startswith("a c7i.2xlarge") and "$0.0040" in dear
    late = vm.model_copy(update={"meets_deadline": False})
    assert "no single VM" in _verdict(0.04, 300, [late])


def test_the_vm_prices_in_cdk_json_carry_their_sources():
    vm = VmPrices.deployed()
    assert vm.instances and "aws.amazon.com" in vm.note
    assert {i.service for i in vm.instances} == {"ec2", "sagemaker"}


def test_the_command_prints_the_quote_and_json(home, tmp_path, capsys):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(JOB))
    assert main(["quote", str(path)]) == 0
    out = capsys.readouterr().out
    assert "feasible:" in out and "p10-p90" in out and "c7i.2xlarge" in out and "verdict:" in out
    assert main(["quote", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["feasible"] is True and len(data["seconds"]) == 3


def test_an_s3_dataset_is_a_named_error_not_a_call_to_aws(tmp_path, capsys):
    raw = dict(JOB, dataset={"uri": "s3://some-bucket/datasets/digits/"})
    path = tmp_path / "job.json"
    path.write_text(json.dumps(raw))
    assert main(["quote", str(path)]) == 2
    err = capsys.readouterr().err
    assert "dataset.uri" in err and "smlt quote reads no AWS" in err


def _forecast(job, tiers=(1769, 3008)):
    from smlt.runtime.planner.quote import first_forecast
    from smlt.runtime.planner.types import RunHistory
    from smlt.runtime.prices import Prices

    h = RunHistory(param_count=60_000, flops_per_sample=2e6, train_rows=1437, val_rows=360, dataset_bytes=500_000)
    return first_forecast(job, h, list(tiers), Prices())


def test_a_job_without_limits_still_gets_the_earliest_deadline_and_smallest_budget():
    raw = json.loads(json.dumps(JOB))
    raw["constraints"] = {}
    f = _forecast(parse_job(json.dumps(raw)))
    assert f.outlook is not None
    assert f.earliest_deadline_s is not None and 0 < f.earliest_deadline_s < 1e6
    assert f.min_budget_usd is not None and 0 < f.min_budget_usd < 1e3
    # the same numbers as with limits that never bind: the fastest plan's time, the cheapest's cost
    roomy = _forecast(_job(deadline_seconds=1e7, budget_usd=1e5))
    assert f.earliest_deadline_s == pytest.approx(roomy.earliest_deadline_s)
    assert f.min_budget_usd == pytest.approx(roomy.min_budget_usd)


def test_a_fixed_plans_limits_are_its_own_plans_and_a_late_one_is_warned():
    from smlt.cli.quote import _fixed_plan_warning

    raw = json.loads(json.dumps(JOB))
    raw["workers"]["planner"] = "fixed"
    fixed = parse_job(json.dumps(raw))
    f = _forecast(fixed)
    adaptive = _forecast(_job())
    assert f.decision.workers == 4 and f.outlook is not None
    # the plan held to the target at the median (the refusal's percentile) is its earliest deadline
    assert f.earliest_deadline_s == pytest.approx(f.outlook.seconds[1])
    assert f.earliest_deadline_s >= adaptive.earliest_deadline_s
    assert _fixed_plan_warning(fixed, f) is None  # 900 s and $0.05 are roomy
    raw["constraints"]["deadline_seconds"] = 0.8 * f.earliest_deadline_s  # still fits its first round
    late = parse_job(json.dumps(raw))
    f_late = _forecast(late)
    assert not f_late.decision.infeasible
    warning = _fixed_plan_warning(late, f_late)
    assert warning and "miss the deadline" in warning and "adaptive" in warning


def test_the_range_holds_the_plan_made_on_the_models_footprint_not_round_0s_probe():
    """Round 0 of an unmeasured model is planned without its footprint (a probe, cut by its limit);
    the run goes on with the plan made on what round 0 measures, which the footprint predicts: the
    forecast holds that plan (`decide_adaptive` on the full history), with the footprint's timing."""
    from smlt.runtime.config import FunctionSizes
    from smlt.runtime.planner import decide
    from smlt.runtime.planner.adaptive import decide_adaptive
    from smlt.runtime.planner.quote import first_forecast
    from smlt.runtime.planner.types import RunHistory
    from smlt.runtime.prices import Prices

    raw = json.loads(json.dumps(JOB))
    raw["model"] = {"name": "resnet18"}
    raw["training"]["target_value"] = 0.55
    raw["constraints"] = {"deadline_seconds": 600, "budget_usd": 0.05}
    job = parse_job(json.dumps(raw))
    h = RunHistory(
        param_count=11_000_000, flops_per_sample=2.08e8, train_rows=6000, val_rows=1000, dataset_bytes=60_000_000
    )
    tiers = [1024, 1769, 3008, 5120, 7168, 10240]
    f = first_forecast(job, h, tiers, Prices())
    probe = decide(job, h, tiers, Prices())
    held = decide_adaptive(job, h, tiers, Prices(), "x86_64", FunctionSizes())
    assert (f.decision.workers, f.decision.memory_mb, f.decision.local_steps) == (
        probe.workers,
        probe.memory_mb,
        probe.local_steps,
    )
    assert f.outlook is not None
    assert (f.outlook.workers, f.outlook.memory_mb, f.outlook.local_steps) == (
        held.workers,
        held.memory_mb,
        held.local_steps,
    )
    assert (held.local_steps, held.memory_mb) != (probe.local_steps, probe.memory_mb)  # the case under test
    # the held plan's median is the planner's own forecast of it, in its reason
    assert held.predicted_total_s is not None
    assert f.outlook.seconds[1] == pytest.approx(held.predicted_total_s, rel=0.05)
    lo, mid, hi = f.outlook.seconds
    assert lo <= mid <= hi
