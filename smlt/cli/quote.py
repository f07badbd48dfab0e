"""`smlt quote JOB`: what a job would take and cost before any spend, and the same job on one VM.

Runs on a laptop with no AWS account and no engine: it reads the job file, prepares (or reads) the
dataset's manifest for the rows and the model's footprint, and asks the adaptive planner's own
first-plan forecast (`smlt.runtime.planner.quote`). The one-VM comparison prices the sequential
steps that forecast expects at the VM prices in cdk.json (`vm_prices`, with their sources).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from smlt.datasets import checked_dataset_folder
from smlt.jobfile import read_job_file
from smlt.runtime import deployed
from smlt.runtime.config import FunctionSizes
from smlt.runtime.data.prepare import read_local_manifest
from smlt.runtime.errors import InvalidDataset
from smlt.runtime.job import Job
from smlt.runtime.planner import priors as P
from smlt.runtime.planner.explain import fmt_s, fmt_usd
from smlt.runtime.planner.footprint import model_cost
from smlt.runtime.planner.quote import FirstForecast, first_forecast
from smlt.runtime.planner.types import RunHistory
from smlt.runtime.prices import Prices


class VmInstance(BaseModel):
    name: str
    service: Literal["ec2", "sagemaker"]
    vcpus: int
    memory_gib: float
    on_demand_hour: float
    spot_hour: float | None = None


class VmPrices(BaseModel):
    """cdk.json `vm_prices`."""

    note: str = ""
    ec2_min_billed_s: float = 60.0
    ec2_start_s: float = 60.0
    sagemaker_start_s: float = 120.0
    instances: list[VmInstance] = Field(default_factory=list)

    @classmethod
    def deployed(cls) -> VmPrices:
        return cls.model_validate(deployed.value("vm_prices"))


class VmOption(BaseModel):
    """The job on one VM: the sequential steps at the planner's per-vCPU compute prior."""

    instance: str
    service: str
    pricing: Literal["on-demand", "spot"]
    seconds: float  # start-up + training
    cost_usd: float
    meets_deadline: bool


class Quote(BaseModel):
    job: str
    feasible: bool
    reason: str
    plan: str | None  # the plan the forecast holds to the target
    first_round: str | None = None  # round 0's plan where it differs (a probe of an unmeasured model)
    rounds: tuple[float, float, float] | None = None  # p10, p50, p90
    seconds: tuple[float, float, float] | None = None
    cost_usd: tuple[float, float, float] | None = None
    p_out_of_reach: float
    warning: str | None = None  # a fixed plan admitted but expected to miss its deadline or budget
    earliest_deadline_s: float | None
    min_budget_usd: float | None
    vm: list[VmOption]
    verdict: str


def _history(job: Job, folder: Path | None) -> RunHistory:
    """The planner's input before round 0, as the first plan reads it (`steps.plan._history`)."""
    if folder is None:
        raise InvalidDataset(
            f"dataset.uri: {job.dataset.uri} is on S3; smlt quote reads no AWS: point dataset.uri at the "
            "local source or prepared folder (smlt data prepare) to quote it"
        )
    manifest = read_local_manifest(folder)
    transform = job.code is not None and job.code.transform
    cost = None if transform else model_cost(job.model, manifest.input_shape, manifest.outputs, manifest.vocab_size)
    return RunHistory(
        param_count=cost.params if cost else 0,
        flops_per_sample=cost.flops_per_sample if cost else None,
        train_rows=manifest.train.rows,
        val_rows=manifest.validation.rows,
        dataset_bytes=sum(sh.bytes for sh in manifest.train.shards),
    )


def _step_s(vcpus: int, step_flops: float) -> float:
    """One SGD step on a VM of `vcpus` (hyperthreads, like a Lambda vCPU): the planner's priors."""
    speed = 1.0 + P.efficiency_prior(step_flops) * (vcpus - 1)
    return P.STEP_OVERHEAD_S + step_flops / (P.FLOPS_PER_VCPU * speed)


