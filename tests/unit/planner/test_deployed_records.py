"""The deployed planner reads what the benchmarked planner reads: a ROUND item's worker timings
(smlt.runtime.items.RoundTiming, written by the aggregator) carry every field of the planner's
WorkerTiming that the simulator fills, and the conversion the Plan step makes loses none."""

from __future__ import annotations

import re
from pathlib import Path

from smlt.runtime.items import RoundItem, RoundTiming, WorkerItem
from smlt.runtime.planner.types import WorkerTiming
from smlt.runtime.steps.aggregate import _failed_timings
from smlt.runtime.steps.plan import _record

PLANNER = Path(__file__).resolve().parents[3] / "smlt/runtime/planner"
# Fields only the simulator fills. The planner must not read them, or the deployed planner
# would plan from defaults where the benchmarked one plans from measurements.
SIM_ONLY = {"start_s"}


def test_every_field_the_planner_reads_is_recorded_by_the_deployed_path():
    assert set(WorkerTiming.model_fields) - set(RoundTiming.model_fields) == SIM_ONLY
    code = "\n".join(p.read_text() for p in PLANNER.glob("*.py"))
    for field in SIM_ONLY:
        assert not re.search(rf"\.{field}\b", code), f"the planner reads {field}, which only the simulator fills"


def test_a_worker_cut_off_by_the_map_reaches_the_planner_as_held():
    records = [WorkerItem(worker=0, samples=640, memory_mb=1769, total_s=2.0, compute_s=1.5, steps=20)]
    outcomes = [
        {"worker": 0, "ok": True},
        {"worker": 1, "ok": False, "error": "States.Timeout"},
        {"worker": 2, "ok": False, "error": "Runtime.OutOfMemory"},
        {"worker": 3, "ok": False, "error": "Lambda.Unknown"},
        {"worker": 0, "ok": False, "error": "States.Timeout"},  # a retry that failed after the record: reported
    ]
    failed = _failed_timings(outcomes, records, 1769)
    assert [(t.worker, t.error) for t in failed] == [(1, "TimeLimit"), (2, "OutOfMemory"), (3, "Lambda.Unknown")]
    item = RoundItem(
        round=3,
        workers=4,
        workers_ok=1,
        memory_mb=1769,
        local_steps=20,
        batch_size=32,
        timings=[RoundTiming.of(records[0]), *failed],
    )
    rec = _record(RoundItem.model_validate(item.model_dump()))
    assert [t.error for t in rec.timings] == [None, "TimeLimit", "OutOfMemory", "Lambda.Unknown"]
    assert rec.timings[1].held and not rec.timings[0].held
