"""The digits job under worker faults plus AWS's write conflicts (S3 409, DynamoDB transaction
conflicts), injected in the handler processes: it reaches its target and an independent
reconciliation of the stored objects and items finds no update lost or counted twice."""

import json
from collections import Counter

import pytest

from smlt.faults import FaultInjector
from smlt.reconcile import reconcile
from tests.e2e.test_local_run import digits_job, run

# Also run with the local engine's speed patches off (make test-stock-moto): see pyproject's markers.
pytestmark = pytest.mark.stock_moto

FAULTS = "fail=0.2,duplicate=0.05,s3_conflict=0.1,ddb_conflict=0.1"


def test_conflicts_and_faults_reach_the_target_with_nothing_lost_over_three_fault_seeds(local, tmp_path):
    engine, names = local
    injected: Counter = Counter()
    for seed in (1, 2, 3):
        injector = FaultInjector.from_spec(f"{FAULTS},seed={seed}", functions=names.train_functions)
        run_id = f"conflicts-{seed}"
        out = tmp_path / run_id
        assert run(local, digits_job(target_value=0.95), out, run_id, injector) == 0, f"fault seed {seed}"
        final = json.loads((out / "metrics.json").read_text())["final"]
        assert final["val_accuracy"] >= 0.95, f"fault seed {seed}"
        check = reconcile(engine.client("s3"), engine.client("dynamodb"), names.artifacts_bucket, names.table, run_id)
        assert check.findings == [], f"fault seed {seed}: {check.findings}"
        trained = [r for r in check.rounds if r.trained]
        assert trained and all(r.applied for r in trained) and not check.pending, check
        injected.update(injector.counts)
    # A few dozen conditional writes per run at 10 %: with these seeds both kinds occur.
    assert injected["s3_conflict"] > 0 and injected["ddb_conflict"] > 0 and injected["fail"] > 0, injected
