"""The ledger of what AWS bills a run: every Lambda attempt, init included, and every request it
made, recorded by the attempt itself; priced by `smlt.runtime.bill`, the one source of the rules.

Why one small item per attempt (`ATTEMPT#r#id`, written by the invocation as its last request):
only an invocation knows its own init, duration and requests, and every attempt is its own
invocation: a Step Functions retry, a duplicated delivery, a straggler abandoned by the Task's
timeout that keeps running, a worker whose record the seal refused. None of them is
first-writer-wins here, so each leaves its item; the item costs one write unit, about 6 % of the
Lambda request fee it accounts for. A handler that raises still writes it (the meter's
`finally`). An invocation that dies (killed at its timeout, out of memory) writes nothing: the
aggregator estimates it from the Map's outcomes (`estimated_attempts`): a time-out at the
function's timeout (what AWS bills it), any other crash at the longest attempt of its round.

The item cannot hold the time of its own PutItem: it holds an estimate (the median of this
process's last few such writes, `WRITE_PRIOR_S` before the first: one write slowed by a busy host
must not become the next estimate), and the process's next item of the same run
carries the correction (`corrects`, `correction_s`: the write's measured time minus the
estimate), applied when the ledger is read (`from_items`). So every attempt but the last of each
process in a run is exact to AWS's 1 ms billing granularity; the last keeps its estimate.

Init: `loaded_at` is a timestamp the handler module takes on its first line, before its imports;
the first call's `init_s` is the time from there to the call (on Lambda this leaves out the
runtime's own start before the module is imported, a few tens of ms; the REPORT line's
`Init Duration` is the check).
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import json
import logging
import math
import statistics
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from botocore.exceptions import ClientError
from pydantic import BaseModel, Field

from smlt.runtime import bill, clients, keys, retry
from smlt.runtime.items import Item
from smlt.runtime.prices import Prices
from smlt.runtime.retry import DYNAMODB_THROTTLES, error_code

log = logging.getLogger(__name__)

PREFIX = keys.ATTEMPT
RUN_LEVEL = "run"  # the sk part of attempts of no round (finalize, a raw upload's prepare)
WRITE_PRIOR_S = 0.005  # the ATTEMPT PutItem's time before this process has measured one
WRITE_WINDOW = 5  # the estimate is the median of this many of the process's last measured writes
UNBILLABLE = frozenset({"InvalidEvent"})  # an event the handler refused: its run_id is not to be trusted
# The ATTEMPT write is the invocation's last request, and the one the ledger cannot do without (an
# attempt with no item is priced at the function's timeout): it retries a throttle longer than
# botocore's 8 attempts, on its own client (no botocore retries), with full-jitter backoff, for up
# to WRITE_PATIENCE_S (at most half the invocation's remaining time).
WRITE_PATIENCE_S = 60.0
WRITE_BACKOFF_BASE_S = 0.025
WRITE_BACKOFF_CAP_S = 2.0


def round_prefix(rnd: int | None) -> str:
    return f"{PREFIX}{RUN_LEVEL if rnd is None else f'{rnd:06d}'}#"


class AttemptItem(Item):
    """One Lambda invocation as AWS bills it: its function, memory, init and duration, and the
    requests it made (by `service.Operation`, each HTTP request sent and billed, retries included;
    an S3 5xx or a DynamoDB throttle is not billed)."""

    function: str
    memory_mb: int
    op: str = ""  # the event's op ("plan", "aggregate", ...); "" for a worker
    round: int | None = None
    worker: int | None = None
    request_id: str = ""
    started_at: float = 0.0
    init_s: float = 0.0  # cold invocation only
    duration_s: float = 0.0  # handler time, its own ATTEMPT write included
    outcome: str = "ok"  # or the exception's name
    requests: dict[str, int] = Field(default_factory=dict)
    dynamodb_write_units: float = 0.0
    dynamodb_read_units: float = 0.0
    estimated: bool = False  # not recorded by the invocation: estimated by the aggregator
    write_s: float = 0.0  # the estimate of this item's own write included in duration_s
    # this process's previous item of the run (its sk) and the error of that item's write estimate
    corrects: str | None = None
    correction_s: float = 0.0
    key: str = ""  # the item's sk (set when read back: `from_items`)

    @property
    def billed_s(self) -> float:
        """What Lambda bills: init + duration, rounded up to the ms."""
        return math.ceil(round((self.init_s + self.duration_s) * 1000, 6)) / 1000

    @property
    def gb_s(self) -> float:
        return self.memory_mb / 1024 * self.billed_s


# ------------------------------------------------------------------------- the request counter


@dataclass
class _Tally:
    requests: Counter[str] = field(default_factory=Counter)
    write_units: float = 0.0
    read_units: float = 0.0


# One invocation at a time per process (as on Lambda): the requests of the one in progress,
# from any of its threads.
_TALLY = _Tally()


def _current_tally() -> _Tally:
    return _TALLY


# A DynamoDB throttle (retry.DYNAMODB_THROTTLES) consumed no capacity (nor do botocore's retries of
# it until one is served). S3 bills no 5xx answer (503 SlowDown included: "Billing for Amazon S3
# error responses").

# The request this thread sent last and what `_on_send` counted for it, until its answer is known.
_sent = threading.local()


def _on_send(request: Any, event_name: str = "", **_: Any) -> None:
    """botocore `before-send`: one HTTP request about to be sent (counted now: a request whose
    answer never comes may have been served; `_on_answer` takes back one AWS does not bill)."""
    service, operation = (event_name.split(".", 2) + ["", "", ""])[1:3]
    t = _current_tally()
    name = f"{service}.{operation}"
    t.requests[name] += 1
    w = 0.0
    if service == "dynamodb" and operation in bill.DYNAMODB_WRITES:
        body = request.body or b""
        items = len(_write_items(operation, body))
        w, _r = bill.dynamodb_units(operation, len(body), items, 0)
        t.write_units += w
    _sent.counted = (t, name, w)


def unbilled(service: str, status: int, body: bytes) -> bool:
    """Whether AWS bills no request for this answer: an S3 5xx (503 SlowDown), a DynamoDB
    throttle (HTTP 400 `ProvisionedThroughputExceededException`, `ThrottlingException`, ...)."""
    if service == "s3":
        return status >= 500
    if service == "dynamodb" and status == 400:
        try:
            kind = str(json.loads(body).get("__type", ""))
        except ValueError:
            return False
        return kind.rsplit("#", 1)[-1] in DYNAMODB_THROTTLES
    return False


def _on_answer(response_dict: Any = None, event_name: str = "", **_: Any) -> None:
    """botocore `before-parse`: the answer to the request this thread sent; one AWS does not bill
    is taken back out of the tally (botocore retries it, and the retry is counted when sent)."""
    counted = getattr(_sent, "counted", None)
    _sent.counted = None
    if counted is None or not isinstance(response_dict, dict):
        return
    service = (event_name.split(".", 2) + ["", ""])[1]
    body = response_dict.get("body", b"")
    if not unbilled(service, int(response_dict.get("status_code", 0)), body if isinstance(body, bytes) else b""):
        return
    t, name, w = counted
    t.requests[name] -= 1
    if t.requests[name] <= 0:
        del t.requests[name]
    t.write_units -= w


def _write_items(operation: str, body: Any) -> list[Any]:
    if operation not in ("TransactWriteItems", "BatchWriteItem"):
        return [None]
    import json

    try:
        doc = json.loads(body)
    except (ValueError, TypeError):
        return [None]
    if operation == "TransactWriteItems":
        return list(doc.get("TransactItems", []))
    return [w for ws in doc.get("RequestItems", {}).values() for w in ws]


def _on_dynamodb_read(http_response: Any = None, parsed: Any = None, model: Any = None, **_: Any) -> None:
    """botocore `after-call.dynamodb`: the read units of a read, from what it returned."""
    operation = getattr(model, "name", "")
    if operation not in bill.DYNAMODB_READS or not isinstance(parsed, dict):
        return
    if operation == "GetItem":
        items = 1
    elif operation == "BatchGetItem":
        items = sum(len(v) for v in parsed.get("Responses", {}).values())
    else:
        items = int(parsed.get("Count", len(parsed.get("Items", []))))
    size = len(getattr(http_response, "content", b"") or b"")
    _w, r = bill.dynamodb_units(operation, 0, items, size)
    _current_tally().read_units += r


_HANDLERS = (("before-send", _on_send), ("before-parse", _on_answer), ("after-call.dynamodb", _on_dynamodb_read))


def install() -> None:
    """Count this process's AWS requests: on every client smlt.runtime.clients makes (all of a
    handler's), those made already included."""
    for event, handler in _HANDLERS:
        clients.on_every_client(event, handler, f"smlt-ledger-{event}")


