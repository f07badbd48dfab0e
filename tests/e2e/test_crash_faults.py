"""Control steps whose process dies in the middle of their work (`--faults crash=R`: right after
the k-th S3 or DynamoDB write), on the local engine's synthesized state machine: the state
machine retries them (`Runtime.ExitError`), and each retry must finish what its first attempt
began (docs/failures.md, "a control step's process dies between its writes")."""

from __future__ import annotations

import json

from smlt.faults import FaultInjector
from smlt.runtime import keys
from tests.e2e.test_iam_calls import short_job
from tests.e2e.test_local_run import digits_job, reconciled, run


def test_a_plan_dying_after_meta_still_starts_from_the_warm_start(local):
    engine, names = local
    desc = engine.wait(engine.start_execution(short_job(names, engine), name="crash-ws-src"), interval=0.2)
    assert desc["status"] == "SUCCEEDED", desc
    s3 = engine.client("s3")
    published = s3.get_object(Bucket=names.artifacts_bucket, Key=keys.final_model_key("crash-ws-src"))["Body"].read()
    job = {
        **short_job(names, engine),
        "warm_start": f"s3://{names.artifacts_bucket}/{keys.final_model_key('crash-ws-src')}",
    }
    job["training"]["max_rounds"] = 1
    crashed: list[str] = []

    def first_plan_dies_after_meta(function: str, payload: object) -> str:
        if isinstance(payload, dict) and payload.get("op") == "plan" and not crashed:
            crashed.append(function)
            return "crash:1"  # its first write is META
        return "ok"

    engine.invoke_filter = first_plan_dies_after_meta
    try:
        desc = engine.wait(engine.start_execution(job, name="crash-ws"), interval=0.2)
    finally:
        engine.invoke_filter = None
    assert desc["status"] == "SUCCEEDED", desc
    assert crashed and any(c[0] == crashed[0] and c[2] == "Runtime.ExitError" for c in engine.invocations)
    model0 = s3.get_object(Bucket=names.artifacts_bucket, Key=keys.model_key("crash-ws", 0))["Body"].read()
    assert model0 == published, "round 0 started from a fresh initialisation, not the warm start"


def test_control_steps_dying_between_their_writes_are_retried_to_a_reconciled_run(local, tmp_path):
    engine, names = local
    injector = FaultInjector.from_spec("crash=0.5,seed=3", functions=names.train_functions)
    assert run(local, digits_job(max_rounds=3, target_value=None), tmp_path, "crash-faulty", injector) == 0
    assert injector.counts["crash"] >= 3, injector.counts
    assert any(c[2] == "Runtime.ExitError" for c in engine.invocations)
    final = json.loads((tmp_path / "metrics.json").read_text())["final"]
    assert final["rounds"] == 3 and final["trained_fraction"] == 1.0 and final["val_accuracy"] > 0.9, final
    assert reconciled(local, "crash-faulty") == []


def test_a_chain_dying_after_it_started_the_next_execution_is_retried_and_the_run_succeeds(local, tmp_path):
    """Chain's process dies after StartExecution, before it answers (`kill`): its retry finds the
    continuation by its name and answers it, so `smlt run` follows the run to its end (before, the
    first execution FAILED with Runtime.ExitError, exit 1, while the continuation trained on)."""
    engine, names = local
    job = digits_job(max_rounds=6, target_value=None, local_steps=2)
    job["workers"].update(initial=2)
    job["rounds_per_execution"] = 3
    killed: list[str] = []

    class FirstChainDies:
        counts = {"kill": 0}  # what `smlt run` reports of the faults

        def __call__(self, function: str, payload: object) -> str:
            if isinstance(payload, dict) and payload.get("op") == "chain" and not killed:
                killed.append(function)
                self.counts["kill"] += 1
                return "kill"
            return "ok"

    assert run(local, job, tmp_path, "chain-killed", FirstChainDies()) == 0
    assert killed and any(c[0] == killed[0] and c[2] == "Runtime.ExitError" for c in engine.invocations)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["final"]["rounds"] == 6
    assert [r["round"] for r in metrics["rounds"]] == list(range(7))  # no round twice, none lost
    executions = {e["execution"] for e in json.loads((tmp_path / "history.json").read_text())}
    assert len(executions) == 3  # 3 + 3 rounds and the evaluation: the kill started no extra one
    assert reconciled(local, "chain-killed") == []
