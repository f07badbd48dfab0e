"""The bill of one round: the requests it makes of each service and the GB-seconds it runs, as a
function of the round's shape, and their price under a `Prices` table.

One source for the places that price a round: the ledger (`ledger_round`, with the measured
ATTEMPT items), the planner's forecast (`smlt.runtime.planner.timing`, from predicted seconds)
and both simulators (`smlt.sim.cloud`, `smlt.sim.analytic`). Every count works on numbers and on
numpy arrays alike (the planner prices all its candidates at once).

Requests per round (docs/architecture.md, "Requests per round"), n workers invoked, r of them
reported, u of them wrote an update (r, or 0 in an evaluation round), k aggregators:

- Lambda: n workers, the planner, the aggregator (k > 1: prepare, k slices, finish).
- Step Functions: Plan, ShouldTrain, HowToTrain, the Map, HowToAggregate, Aggregate, Continue: 7,
  and per worker its task in an inline Map (n <= 40) or a Distributed Map child's start, task and
  end (`smlt.runtime.fanout`); k > 1 adds prepare, Prepared, the slice Map and its k inline iterations:
  6 + 3k.
- S3 PUT: u updates and model r+1 (k > 1: also its k slices, the manifest and accepted.json).
- S3 GET: model r by each worker, the shards of each worker that missed its /tmp cache, model r
  and the u updates by the aggregator (k > 1: each slice also reads its range of model r and of
  every update).
- DynamoDB (items rounded up to 1 KB written, 4 KB read, transactions at twice the rate): writes,
  each reported worker's record in a transaction with the seal's condition check (2 + 2 per ~1 KB
  item), the seal (1), the ROUND item (~1 KB + 0.3 KB per worker), the PLAN item (~4 KB);
  strongly consistent reads, each worker's BatchGetItem of 3 items, the aggregator's of 4 and its
  Query of the records (~0.7 KB each), the planner's Query and BatchGetItem of 3.
- Every invocation's ATTEMPT item (smlt.runtime.ledger: 1 write each), the aggregator's two Queries of
  them; per retried worker attempt its reads, writes and transition again; sync mode's exchange
  (`exchange_requests`); CloudWatch Logs and X-Ray, estimated (`observability_usd`).

The ledger itself prices what each attempt recorded (smlt.runtime.ledger) with this module's per-request
rules (`s3_tier`, `dynamodb_units`, `logs_gb`); the formulas above are the forecast's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from smlt.runtime.fanout import Fanout
from smlt.runtime.prices import Prices, gb_seconds

if TYPE_CHECKING:
    from smlt.runtime.config import Settings

Num = Any  # a float or a numpy array of them (one per planner candidate)


def _num(x: Num) -> Num:
    """A plain number as a Python float, else a float array. The counts below are the same
    operations on either; on plain numbers numpy's overhead per operation would be most of the time
    of a round priced alone (the simulator's rounds, the planner's priors)."""
    return float(x) if isinstance(x, (int, float)) else np.asarray(x, dtype=float)


def _where(cond: Any, a: Num, b: Num) -> Num:
    """`np.where`; on a plain condition the side it picks, as it is (the same numbers)."""
    if isinstance(cond, (int, float)):
        return a if cond else b
    return np.where(cond, a, b)


def aggregator_invocations(aggregators: Num) -> Num:
    """One aggregator, or prepare + k slices + finish."""
    k = _num(aggregators)
    return _where(k > 1, k + 2, 1.0)


@dataclass(frozen=True)
class RoundShape:
    workers: Num  # n invoked (each one billed, failed or not)
    worker_gb_s: Num  # GB-seconds of all n workers (init + handler; a failed one to where it stopped)
    planner_memory_mb: Num
    aggregate_memory_mb: Num
    plan_s: Num = 0.0
    aggregate_s: Num = 0.0  # the aggregation's wall time: each of the k + 2 invocations is charged it
    reported: Num | None = None  # workers whose record arrived (None: all n)
    aggregators: Num = 1
    eval_only: Num = False  # no updates written or read
    shard_reads: Num = 0  # workers that read their data shards from S3, not from the /tmp cache
    fanout: Fanout = field(default_factory=Fanout)  # the deployed Map rule (Settings.fanout)
    retries: Num = 0  # worker attempts beyond one each (Step Functions retries, duplicates): a worst case's allowance
    exchange_steps: Num = 0  # sync mode: local steps whose gradients go through the S3 exchange


@dataclass(frozen=True)
class Requests:
    lambda_invocations: Num
    transitions: Num
    s3_puts: Num
    s3_gets: Num
    dynamodb_write_units: Num
    dynamodb_read_units: Num

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


# Plan, ShouldTrain, HowToTrain, the Map state, HowToAggregate, Aggregate, Continue.
ROUND_TRANSITIONS = 7


def requests(shape: RoundShape) -> Requests:
    n = _num(shape.workers)
    r = n if shape.reported is None else _num(shape.reported)
    k = _num(shape.aggregators)
    sharded = k > 1
    u = _where(shape.eval_only, 0.0, r)  # updates written (and read by the aggregator)
    transitions = ROUND_TRANSITIONS + shape.fanout.transitions(n) + _where(sharded, 6 + 3 * k, 0.0)
    puts = u + 1 + _where(sharded, k + 2, 0.0)
    gets = n + shape.shard_reads + 1 + u + _where(sharded, k * (u + 1), 0.0)
    writes = 4 * r + 1 + (1 + 0.3 * r) + 4
    reads = 3 * n + 4 + (1 + 0.2 * r) + 1 + 3
    invocations = n + shape.retries + 1 + aggregator_invocations(k)
    # Every attempt writes its ATTEMPT item (smlt.runtime.ledger); the aggregator queries this round's and
    # the last one's; a retried attempt repeats its worker's reads and its Task's transition.
    writes = writes + invocations + 4 * shape.retries
    reads = reads + 2 + 3 * shape.retries
    transitions = transitions + shape.retries
    x_puts, x_gets = exchange_requests(n, shape.exchange_steps)
    return Requests(invocations, transitions, puts + x_puts, gets + x_gets + shape.retries, writes, reads)


# The worst case's allowance of attempts beyond one per worker: a quarter of the workers again (at
# least one), each billed as a whole worker. Covers Step Functions retries of Lambda service
# errors, duplicated deliveries and stragglers the Task abandoned that keep running (the local
# fault tests inject fail + duplicate + timeout at 0.4 of invocations, of which only duplicates
# and time-outs run whole: 0.2).
RETRY_ALLOWANCE = 0.25


def retry_allowance(workers: Num) -> Num:
    n = np.asarray(workers, dtype=float)
    return np.where(n > 0, np.maximum(1.0, np.ceil(RETRY_ALLOWANCE * n)), 0.0)


# Sync mode's exchange per worker per step (smlt.runtime.exchange.ReduceScatter): its gradient and
# its averaged slice written, n gradient slices and n averaged slices read, and the polls of the
# barriers: GETs of an object not written yet, about one per wait when the workers keep pace.
EXCHANGE_PUTS_PER_STEP = 2
EXCHANGE_POLLS_PER_STEP = 2


def exchange_requests(workers: Num, steps: Num) -> tuple[Num, Num]:
    """(PUTs, GETs) of a sync-mode round's exchange through S3, and the aggregator's LIST of
    the round's exchange objects (a PUT-priced request; S3 DELETEs are free)."""
    n = _num(workers)
    s = _num(steps)
    puts = n * s * EXCHANGE_PUTS_PER_STEP + _where(s > 0, 1.0, 0.0)
    gets = n * s * (2 * n + EXCHANGE_POLLS_PER_STEP)
    return puts, gets


