"""AWS's write conflicts and throttling, injected into a handler process's S3 and DynamoDB requests.

moto serialises every request (and the local engine locks DynamoDB), so the races AWS answers
with a conflict never happen locally. With ``--faults "s3_conflict=R,ddb_conflict=R"`` a
botocore ``before-send`` handler, registered first on boto3's default session of every handler
process (botocore's event API), answers a write with the error AWS gives, before it reaches moto
(nothing is stored, as on AWS), so smlt's own retry code (smlt/runtime/retry.py) is what gets it through:

- S3 PutObject with ``If-None-Match``: HTTP 409 ``ConditionalRequestConflict``;
- DynamoDB TransactWriteItems: ``TransactionCanceledException`` whose ``CancellationReasons``
  hold ``TransactionConflict`` for one item and ``None`` for the others;
- DynamoDB PutItem / UpdateItem: ``TransactionConflictException``.

And the throttling a wide round meets on AWS (``--faults "s3_slowdown=R,ddb_throttle=R"``), on
any request of the service: S3's HTTP 503 ``SlowDown`` (beyond 3,500 PUT or 5,500 GET a second
per prefix, or while S3 scales a prefix up) and DynamoDB's HTTP 400
``ProvisionedThroughputExceededException`` (beyond a partition's 1,000 write or 3,000 read units a
second: a run's items share one partition key). botocore's retries (smlt.runtime.clients) are
what gets them through; AWS bills neither answer, nor does the ledger (smlt.runtime.ledger).

And Step Functions' API throttling (``--faults "sfn_throttle=R"``), on any Step Functions request
(StartExecution, DescribeExecution, GetExecutionHistory, ...): HTTP 400 ``ThrottlingException``
("Rate exceeded"). On AWS each API action has its own token bucket per account and Region
(docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html, "Quotas related to API action
throttling"; the API reference's common errors: ``ThrottlingException``, HTTP 400), so Chain's
StartExecution is refused once a bucket runs dry; moto never refuses. Tests arm the same
handler in their own process (:func:`install`, :func:`arm`) to throttle the CLI's polls.

The engine passes the settings per invocation in the handler's environment (``ENV``, JSON:
the two rates, a seed for this invocation, and a directory where each injected conflict is
tallied so the parent can count them); :func:`arm` reads them before the handler runs.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.awsrequest import AWSResponse

from smlt.local.responses import RawBody, put_first

ENV = "SMLT_FAULT_CONFLICTS"
EVENT = "before-send"
KINDS = ("s3_conflict", "ddb_conflict", "s3_slowdown", "ddb_throttle", "sfn_throttle")


@dataclass
class Plan:
    """The conflict rates of one invocation and the generator that draws them."""

    rates: dict[str, float]
    seed: int = 0
    tally: str | None = None  # a directory: one line per injected conflict, in a file per process
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def draw(self, kind: str) -> bool:
        rate = self.rates.get(kind, 0.0)
        if not rate or self.rng.random() >= rate:
            return False
        if self.tally:
            with open(Path(self.tally) / f"{os.getpid()}.log", "a") as f:
                f.write(kind + "\n")  # one short O_APPEND write: lines never interleave
        return True

    def env(self) -> dict[str, str]:
        return {ENV: json.dumps({"rates": self.rates, "seed": self.seed, "tally": self.tally})}


_plan: Plan | None = None


def arm(plan: Plan | None) -> None:
    """Inject with `plan` from now on (None: stop injecting)."""
    global _plan
    _plan = plan


def arm_from_env(environ: Any = os.environ) -> None:
    """What a handler process does before each invocation: the settings the engine sent, if any."""
    raw = environ.get(ENV)
    if not raw:
        arm(None)
        return
    spec = json.loads(raw)
    arm(Plan(rates=spec["rates"], seed=int(spec["seed"]), tally=spec.get("tally")))


def tallied(directory: str | os.PathLike[str]) -> dict[str, int]:
    """The conflicts injected so far by every process writing into `directory`, by kind."""
    counts = dict.fromkeys(KINDS, 0)
    for log in Path(directory).glob("*.log"):
        for line in log.read_text().split():
            if line in counts:
                counts[line] += 1
    return counts


def install(session: Any = None) -> None:
    """Register the handler first on boto3's default session (or `session`): every client made
    from it afterwards carries it. A no-op until :func:`arm`; a second call is a no-op."""
    put_first(EVENT, _before_send, "smlt-local-conflicts", session)


def _before_send(request: Any, event_name: str = "", **_: Any) -> AWSResponse | None:
    plan = _plan
    if plan is None:
        return None
    _event, service, operation = (event_name.split(".") + ["", ""])[:3]
    if service == "s3" and plan.draw("s3_slowdown"):
        return _s3_slowdown(request)
    if service == "dynamodb" and plan.draw("ddb_throttle"):
        return _dynamodb_throttled(request)
    if service == "sfn" and plan.draw("sfn_throttle"):
        return _sfn_throttled(request)
    if service == "s3" and operation == "PutObject" and "If-None-Match" in request.headers:
        return _s3_conflict(request) if plan.draw("s3_conflict") else None
    if service == "dynamodb" and operation in ("TransactWriteItems", "PutItem", "UpdateItem"):
        return _dynamodb_conflict(request, operation, plan) if plan.draw("ddb_conflict") else None
    return None


def _s3_slowdown(request: Any) -> AWSResponse:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        b"<Message>Please reduce your request rate.</Message><RequestId>smlt-local-fault</RequestId></Error>"
    )
    headers = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
    return AWSResponse(request.url, 503, headers, RawBody(body))


def _dynamodb_throttled(request: Any) -> AWSResponse:
    payload = {
        "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
        "message": "The level of configured provisioned throughput for the table was exceeded. "
        "Consider increasing your provisioning level with the UpdateTable API.",
    }
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/x-amz-json-1.0", "Content-Length": str(len(body))}
    return AWSResponse(request.url, 400, headers, RawBody(body))


def _sfn_throttled(request: Any) -> AWSResponse:
    """Step Functions' answer to a request beyond its API action's token bucket."""
    body = json.dumps({"__type": "ThrottlingException", "message": "Rate exceeded"}).encode()
    headers = {"Content-Type": "application/x-amz-json-1.0", "Content-Length": str(len(body))}
    return AWSResponse(request.url, 400, headers, RawBody(body))


def _s3_conflict(request: Any) -> AWSResponse:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ConditionalRequestConflict</Code>'
        b"<Message>A conflicting conditional operation is currently in progress against this resource. "
        b"Please try again.</Message><RequestId>smlt-local-fault</RequestId></Error>"
    )
    headers = {"Content-Type": "application/xml", "Content-Length": str(len(body))}
    return AWSResponse(request.url, 409, headers, RawBody(body))


def _dynamodb_conflict(request: Any, operation: str, plan: Plan) -> AWSResponse:
    prefix = "com.amazonaws.dynamodb.v20120810#"
    if operation == "TransactWriteItems":
        n = len(json.loads(request.body or b"{}").get("TransactItems", [])) or 1
        hit = plan.rng.randrange(n)  # the item another transaction held
        reasons = [
            {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
            if i == hit
            else {"Code": "None"}
            for i in range(n)
        ]
        codes = ", ".join(r["Code"] for r in reasons)
        payload: dict[str, Any] = {
            "__type": prefix + "TransactionCanceledException",
            "message": f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]",
            "CancellationReasons": reasons,
        }
    else:
        payload = {
            "__type": prefix + "TransactionConflictException",
            "message": "Transaction is ongoing for the item",
        }
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/x-amz-json-1.0", "Content-Length": str(len(body))}
    return AWSResponse(request.url, 400, headers, RawBody(body))