def vm_options(job: Job, history: RunHistory, steps: float, vm: VmPrices) -> list[VmOption]:
    """Every instance of `vm`, on-demand and spot, for `steps` sequential steps of the job."""
    flops = history.flops_per_sample or P.FLOPS_PER_PARAM_GUESS * max(history.param_count, 1)
    step_flops = job.training.batch_size * flops
    deadline = job.constraints.deadline_seconds
    out = []
    for inst in vm.instances:
        train_s = steps * _step_s(inst.vcpus, step_flops)
        start = vm.ec2_start_s if inst.service == "ec2" else vm.sagemaker_start_s
        seconds = start + train_s
        # Billed from start-up to the end (EC2: per second, with a minimum; SageMaker's start-up
        # counted too, an upper bound: part of it is provisioning, which is not billed).
        billed = max(seconds, vm.ec2_min_billed_s) if inst.service == "ec2" else seconds
        prices = [("on-demand", inst.on_demand_hour)] + ([("spot", inst.spot_hour)] if inst.spot_hour else [])
        for pricing, hour in prices:
            out.append(
                VmOption(
                    instance=inst.name,
                    service=inst.service,
                    pricing=pricing,  # type: ignore[arg-type]
                    seconds=seconds,
                    cost_usd=billed / 3600.0 * hour,
                    meets_deadline=deadline is None or seconds <= deadline,
                )
            )
    return out


def _verdict(lambda_cost: float | None, lambda_s: float | None, vms: list[VmOption]) -> str:
    fits = [v for v in vms if v.meets_deadline]
    if not fits:
        return "no single VM here meets the deadline (start-up included): Lambda's parallel rounds are the way"
    best = min(fits, key=lambda v: v.cost_usd)
    what = f"a {best.instance} ({best.service}, {best.pricing}) would do this for ~{fmt_usd(best.cost_usd)} in ~{fmt_s(best.seconds)}"
    if lambda_cost is None:
        return what
    if lambda_cost <= best.cost_usd:
        why = (
            "the VM bills its start-up and minimum (the job is short)"
            if best.seconds < 600
            else "the job is parallel enough that Lambda's per-ms billing beats an idle-free VM"
        )
        return f"cheaper on Lambda (~{fmt_usd(lambda_cost)}) because {why}; {what}"
    faster = lambda_s is not None and lambda_s < best.seconds
    return f"{what}, {best.cost_usd / lambda_cost:.2g}x Lambda's ~{fmt_usd(lambda_cost)}" + (
        f"; Lambda is faster (~{fmt_s(lambda_s)})" if faster and lambda_s is not None else ""
    )


def _plan(n: int, m: int, k: int) -> str:
    return f"{n} workers x {m} MB x {k} steps"


def _fixed_plan_warning(job: Job, f: FirstForecast) -> str | None:
    """A fixed plan is admitted when its first round fits (`fixed.decide_fixed`), not its whole run:
    say so when the run is expected (median) to miss the deadline or the budget."""
    c = job.constraints
    if job.workers.planner != "fixed" or f.decision.infeasible:
        return None
    late = c.deadline_seconds is not None and (f.earliest_deadline_s or 0) > c.deadline_seconds
    dear = c.budget_usd is not None and (f.min_budget_usd or 0) > c.budget_usd
    missed = [
        *(
            [f"the deadline ({fmt_s(c.deadline_seconds or 0)}): it needs ~{fmt_s(f.earliest_deadline_s or 0)}"]
            if late
            else []
        ),
        *([f"the budget ({fmt_usd(c.budget_usd or 0)}): it needs ~{fmt_usd(f.min_budget_usd or 0)}"] if dear else []),
    ]
    if not missed:
        return None
    return (
        f"the fixed plan is expected (median) to miss {' and '.join(missed)}; set the limits that work "
        'below, or workers.planner "adaptive" to let the planner choose a plan within them'
    )


