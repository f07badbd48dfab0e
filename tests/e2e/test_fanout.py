"""The round's Map on the local engine: the planner's `fanout` picks the inline Map or the
Distributed Map (smlt/runtime/fanout.py), both train, and the history the plan reserves is never less
than what the execution wrote."""

import json

import pytest

from smlt.runtime.records import RunTable
from tests.e2e.test_local_run import digits_job, run

# Also run with the local engine's speed patches off (make test-stock-moto): see pyproject's markers.
pytestmark = pytest.mark.stock_moto


def _entered(out) -> list[str]:
    history = json.loads((out / "history.json").read_text())
    return [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]


@pytest.mark.parametrize("inline_max", [40, 0], ids=["inline", "distributed"])
def test_the_planned_map_runs_the_round(local, tmp_path, monkeypatch, inline_max):
    engine, names = local
    # Every function reads the rule (the planner picks, the aggregator's ledger counts): set it
    # in each function's environment, as cdk.json's `fanout` would.
    fanout = json.dumps({"inline_max_workers": inline_max})
    for spec in engine.functions.values():
        monkeypatch.setitem(spec.env, "SMLT_FANOUT", fanout)
    run_id = f"fanout-{inline_max}"
    assert run(local, digits_job(max_rounds=2, target_value=None), tmp_path, run_id) == 0

    entered = _entered(tmp_path)
    # Two training rounds and the final evaluation, 4 workers each. A Distributed Map's children
    # have their own histories: the parent records only the Map.
    if inline_max:
        assert entered.count("TrainWorker") == 12 and "TrainDistributed" not in entered
    else:
        assert entered.count("TrainDistributed") == 3 and "Train" not in entered and "TrainWorker" not in entered

    table = RunTable(names.table, run_id, client=engine.client("dynamodb"))
    plans = table.plans()
    assert {p.workers for p in plans if p.action == "train"} == {4}
    # The history the plans account for covers what the execution wrote (Finalize's few events
    # after the last plan aside), so chaining always comes before the 25,000-event limit.
    history = json.loads((tmp_path / "history.json").read_text())
    reserved = max(p.execution_events for p in plans)
    print(f"\n{run_id}: {len(history)} history events, {reserved} reserved by the plans")
    assert len(history) <= reserved + 20