# What S3 bills a request at, by operation (S3 pricing: PUT, COPY, POST, LIST at the PUT rate;
# GET, HEAD and the rest at the GET rate; DELETE free).
S3_PUT_OPERATIONS = frozenset(
    {
        "PutObject",
        "CopyObject",
        "PostObject",
        "ListObjects",
        "ListObjectsV2",
        "ListObjectVersions",
        "CreateMultipartUpload",
        "UploadPart",
        "UploadPartCopy",
        "CompleteMultipartUpload",
        "PutObjectTagging",
    }
)
S3_FREE_OPERATIONS = frozenset({"DeleteObject", "DeleteObjects", "AbortMultipartUpload"})


def s3_tier(operation: str) -> str:
    """ "put", "get" or "free": the price S3 bills `operation` at."""
    if operation in S3_FREE_OPERATIONS:
        return "free"
    return "put" if operation in S3_PUT_OPERATIONS else "get"


DYNAMODB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
DYNAMODB_READS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"})


def dynamodb_units(operation: str, request_bytes: int, items: int, response_bytes: int) -> tuple[float, float]:
    """(write units, read units) of one DynamoDB request, from its sizes: a write unit per KB
    written (the request's DynamoDB JSON, a little over the item's stored size), a strongly
    consistent read unit per 4 KB read, at least one per item; transactions at twice the rate."""
    twice = 2.0 if operation.startswith("Transact") else 1.0
    if operation in DYNAMODB_WRITES:
        return twice * max(1.0, float(items), float(-(-request_bytes // 1024))), 0.0
    if operation in DYNAMODB_READS:
        return 0.0, twice * max(1.0, float(items), float(-(-response_bytes // 4096)))
    return 0.0, 0.0  # control-plane calls are not billed per request


# CloudWatch Logs and X-Ray, estimated (they are not counted by anything a run can read): each
# Lambda invocation writes its START, END and REPORT lines and a Powertools line or two; the state
# machine's log level ALL with execution data writes about two events per transition, each with
# the state's input or output (a few hundred bytes here: the plan and the outcomes). Active tracing
# records at most one trace per invocation (X-Ray's default sampling keeps fewer: an upper bound).
LOG_BYTES_PER_INVOCATION = 1500
LOG_BYTES_PER_TRANSITION = 2 * 700


def logs_gb(invocations: Num, transitions: Num) -> Num:
    return (invocations * LOG_BYTES_PER_INVOCATION + transitions * LOG_BYTES_PER_TRANSITION) / 1e9


def observability_usd(invocations: Num, transitions: Num, prices: Prices) -> Num:
    """The CloudWatch Logs ingestion and X-Ray traces of `invocations` and `transitions`."""
    return logs_gb(invocations, transitions) * prices.logs_ingestion_gb + invocations * prices.xray_trace


@dataclass(frozen=True)
class Bill:
    requests: Requests
    worker_usd: Num  # the workers' GB-s and invocations
    control_usd: Num  # the planner's and the aggregators' GB-s and invocations
    services_usd: Num  # Step Functions, S3 and DynamoDB requests

    @property
    def usd(self) -> Num:
        return self.worker_usd + self.control_usd + self.services_usd


def services_usd(req: Requests, prices: Prices) -> Num:
    """Step Functions, S3, DynamoDB requests and the logs and traces they make."""
    return (
        req.transitions * prices.sfn_transition
        + req.s3_puts * prices.s3_put
        + req.s3_gets * prices.s3_get
        + req.dynamodb_write_units * prices.dynamodb_write_unit
        + req.dynamodb_read_units * prices.dynamodb_read_unit
        + observability_usd(req.lambda_invocations, req.transitions, prices)
    )


def price(shape: RoundShape, prices: Prices, architecture: str) -> Bill:
    """The round's bill under `prices` for functions of `architecture`."""
    req = requests(shape)
    gbs = prices.lambda_gb_second[architecture]
    agg_calls = aggregator_invocations(shape.aggregators)
    control_gb_s = gb_seconds(shape.planner_memory_mb, shape.plan_s) + agg_calls * gb_seconds(
        shape.aggregate_memory_mb, shape.aggregate_s
    )
    attempts = _num(shape.workers) + shape.retries
    worker_usd = shape.worker_gb_s * gbs + attempts * prices.lambda_request
    control_usd = control_gb_s * gbs + (1 + agg_calls) * prices.lambda_request
    return Bill(req, worker_usd, control_usd, services_usd(req, prices))


# The end of a run: Plan (its stop), ShouldTrain, Finalize, Done; Finalize writes final/model and
# final/metrics.json.
FINALIZE_TRANSITIONS = 4
FINALIZE_PUTS = 2


def finalize_usd(prices: Prices, architecture: str, planner_memory_mb: Num, seconds: Num, margin: float = 1.0) -> Num:
    """The Finalize invocation and its requests (`margin` x the requests, for a worst case)."""
    requests = FINALIZE_PUTS * prices.s3_put + FINALIZE_TRANSITIONS * prices.sfn_transition
    return prices.lambda_cost(planner_memory_mb, seconds, architecture) + margin * requests


def ledger_round(settings: Settings, workers: int, aggregators: int, eval_only: bool) -> RoundShape:
    """A recorded round's shape as the ledger counts it (smlt.runtime.ledger.RoundOf): its map and
    aggregation transitions; the seconds and the requests come from the ATTEMPT items."""
    return RoundShape(
        workers=workers,
        worker_gb_s=0.0,
        planner_memory_mb=settings.planner_memory_mb,
        aggregate_memory_mb=settings.aggregate_memory_mb,
        aggregators=max(1, aggregators),
        eval_only=eval_only,
        fanout=settings.fanout,
    )
