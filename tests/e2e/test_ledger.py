"""The ledger (smlt.runtime.ledger: each Lambda attempt's ATTEMPT item) against what the local engine and
the moto server counted themselves, with faults on: the bill AWS would send.

The engine's record (`LocalEngine.billed`) is measured by the handler processes around each
handler call (smlt.local.pool), and the requests are counted here, on the moto server's WSGI
application: neither runs any smlt.runtime.ledger code.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from contextlib import contextmanager

from smlt.datasets import stage_dataset
from smlt.faults import FaultInjector
from smlt.runtime import keys, ledger
from smlt.runtime.records import RunTable
from smlt.runtime.store import S3Store
from tests.e2e.test_local_run import digits_job

FAULTS = {"fail": 0.2, "duplicate": 0.1, "timeout": 0.1}
# AWS bills per 1 ms: an invocation's time as the handler process and as the meter measure it
# (two clocks, each read at the start and at the end) may differ by 1 ms at each reading.
PER_INVOCATION_S = 2 * 0.001
# A cold invocation's init starts, for the meter, at the handler module's first line: the import
# system's work before it (finding, reading, unmarshalling the module) no code in the module can
# time (on Lambda also the runtime's own start). Seen up to 4 ms on a loaded machine.
COLD_S = 0.02
# The last ATTEMPT item of a process in a run holds an estimate of its own write's time (no later
# item corrects it, smlt.runtime.ledger): a DynamoDB PutItem on the local moto server.
LAST_WRITE_S = 0.1
# The meter's clock reads and the handler process's are different instants: a preemption between
# them (a scheduler slice of a loaded 2-core machine, seen 3.8 ms) moves one invocation's time out
# of the ledger's window. Allowed for a few invocations of a run, never for most.
PREEMPT_S = 0.01


@contextmanager
def server_requests(engine):
    """Count the S3 and DynamoDB requests the moto server answers meanwhile: DynamoDB by its
    operation (X-Amz-Target), S3 by HTTP method."""
    wsgi = engine.server._server._server  # werkzeug's server under moto's ThreadedMotoServer
    app, seen, lock = wsgi.app, Counter(), threading.Lock()

    def counting(environ, start_response):
        auth = environ.get("HTTP_AUTHORIZATION", "")
        service = auth.split("Credential=", 1)[-1].split("/")[3] if "Credential=" in auth else ""
        if service == "dynamodb":
            key = "dynamodb." + environ.get("HTTP_X_AMZ_TARGET", "").rsplit(".", 1)[-1]
        elif service == "s3":
            key = "s3." + environ["REQUEST_METHOD"]
        else:
            key = ""
        if key:
            with lock:
                seen[key] += 1
        return app(environ, start_response)

    wsgi.app = counting
    try:
        yield seen
    finally:
        wsgi.app = app


# The HTTP method of each S3 operation smlt's code uses (S3's REST API).
S3_METHODS = {
    "PutObject": "PUT",
    "CopyObject": "PUT",
    "PutObjectTagging": "PUT",
    "UploadPart": "PUT",
    "GetObject": "GET",
    "ListObjectsV2": "GET",
    "ListObjects": "GET",
    "HeadObject": "HEAD",
    "DeleteObject": "DELETE",
    "DeleteObjects": "POST",
    "CreateMultipartUpload": "POST",
    "CompleteMultipartUpload": "POST",
}


def ledger_requests(attempts):
    out: Counter = Counter()
    for name, count in ledger.requests_by_service(attempts).items():
        service, op = name.split(".", 1)
        if service == "s3":
            out["s3." + S3_METHODS[op]] += count
        elif service == "dynamodb":
            out[name] += count
    return out


def billed_gb_s(memory_mb, init_s, duration_s):
    return memory_mb / 1024 * math.ceil(round((init_s + duration_s) * 1000, 6)) / 1000


def run_and_count(local, job, run_id, injector=None):
    """Run the job (the execution alone: no CLI snapshots, whose requests are not the run's);
    (the engine's record of it, the server's request counts, the run's ATTEMPT items, metrics)."""
    engine, names = local
    job = {
        **job,
        "dataset": {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))},
    }
    engine.invoke_filter = injector
    engine.pool.recycle()  # fresh handler processes: the run starts cold, whatever ran before it
    before = len(engine.billed)
    try:
        with server_requests(engine) as seen:
            desc = engine.wait(engine.start_execution(job, name=run_id), interval=0.5, timeout=600)
        served = Counter(seen)
    finally:
        engine.invoke_filter = None
    assert desc["status"] == "SUCCEEDED", desc
    billed = engine.billed[before:]
    table = RunTable(names.table, run_id, client=engine.client("dynamodb"))
    attempts = ledger.from_items(table.query(ledger.PREFIX))
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    metrics = json.loads(art.get(keys.final_metrics_key(run_id)))
    return billed, served, attempts, metrics