def quote(job: Job, history: RunHistory, vm: VmPrices | None = None, tiers: list[int] | None = None) -> Quote:
    """The quote of `job` from its pre-round-0 `history` (cdk.json tiers, prices and VM prices unless given)."""
    vm = vm or VmPrices.deployed()
    tiers = tiers or [int(t) for t in deployed.value("memory_tiers")]
    f: FirstForecast = first_forecast(job, history, tiers, Prices(), deployed.value("architecture"), FunctionSizes())
    d, o = f.decision, f.outlook
    feasible = not d.infeasible
    plan = _plan(o.workers, o.memory_mb, o.local_steps) if o else None
    first = _plan(d.workers, d.memory_mb, d.local_steps) if d.action == "train" else None
    vms = vm_options(job, history, f.sequential_steps, vm) if f.sequential_steps else []
    lambda_cost = o.cost_usd[1] if o else None
    lambda_s = o.seconds[1] if o else None
    return Quote(
        job=job.name,
        feasible=feasible,
        reason=d.reason,
        plan=plan,
        first_round=first if first != plan else None,
        rounds=o.rounds if o else None,
        seconds=o.seconds if o else None,
        cost_usd=o.cost_usd if o else None,
        p_out_of_reach=f.p_never,
        warning=_fixed_plan_warning(job, f),
        earliest_deadline_s=f.earliest_deadline_s,
        min_budget_usd=f.min_budget_usd,
        vm=vms,
        verdict=_verdict(lambda_cost, lambda_s, vms),
    )


def _range(v: tuple[float, float, float], fmt: Any) -> str:
    lo, mid, hi = (fmt(x) if math.isfinite(x) else "never" for x in v)
    return f"~{mid} (p10-p90 {lo} - {hi})"


def render(q: Quote, job: Job) -> list[str]:
    c = job.constraints
    limits = ", ".join(
        x
        for x in (
            f"deadline {fmt_s(c.deadline_seconds)}" if c.deadline_seconds is not None else "",
            f"budget {fmt_usd(c.budget_usd)}" if c.budget_usd is not None else "",
        )
        if x
    )
    lines = [f"job {q.job}" + (f" ({limits})" if limits else " (no deadline or budget)")]
    lines.append(("feasible" if q.feasible else "INFEASIBLE") + f": {q.reason}")
    if q.warning:
        lines.append(f"but {q.warning}")
    if q.earliest_deadline_s is not None:
        lines.append(f"earliest deadline that works: ~{fmt_s(q.earliest_deadline_s)}")
    if q.min_budget_usd is not None:
        lines.append(f"smallest budget that works:   ~{fmt_usd(q.min_budget_usd)}")
    if q.plan and q.seconds and q.cost_usd and q.rounds:
        lines.append(f"plan: {q.plan}, held to the target:")
        if q.first_round:
            lines.append(f"  (round 0 probes the model with {q.first_round}; the planner plans on what it measures)")
        lines.append(f"  rounds {_range(q.rounds, lambda x: f'{x:.0f}')}")
        lines.append(f"  time   {_range(q.seconds, fmt_s)}")
        lines.append(f"  cost   {_range(q.cost_usd, fmt_usd)}")
    if q.p_out_of_reach > 0.01:
        lines.append(f"  {q.p_out_of_reach:.0%} chance the target is out of reach on the prior")
    if q.vm:
        lines.append("the same job on one VM (sequential steps at the planner's compute prior; cdk.json vm_prices):")
        for v in q.vm:
            late = "" if v.meets_deadline else "  (misses the deadline)"
            lines.append(f"  {v.instance:<14} {v.pricing:<9} ~{fmt_s(v.seconds):>8}  ~{fmt_usd(v.cost_usd)}{late}")
    lines.append(f"verdict: {q.verdict}")
    return lines


def run(args: argparse.Namespace) -> int:
    path = Path(args.job)
    job, _ = read_job_file(path)
    folder = checked_dataset_folder(job, base=path.parent)
    history = _history(job, folder)
    q = quote(job, history)
    if args.json:
        print(json.dumps(q.model_dump(), indent=2))
    else:
        print("\n".join(render(q, job)))
    return 0


def add_command(sub: Any) -> None:
    p = sub.add_parser("quote", help="what a job would take and cost, before any spend (no AWS, no engine)")
    p.add_argument("job", help="the job file (JSON)")
    p.add_argument("--json", action="store_true", help="print the quote as JSON")
    p.set_defaults(fn=run)