# ------------------------------------------------------------------------------- the meter


@dataclass
class Current:
    """The invocation in progress (the worker reads its init; the aggregator prices itself)."""

    started: float
    init_s: float
    memory_mb: int
    tally: _Tally

    def elapsed_s(self) -> float:
        return time.time() - self.started


_current: contextvars.ContextVar[Current | None] = contextvars.ContextVar("smlt_ledger_current", default=None)


def current() -> Current | None:
    return _current.get()


def init_s() -> float:
    """This invocation's init seconds (0 when warm or not metered)."""
    c = _current.get()
    return c.init_s if c else 0.0


@dataclass
class _Written:
    """This process's last ATTEMPT item: where, and how far off its write estimate was."""

    run_id: str
    key: str
    error_s: float


_LAST: _Written | None = None
_WRITES: deque[float] = deque(maxlen=WRITE_WINDOW)  # this process's last measured ATTEMPT writes, s


def write_estimate() -> float:
    """What this process's next ATTEMPT PutItem will take: the median of its last few."""
    return statistics.median(_WRITES) if _WRITES else WRITE_PRIOR_S


class Meter:
    """Wraps a Lambda handler: each call writes its ATTEMPT item into the run's table."""

    def __init__(self, loaded_at: float, table: Callable[[], str]):
        self.loaded_at = loaded_at
        self.table = table  # the table's name, read when the first item is written
        self.cold = True
        install()

    def __call__(self, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        @functools.wraps(fn)
        def handler(event: Any, context: Any) -> Any:
            return self.invoke(fn, event, context)

        return handler

    def invoke(self, fn: Callable[[Any, Any], Any], event: Any, context: Any) -> Any:
        started = time.time()
        init = max(0.0, started - self.loaded_at) if self.cold else 0.0
        self.cold = False
        memory = int(getattr(context, "memory_limit_in_mb", 0) or 0)
        global _TALLY
        _TALLY = _Tally()
        cur = Current(started, init, memory, _TALLY)
        token = _current.set(cur)
        result, outcome = None, "ok"
        try:
            result = fn(event, context)
            return result
        except Exception as e:
            outcome = type(e).__name__
            raise
        finally:
            try:
                self._record(event, result, context, cur, outcome)
            except Exception:  # noqa: BLE001 - the ledger never fails the invocation it records
                log.exception("could not record this invocation's ATTEMPT item")
            finally:
                _current.reset(token)

    def _record(self, event: Any, result: Any, context: Any, cur: Current, outcome: str) -> None:
        where = None if outcome in UNBILLABLE else _where(event, result)
        from smlt.runtime.records import RunTable  # boto3 clients: after the counter is installed

        first = None if where is not None or outcome in UNBILLABLE else _first_plan(event)
        if first is not None:
            meta = RunTable(self.table(), first[0]).meta()
            if meta is not None and meta.execution == first[1]:
                # a first plan that failed after its execution created the run (Infeasible): the
                # run pays for it; not a bad job naming another execution's run
                where = (first[0], None, None, "plan")
        if where is None:  # a few ms of Lambda: not written into a run the event may not be part of
            if first is None:
                log.warning("no run to bill this invocation to (an event without a valid run_id)")
            return  # else a first plan refused before its run existed (a bad job): no run to bill
        run_id, rnd, worker, op = where
        tally = cur.tally
        request_id = str(getattr(context, "aws_request_id", "") or uuid.uuid4())
        last = _LAST if _LAST is not None and _LAST.run_id == run_id else None
        estimate = write_estimate()
        key = f"{round_prefix(rnd)}{request_id}#{uuid.uuid4().hex[:8]}"
        # its client made now if this process has none yet: it is billed time
        table = RunTable(self.table(), run_id, client=_write_client())
        give_up = time.monotonic() + _patience_s(context)
        for attempt in itertools.count(1):
            t_end = time.time()  # each try bills the time of the ones throttled before it
            item = AttemptItem(
                function=str(getattr(context, "function_name", "")),
                memory_mb=cur.memory_mb,
                op=op,
                round=rnd,
                worker=worker,
                request_id=request_id,
                started_at=cur.started,
                init_s=cur.init_s,
                duration_s=t_end - cur.started + estimate,
                outcome=outcome,
                # this PutItem itself: one request, one write unit (a throttled try is not billed)
                requests=dict(tally.requests + Counter({"dynamodb.PutItem": 1})),
                dynamodb_write_units=tally.write_units + 1.0,
                dynamodb_read_units=tally.read_units,
                write_s=estimate,
                corrects=last.key if last else None,
                correction_s=last.error_s if last else 0.0,
            )
            try:
                table.put_once(key, item)
                break
            except ClientError as e:
                pause = backoff_s(attempt)
                if error_code(e) not in DYNAMODB_THROTTLES:
                    raise
                if time.monotonic() + pause > give_up:
                    raise
                log.warning("the ATTEMPT item's write was throttled (try %d): again in %.2f s", attempt, pause)
                time.sleep(pause)
        _written(run_id, key, time.time() - t_end, estimate)


def _patience_s(context: Any) -> float:
    """How long the ATTEMPT write may keep retrying a throttle: `WRITE_PATIENCE_S`, at most half
    the invocation's remaining time (the Lambda context's)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if not callable(remaining):
        return WRITE_PATIENCE_S
    return min(WRITE_PATIENCE_S, max(0.0, remaining() / 1000 / 2))


def backoff_s(attempt: int) -> float:
    """The pause before the ATTEMPT write's retry number `attempt`: full jitter below an exponential cap."""
    return retry.backoff_s(attempt, WRITE_BACKOFF_BASE_S, WRITE_BACKOFF_CAP_S)


def _write_client() -> Any:
    """This process's client for its ATTEMPT writes: no botocore retries, `_record` retries them."""
    return clients.unretried("dynamodb")


def _written(run_id: str, key: str, write_s: float, estimate: float) -> None:
    """Remember the write just measured: its error corrects its item, its time the next estimate."""
    global _LAST
    _LAST = _Written(run_id, key, write_s - estimate)
    _WRITES.append(write_s)


def _where(event: Any, result: Any) -> tuple[str, int | None, int | None, str] | None:
    """(run_id, round, worker, op) of an invocation, from its event or its answer."""
    ev = event if isinstance(event, dict) else {}
    res = result if isinstance(result, dict) else {}
    run_id = ev.get("run_id") or res.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        return None
    rnd = ev.get("round", res.get("round"))
    worker = ev.get("worker")
    op = str(ev.get("op", "")) if "op" in ev else ("" if "worker" in ev else "aggregate")
    return (
        run_id,
        int(rnd) if isinstance(rnd, int) else None,
        int(worker) if isinstance(worker, int) else None,
        op,
    )


def _first_plan(event: Any) -> tuple[str, str] | None:
    """(run id, execution) of a plan's event without its own `run_id`: its job's `run_id`, else
    the execution's name, as the planner takes them."""
    ev = event if isinstance(event, dict) else {}
    if ev.get("op") != "plan" or ev.get("run_id"):
        return None
    job = ev.get("job")
    execution = ev.get("execution") or "run"  # PlanEvent's default
    run_id = (job.get("run_id") if isinstance(job, dict) else None) or execution
    return (run_id, execution) if isinstance(run_id, str) and isinstance(execution, str) and run_id else None


# ------------------------------------------------------------------------------ assembly


def from_items(raw: Iterable[dict[str, Any]]) -> list[AttemptItem]:
    """The ATTEMPT items of a query, each write estimate corrected by the process's next item, and
    an estimated attempt left out once its worker's own item of that round is there."""
    items = [AttemptItem.model_validate({**r, "key": r.get("sk", "")}) for r in raw]
    by_key = {a.key: a for a in items}
    for a in items:
        target = by_key.get(a.corrects or "")
        if target is not None:
            by_key[target.key] = target.model_copy(update={"duration_s": target.duration_s + a.correction_s})
    # An estimate stands for an attempt that had left no item when its round was priced; a straggler
    # the Map abandoned (`States.Timeout`) keeps running and writes its item later: it replaces the
    # estimate (priced at the function's timeout) instead of being billed beside it.
    recorded = {(a.round, a.worker) for a in items if not a.estimated and a.worker is not None}
    return [
        by_key.get(a.key, a) if a.key else a for a in items if not (a.estimated and (a.round, a.worker) in recorded)
    ]


class CostBreakdown(BaseModel):
    """What AWS would bill, item by item (metrics.json's `cost_breakdown`)."""

    lambda_invocations: int = 0
    estimated_invocations: int = 0  # of them, not recorded by the invocation (crashed, killed)
    lambda_gb_s: float = 0.0  # init included
    lambda_init_gb_s: float = 0.0
    lambda_usd: float = 0.0
    transitions: float = 0.0
    sfn_usd: float = 0.0
    s3_puts: int = 0
    s3_gets: int = 0
    s3_usd: float = 0.0
    dynamodb_requests: int = 0
    dynamodb_write_units: float = 0.0
    dynamodb_read_units: float = 0.0
    dynamodb_usd: float = 0.0
    logs_gb: float = 0.0  # estimated (smlt.runtime.bill.logs_gb)
    logs_usd: float = 0.0
    xray_traces: int = 0  # an upper bound: one per invocation
    xray_usd: float = 0.0
    total_usd: float = 0.0

    def __add__(self, other: CostBreakdown) -> CostBreakdown:
        a, b = self.model_dump(), other.model_dump()
        return CostBreakdown.model_validate({k: a[k] + b[k] for k in a})


def requests_by_service(attempts: Iterable[AttemptItem]) -> Counter[str]:
    total: Counter[str] = Counter()
    for a in attempts:
        total.update(a.requests)
    return total


def breakdown(attempts: list[AttemptItem], transitions: float, prices: Prices, architecture: str) -> CostBreakdown:
    """The bill of these attempts and `transitions` state transitions."""
    reqs = requests_by_service(attempts)
    s3 = Counter(bill.s3_tier(k.split(".", 1)[1]) for k, v in reqs.items() if k.startswith("s3.") for _ in range(v))
    ddb = sum(v for k, v in reqs.items() if k.startswith("dynamodb."))
    gb_s = sum(a.gb_s for a in attempts)
    init_gb_s = sum(a.memory_mb / 1024 * a.init_s for a in attempts)
    wu = sum(a.dynamodb_write_units for a in attempts)
    ru = sum(a.dynamodb_read_units for a in attempts)
    n = len(attempts)
    lambda_usd = gb_s * prices.lambda_gb_second[architecture] + n * prices.lambda_request
    sfn_usd = transitions * prices.sfn_transition
    s3_usd = s3["put"] * prices.s3_put + s3["get"] * prices.s3_get
    ddb_usd = wu * prices.dynamodb_write_unit + ru * prices.dynamodb_read_unit
    logs = float(bill.logs_gb(n, transitions))
    logs_usd = logs * prices.logs_ingestion_gb
    xray_usd = n * prices.xray_trace
    return CostBreakdown(
        lambda_invocations=n,
        estimated_invocations=sum(1 for a in attempts if a.estimated),
        lambda_gb_s=gb_s,
        lambda_init_gb_s=init_gb_s,
        lambda_usd=lambda_usd,
        transitions=transitions,
        sfn_usd=sfn_usd,
        s3_puts=s3["put"],
        s3_gets=s3["get"],
        s3_usd=s3_usd,
        dynamodb_requests=ddb,
        dynamodb_write_units=wu,
        dynamodb_read_units=ru,
        dynamodb_usd=ddb_usd,
        logs_gb=logs,
        logs_usd=logs_usd,
        xray_traces=n,
        xray_usd=xray_usd,
        total_usd=lambda_usd + sfn_usd + s3_usd + ddb_usd + logs_usd + xray_usd,
    )


# ------------------------------------------------------------------------ a round, a run

TIMEOUTS = frozenset({"Sandbox.Timedout", "States.Timeout"})
# Lambda refused the invocation (the account's concurrency): the handler never ran, so the
# attempt bills its request and no duration (Step Functions' error name, and Lambda's own).
THROTTLES = frozenset({"Lambda.TooManyRequestsException", "TooManyRequestsException"})


def estimate_missing(
    workers: int,
    memory_mb: int,
    rnd: int,
    attempts: list[AttemptItem],
    outcomes: list[dict[str, Any]],
    timeout_s: float,
) -> list[AttemptItem]:
    """An estimated attempt for each worker that left no ATTEMPT item (its process was killed or
    died, or it was throttled): AWS bills a time-out its timeout and a throttled invocation no
    duration; any other crash is charged the longest attempt seen this round (the function's
    timeout when none was), and its requests are not known."""
    seen = {a.worker for a in attempts if a.worker is not None}
    errors = {o.get("worker"): o.get("error") for o in outcomes if not o.get("ok", True)}
    longest = max((a.init_s + a.duration_s for a in attempts if a.worker is not None), default=timeout_s)
    return [
        AttemptItem(
            function="",
            memory_mb=memory_mb,
            round=rnd,
            worker=w,
            request_id=f"estimated-{rnd}-{w}",
            duration_s=timeout_s if errors.get(w) in TIMEOUTS else 0.0 if errors.get(w) in THROTTLES else longest,
            outcome=str(errors.get(w) or "unrecorded"),
            estimated=True,
        )
        for w in range(workers)
        if w not in seen
    ]


def round_transitions(attempts: list[AttemptItem], shape: bill.RoundShape) -> float:
    """The state transitions of a round: the round's states once per pass through it (a quorum
    retry plans the same round again and runs its Map again), and one per Step Functions retry of
    a worker (a new request id; a duplicated delivery is the same Task, no transition)."""
    passes = max(1, sum(1 for a in attempts if a.op == "plan" and a.outcome == "ok"))
    worker_ids = {a.request_id for a in attempts if a.worker is not None}
    retries = max(0, len(worker_ids) - int(shape.workers) * passes)
    return passes * float(bill.requests(shape).transitions) + retries


# Per execution: Start (Pass), HowToStart (Choice); at the end of a run: Plan's stop, ShouldTrain,
# Finalize, Done. A raw upload's run also passes PrepareData and DataPrepared once per attempt.
EXECUTION_TRANSITIONS = 2
PREPARE_TRANSITIONS = 2
PREPARE_OP = "prepare_data"  # the Prepare function's event op (smlt.runtime.steps.events)


def run_transitions(executions: int, prepared: int = 0) -> float:
    return EXECUTION_TRANSITIONS * max(1, executions) + PREPARE_TRANSITIONS * prepared + bill.FINALIZE_TRANSITIONS


def by_round(attempts: Iterable[AttemptItem]) -> dict[int | None, list[AttemptItem]]:
    out: dict[int | None, list[AttemptItem]] = {}
    for a in attempts:
        out.setdefault(a.round, []).append(a)
    return out


def in_progress(memory_mb: int, extra_requests: dict[str, int], op: str) -> AttemptItem | None:
    """The running invocation as its ATTEMPT item will be (plus `extra_requests` still to make,
    and its own item's write): what an aggregator adds for itself to the round it prices."""
    cur = current()
    if cur is None:
        return None
    reqs = cur.tally.requests + Counter(extra_requests) + Counter({"dynamodb.PutItem": 1})
    return AttemptItem(
        function="",
        memory_mb=cur.memory_mb or memory_mb,
        op=op,
        init_s=cur.init_s,
        duration_s=cur.elapsed_s() + write_estimate(),
        requests=dict(reqs),
        dynamodb_write_units=cur.tally.write_units
        + sum(v for k, v in extra_requests.items() if k.startswith("dynamodb."))
        + 1.0,
        dynamodb_read_units=cur.tally.read_units,
    )


@dataclass(frozen=True)
class RoundOf:
    """What the run's ledger needs of an aggregated round (its ROUND item)."""

    round: int
    shape: bill.RoundShape


def run_ledger(
    attempts: list[AttemptItem], rounds: list[RoundOf], executions: int, prices: Prices, architecture: str
) -> tuple[dict[int, CostBreakdown], CostBreakdown]:
    """Each aggregated round's bill and the run's (every attempt, of every round, and the run's
    own: its executions' start, the stop plan, Finalize)."""
    grouped = by_round(attempts)
    per_round: dict[int, CostBreakdown] = {}
    for r in rounds:
        mine = grouped.pop(r.round, [])
        per_round[r.round] = breakdown(mine, round_transitions(mine, r.shape), prices, architecture)
    rest = [a for group in grouped.values() for a in group]  # finalize, a stop plan's round, prepare
    prepared = sum(1 for a in rest if a.op == PREPARE_OP)
    total = breakdown(rest, run_transitions(executions, prepared), prices, architecture)
    for bd in per_round.values():
        total = total + bd
    return per_round, total


# --------------------------------------------------------------------------- what a round count is


class _Aggregated(Protocol):
    round: int
    eval_only: bool
    diverged: bool
    accepted: list[Any]


def trained(r: _Aggregated) -> bool:
    """Whether an aggregated round (its ROUND item) trained the model: it applied at least one
    update. An evaluation-only round, a diverged one (model r carried over) and one whose updates
    all failed or were refused did not."""
    return bool(r.accepted) and not r.eval_only and not r.diverged


_R = TypeVar("_R", bound=_Aggregated)


def trained_into(rounds: Iterable[_R], model: int | None) -> list[_R]:
    """The training rounds that made model `model` (rounds 0 .. model-1 make model `model`; round
    r's metrics measure model r); none when there is no final model."""
    return [] if model is None else [r for r in rounds if r.round < model and trained(r)]


def rounds_in_model(rounds: Iterable[_Aggregated], model: int | None) -> int:
    """How many rounds `trained_into` model `model`: what a run reports as its `rounds`
    (FinalMetrics), `smlt run`'s summary and `smlt verify` say "trained into the final model"."""
    return len(trained_into(rounds, model))


def rounds_said(aggregated: int, in_model: int) -> str:
    """How `smlt run` and `smlt verify` name a run's rounds: every aggregated round (ROUND item,
    round 0 and an evaluation-only round included), and of them those trained into the final
    model when that differs (the last round trains a model the run does not measure)."""
    said = f"{aggregated} round{'s' * (aggregated != 1)}"
    return said if aggregated == in_model else f"{said} ({in_model} trained into the final model)"


# ------------------------------------------------------------------- an estimate shown as one


def estimate_note(raw: Iterable[dict[str, Any]], prices: Prices, architecture: str) -> str:
    """What part of a round's price (its ATTEMPT items, `raw`) is an estimate, and why, for the
    round's progress line. A round priced while a worker the Map stopped waiting for may still run
    bills that worker at the function's timeout (AWS bills a time-out that much, and nothing stops
    the worker sooner), a worker that died at the round's longest attempt; the worker's own item
    replaces the estimate when it comes (`from_items`), and the next round's total is corrected
    (`late`), so a line printed after that says the estimate is settled. "" when nothing was estimated."""
    items = [AttemptItem.model_validate(r) for r in raw]
    estimates = sorted((a for a in items if a.estimated), key=lambda a: a.worker if a.worker is not None else -1)
    if not estimates:
        return ""
    usd = breakdown(estimates, 0.0, prices, architecture).total_usd
    recorded = {a.worker for a in items if not a.estimated and a.worker is not None}
    by_why: dict[str, list[str]] = {}
    for a in estimates:
        if a.outcome in TIMEOUTS:
            why = f"abandoned at its time limit, priced at the function's {a.duration_s:.0f} s timeout"
        elif a.outcome in THROTTLES:
            why = "throttled, no duration"
        else:
            why = f"left no item ({a.outcome}), priced at the round's longest attempt, {a.duration_s:.1f} s"
        if a.worker in recorded:
            why += ": its own item has replaced the estimate since, the next round's total corrects it"
        else:
            why += " until its own item replaces it"
        by_why.setdefault(why, []).append(str(a.worker))
    said = "; ".join(f"worker{'s' * (len(ws) > 1)} {', '.join(ws)} {why}" for why, ws in by_why.items())
    return f"of it ${usd:.5f} estimated ({said})"