def test_the_ledger_is_the_engines_record_and_the_servers_count_with_faults(local):
    engine, names = local
    injector = FaultInjector(FAULTS, functions=names.train_functions, seed=3)
    job = digits_job(max_rounds=4, target_value=None, local_steps=5)
    billed, served, attempts, metrics = run_and_count(local, job, "ledger-faults", injector)
    counts = injector.counts
    assert counts["fail"] and counts["duplicate"] and counts["timeout"], counts  # every fault happened

    # Every handler run the engine served, as many in the ledger (a duplicate is two), none estimated.
    assert all(b.measured for b in billed), [b for b in billed if not b.measured]
    assert len(attempts) == len(billed) > 0
    assert not [a for a in attempts if a.estimated]
    assert Counter(a.function for a in attempts) == Counter(b.function for b in billed)
    assert Counter(a.outcome != "ok" for a in attempts) == Counter(
        b.outcome not in ("ok", "Sandbox.Timedout") for b in billed
    )

    # Billed seconds, init included, per invocation (a duplicate's two runs share a request id),
    # to AWS's billing granularity; the last item a process wrote in the run keeps its write
    # estimate (no later item corrects it), within LAST_WRITE_S.
    corrected = {a.corrects for a in attempts}
    engine_s, ledger_s, last = Counter(), Counter(), set()
    for b in billed:
        engine_s[b.request_id] += b.init_s + b.duration_s
    for a in attempts:
        ledger_s[a.request_id] += a.init_s + a.duration_s
        if a.key not in corrected:
            last.add(a.request_id)
    assert set(engine_s) == set(ledger_s)
    runs = Counter(b.request_id for b in billed)
    cold = {b.request_id for b in billed if b.init_s > 0}

    def allowed(rid):
        return runs[rid] * PER_INVOCATION_S + (LAST_WRITE_S if rid in last else 0) + (COLD_S if rid in cold else 0)

    def off(slack):
        return {
            rid: [round(ledger_s[rid] - engine_s[rid], 4), [b for b in billed if b.request_id == rid]]
            for rid in engine_s
            if abs(ledger_s[rid] - engine_s[rid]) > allowed(rid) + slack
        }

    assert not off(PREEMPT_S), off(PREEMPT_S)
    assert len(off(0.0)) <= max(2, len(engine_s) // 20), off(0.0)  # preempted: a few, not most
    assert len(last) <= 2 * engine.pool.size + 2  # at most a few: one per process (and replacement)
    ledger_gb_s = sum(a.gb_s for a in attempts)
    engine_init = sum(b.memory_mb / 1024 * b.init_s for b in billed)
    ledger_init = sum(a.memory_mb / 1024 * a.init_s for a in attempts)
    tolerance = sum(b.memory_mb / 1024 * PER_INVOCATION_S for b in billed)
    assert engine_init > 0 and abs(ledger_init - engine_init) <= tolerance, (ledger_init, engine_init)

    # Every S3 and DynamoDB request the moto server answered, and no other.
    assert ledger_requests(attempts) == served

    # metrics.json: the same ledger, per round and for the run (Finalize priced as it would end).
    final = metrics["final"]
    assert final["billed_invocations"] == len(billed)
    assert math.isclose(final["cost_breakdown"]["lambda_gb_s"], ledger_gb_s, rel_tol=0.01)
    assert final["cost_breakdown"]["lambda_init_gb_s"] > 0
    per_round = sum(r["cost_breakdown"]["lambda_invocations"] for r in metrics["rounds"])
    assert 0 < per_round < final["billed_invocations"]  # the stop plan and Finalize are the run's own


def run_bill(local, run_id):
    """The run's bill recomputed after it ended, from every stored ATTEMPT item (Finalize's own
    included as it ended) and the ROUND items."""
    from smlt.runtime import deployed
    from smlt.runtime.bill import RoundShape
    from smlt.runtime.fanout import Fanout
    from smlt.runtime.prices import Prices

    engine, names = local
    table = RunTable(names.table, run_id, client=engine.client("dynamodb"))
    rounds = [
        ledger.RoundOf(
            r.round,
            RoundShape(
                workers=r.workers,
                worker_gb_s=0.0,
                planner_memory_mb=deployed.value("planner_memory_mb"),
                aggregate_memory_mb=deployed.value("aggregate_memory_mb"),
                aggregators=r.aggregators,
                eval_only=r.eval_only,
                fanout=Fanout(**deployed.value("fanout")),
            ),
        )
        for r in table.rounds()
    ]
    executions = len({p.execution for p in table.plans()})
    attempts = ledger.from_items(table.query(ledger.PREFIX))
    return ledger.run_ledger(attempts, rounds, executions, Prices(), deployed.value("architecture"))[1]


def test_a_tight_budget_stops_the_run_before_the_ledger_passes_it(local):
    engine, names = local
    # Round 0 of 4 workers costs ~$0.0015 (cold starts, faults), later ones ~$0.0004; the run stops
    # when what is left cannot pay one more round's worst case (~$0.0027) and Finalize: ~9 rounds
    # (at $0.012 it trained 18, to prove the same).
    budget = 0.008
    job = digits_job(max_rounds=40, target_value=None, local_steps=5)
    job["constraints"]["budget_usd"] = budget
    injector = FaultInjector(FAULTS, functions=names.train_functions, seed=5)
    billed, served, attempts, metrics = run_and_count(local, job, "ledger-budget", injector)
    final = metrics["final"]
    assert "budget" in final["stop_reason"], final["stop_reason"]
    assert final["rounds"] >= 2, final  # it trained, then stopped on the budget
    assert final["cost_breakdown"]["total_usd"] <= budget
    reconciled = run_bill(local, "ledger-budget")
    assert reconciled.lambda_invocations == len(billed)
    assert reconciled.total_usd <= budget, reconciled


def test_a_sync_runs_ledger_has_its_exchange_requests(local):
    engine, names = local
    workers, steps = 2, 10
    job = digits_job(mode="sync", max_rounds=2, target_value=None, local_steps=steps)
    job["workers"].update(initial=workers, min=1, max=workers)
    billed, served, attempts, metrics = run_and_count(local, job, "ledger-sync")
    assert ledger_requests(attempts) == served
    # Each worker's gradient and averaged slice per step went through S3 (two training rounds).
    exchange_puts = 2 * workers * steps * 2
    rounds = metrics["rounds"]
    assert sum(r["cost_breakdown"]["s3_puts"] for r in rounds) >= exchange_puts
    assert metrics["final"]["cost_breakdown"]["s3_gets"] >= 2 * exchange_puts


def test_throttled_requests_are_retried_and_neither_lost_nor_billed(local):
    """S3's 503 SlowDown and DynamoDB's ProvisionedThroughputExceededException (a wide round on
    one prefix and one partition key) on 15 % of every handler's requests: botocore's retries get
    each through, the run reconciles, and the ledger bills the requests the server answered and
    not the throttled ones (AWS bills neither a 5xx of S3 nor a DynamoDB throttle)."""
    from smlt.reconcile import reconcile

    engine, names = local
    injector = FaultInjector({"s3_slowdown": 0.15, "ddb_throttle": 0.15}, seed=4)
    job = digits_job(max_rounds=3, target_value=None, local_steps=5)
    billed, served, attempts, metrics = run_and_count(local, job, "ledger-throttled", injector)
    counts = injector.counts
    assert counts["s3_slowdown"] >= 3 and counts["ddb_throttle"] >= 3, counts
    # Every invocation got its requests through (a retried request's backoff can still make a
    # cold round-0 worker of a loaded machine a straggler: the quorum's business, not an error).
    assert not [a for a in attempts if a.outcome != "ok"], [a for a in attempts if a.outcome != "ok"]
    assert len([r for r in metrics["rounds"] if r["accepted"]]) >= 3, metrics["rounds"]
    assert ledger_requests(attempts) == served
    check = reconcile(
        engine.client("s3"), engine.client("dynamodb"), names.artifacts_bucket, names.table, "ledger-throttled"
    )
    assert check.findings == [] and all(r.applied for r in check.rounds if r.trained), check
