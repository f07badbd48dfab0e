"""The Invoke seam: moto's ASL interpreter calls Lambda with a boto3 client
(``boto_client_for(...).invoke``, see moto/stepfunctions/parser/asl/component/state/exec/
state_task/lambda_eval_utils.py). A botocore handler on ``before-send.lambda.Invoke``, registered
*first* on boto3's default session (the one ``boto3.client`` uses, botocore's event API), answers
those calls before anything is sent (and before moto's own stubber, a built-in handler), by running
the function's handler in the :class:`~smlt.local.pool.WorkerPool`.

Responses are what Lambda returns, so Step Functions sees what it sees on AWS:

- success: 200 with the JSON payload;
- the handler raised: 200, ``X-Amz-Function-Error: Unhandled`` and the Lambda error payload
  ``{"errorType": <exception class name>, "errorMessage": str(e), "stackTrace": [...]}``;
  Retry/Catch match ``errorType`` as the ``Error`` name;
- the handler ran past the function's Timeout: ``errorType`` ``Sandbox.Timedout`` (the stuck
  process is replaced);
- response over 6 MB: ``Function.ResponseSizeTooLarge``; request over 6 MB: HTTP 413
  ``RequestEntityTooLargeException``;
- throttled (fault injection): HTTP 429 ``TooManyRequestsException``, which the interpreter
  reports as ``Lambda.TooManyRequestsException``;
- killed (fault injection, ``kill``): the handler process dies by SIGKILL after the handler ran,
  before answering: ``Runtime.ExitError``, as a Lambda sandbox that is OOM-killed; ``crash:K``: it
  dies the same way right after the handler's K-th write (S3 or DynamoDB), in the middle of its work.

A handler runs with the function's environment and ``SMLT_LAMBDA_LIMITS=1``: a user's model code
(``--code``) meets a Lambda's limits there (writes outside /tmp fail with EROFS, multiprocessing's
semaphores with ENOSYS: ``smlt.runtime.worker_limits.lambda_limits``), as it would on AWS.

Only requests addressed to a running engine's endpoint are answered; any other Lambda call
(another endpoint, no engine running) passes through untouched. Engines of one process share
the endpoint; a call goes to the engine that has the function.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from botocore.awsrequest import AWSResponse

from smlt.local import throttle
from smlt.local.responses import RawBody, put_first
from smlt.runtime.worker_limits import LIMITS_ENV

from .functions import FunctionSpec
from .pool import InvokeOutcome, WorkerPool, timeout_payload

EVENT = "before-send.lambda.Invoke"
MAX_INVOKE_PAYLOAD = 6 * 1024 * 1024  # 6 MB, synchronous request and response
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
ACTIONS = ("ok", "fail", "throttle", "duplicate", "timeout", "kill", "crash")  # crash as "crash:K"

InvokeFilter = Callable[[str, Any], str]
# Told (function name, request payload, ok) when a synchronous invocation returns, before the state
# machine goes on (the runner saves the local state after every aggregation).
AfterInvoke = Callable[[str, bytes, bool], None]


@dataclass(frozen=True)
class Billed:
    """One handler run as Lambda would bill it, measured by the handler process around the call
    (the engine's own record: no smlt.runtime.ledger code is involved). A duplicated invocation is two;
    a throttled one none (Lambda bills nothing); a process that was killed or died, its wall time."""

    function: str
    request_id: str
    memory_mb: int
    init_s: float
    duration_s: float
    outcome: str
    measured: bool = True  # False: the process was killed or died, `duration_s` is the wall time


def _response(url: str, status: int, body: bytes, headers: dict[str, str]) -> AWSResponse:
    hdrs = {"Content-Type": "application/json", "Content-Length": str(len(body)), **headers}
    return AWSResponse(url, status, hdrs, RawBody(body))


def _client_error(url: str, status: int, code: str, message: str, request_id: str, **extra: Any) -> AWSResponse:
    body = json.dumps({"Type": "User", "message": message, **extra}).encode()
    return _response(url, status, body, {"x-amzn-ErrorType": code, "x-amzn-RequestId": request_id})


def parse_function_name(url: str) -> tuple[str, str | None]:
    """(function name, qualifier) from an Invoke URL ``/2015-03-31/functions/{name}/invocations``.
    The name may be a name, a partial ARN or a full ARN, with or without a qualifier."""
    parts = urlsplit(url)
    segs = parts.path.split("/")
    try:
        raw = unquote(segs[segs.index("functions") + 1])
    except (ValueError, IndexError):
        raise ValueError(f"not a Lambda Invoke URL: {url}") from None
    qualifier: str | None = next(iter(parse_qs(parts.query).get("Qualifier", [])), None)
    if raw.startswith("arn:"):
        fields = raw.split(":")
        name = fields[6] if len(fields) > 6 else raw
        if len(fields) > 7:
            qualifier = qualifier or fields[7]
    elif ":" in raw:
        bits = raw.split(":")
        if len(bits) >= 3 and bits[1] == "function":  # account:function:name[:qualifier]
            name = bits[2]
            qualifier = qualifier or (bits[3] if len(bits) > 3 else None)
        else:
            name, qualifier = bits[0], qualifier or bits[1]
    else:
        name = raw
    return name, qualifier


class InvokeRouter:
    """Answers Lambda Invoke calls addressed to one engine's endpoint."""

    def __init__(
        self,
        functions: dict[str, FunctionSpec],
        pool: WorkerPool,
        port: int,
        env_for: Callable[[FunctionSpec], dict[str, str]],
        invoke_filter: InvokeFilter | None = None,
    ) -> None:
        self.functions = {spec.name: spec for spec in functions.values()}
        self.pool = pool
        self.port = port
        self.env_for = env_for
        self.invoke_filter = invoke_filter
        self.after_invoke: AfterInvoke | None = None
        self.output: str | None = None  # a file for the handlers' prints (LocalEngine.handler_output)
        self.calls: list[tuple[str, float, str]] = []  # (function name, seconds, outcome)
        self.billed: list[Billed] = []  # every handler run, as Lambda bills it
        # diagnostics: a list to fill with one record per invocation (see LocalEngine.trace)
        self.trace: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def owns(self, url: str) -> bool:
        parts = urlsplit(url)
        return parts.port == self.port and (parts.hostname or "") in LOCAL_HOSTS

    def _job(self, spec: FunctionSpec, payload: bytes, request_id: str, **extra: Any) -> dict:
        return {
            "function": spec.name,
            "arn": spec.arn,
            "memory": spec.memory,
            "module_file": spec.module_file,
            "module_name": spec.handler.rsplit(".", 1)[0],
            "attr": spec.attr,
            "package": spec.package,
            "code_dir": spec.code_dir,
            "cwd": spec.code_dir,
            # LIMITS_ENV: the user's code meets a Lambda's read-only files and missing
            # /dev/shm here too (its writes outside /tmp, multiprocessing's semaphores: OSError as on AWS)
            "env": {**self.env_for(spec), LIMITS_ENV: "1"},
            "payload": payload,
            "request_id": request_id,
            "output": self.output,
            **extra,
        }

    def invoke(self, spec: FunctionSpec, payload: bytes, request_id: str, action: str = "ok") -> InvokeOutcome:
        """Run the function (applying a fault action) and return the outcome."""
        if spec.kind == "unsupported":
            body = json.dumps(
                {
                    "errorType": "Runtime.ImportModuleError",
                    "errorMessage": f"{spec.name} cannot run locally: {spec.problem}",
                }
            )
            return InvokeOutcome(False, body.encode(), 0.0, "Runtime.ImportModuleError")
        extra: dict[str, Any] = {}
        if action == "fail":
            extra["fault"] = "fail"
        elif action == "duplicate":
            extra["repeat"] = 2
        elif action == "kill":  # the handler process dies after its work: Runtime.ExitError (smlt/faults.py)
            extra["fault"] = "kill"
        elif action.startswith("crash:"):  # ... or right after its K-th write
            extra["fault"], extra["crash_after"] = "crash", int(action.partition(":")[2])
        if self.trace is not None:
            extra["trace"] = True
        out = self.pool.run(self._job(spec, payload, request_id, **extra), spec.timeout)
        if action == "timeout" and out.error_type != "Sandbox.Timedout":
            # the handler ran (its side effects stay, as when a function finishes its work but
            # misses the deadline); the invocation reports the timeout
            out = replace(
                out, ok=False, payload=timeout_payload(request_id, spec.timeout), error_type="Sandbox.Timedout"
            )
        if out.ok and len(out.payload) > MAX_INVOKE_PAYLOAD:
            too_large = json.dumps(
                {
                    "errorType": "Function.ResponseSizeTooLarge",
                    "errorMessage": "Response payload size exceeded maximum allowed payload size "
                    f"({MAX_INVOKE_PAYLOAD} bytes).",
                }
            ).encode()
            out = replace(out, ok=False, payload=too_large, error_type="Function.ResponseSizeTooLarge")
        self._bill(spec, request_id, out)
        return out

    def _bill(self, spec: FunctionSpec, request_id: str, out: InvokeOutcome) -> None:
        outcome = "ok" if out.ok else (out.error_type or "error")
        runs = [Billed(spec.name, request_id, spec.memory, i, d, outcome) for i, d in out.billed or []]
        if not runs:
            runs = [Billed(spec.name, request_id, spec.memory, 0.0, out.seconds, outcome, measured=False)]
        with self._lock:
            self.billed.extend(runs)

    def handle(self, request: Any) -> AWSResponse:
        t0 = time.perf_counter()
        url = request.url
        rid = str(uuid.uuid4())
        name, _qualifier = parse_function_name(url)
        spec = self.functions.get(name)
        if spec is None:
            return _client_error(url, 404, "ResourceNotFoundException", f"Function not found: {name}", rid)
        body = request.body or b""
        if hasattr(body, "read"):
            body = body.read()
        if isinstance(body, str):
            body = body.encode()
        if len(body) > MAX_INVOKE_PAYLOAD:
            return _client_error(
                url,
                413,
                "RequestEntityTooLargeException",
                f"Request must be smaller than {MAX_INVOKE_PAYLOAD} bytes for the InvokeFunction operation",
                rid,
            )
        action = "ok"
        if self.invoke_filter is not None:
            try:
                event = json.loads(body) if body else {}
            except ValueError:
                event = body
            action = self.invoke_filter(name, event) or "ok"
            if action.partition(":")[0] not in ACTIONS:
                raise ValueError(f"invoke_filter returned {action!r}; expected one of {ACTIONS}")
        if action == "throttle":
            self._record(name, t0, "throttle")
            return _client_error(
                url,
                429,
                "TooManyRequestsException",
                "Rate Exceeded.",
                rid,
                Reason="ReservedFunctionConcurrentInvocationLimitExceeded",
            )
        headers = {"x-amzn-RequestId": rid, "X-Amz-Executed-Version": "$LATEST"}
        itype = request.headers.get("X-Amz-Invocation-Type") or b"RequestResponse"
        itype = itype.decode() if isinstance(itype, bytes) else itype
        if itype == "DryRun":
            return _response(url, 204, b"", headers)
        if itype == "Event":
            threading.Thread(
                target=self.invoke, args=(spec, body, rid, action), daemon=True, name=f"smlt-event-{name}"
            ).start()
            return _response(url, 202, b"", headers)
        if not throttle.acquire():  # the account's concurrency limit (smlt.local.throttle)
            self._record(name, t0, "throttle")
            return _client_error(
                url, 429, "TooManyRequestsException", "Rate Exceeded.", rid, Reason="ConcurrentInvocationLimitExceeded"
            )
        started = time.time()
        try:
            out = self.invoke(spec, body, rid, action)
        finally:
            throttle.release()
        self._record(name, t0, "ok" if out.ok else (out.error_type or "error"))
        if self.after_invoke is not None:
            self.after_invoke(name, body, out.ok)
        trace = self.trace
        if trace is not None:
            t = out.trace or {}
            trace.append(
                {
                    "function": name,
                    "start": started,
                    "end": time.time(),
                    "seam_s": time.perf_counter() - t0,
                    "queued_s": out.queued_s,
                    "worker_s": out.seconds,
                    "handler_s": t.get("handler_s"),
                    "pid": t.get("pid"),
                    "api": t.get("api", {}),
                }
            )
        if not out.ok:
            headers["X-Amz-Function-Error"] = "Unhandled"
        return _response(url, 200, out.payload, headers)

    def _record(self, name: str, t0: float, outcome: str) -> None:
        with self._lock:
            self.calls.append((name, time.perf_counter() - t0, outcome))


# --------------------------------------------------------------------------------------------
# installation of the botocore handler

_routers: list[InvokeRouter] = []
_routers_lock = threading.Lock()


def _before_send(request: Any, **_: Any) -> AWSResponse | None:
    routers = _routers  # replaced, never mutated: safe to read without the lock
    owners = [r for r in routers if r.owns(request.url)]
    if not owners:
        return None
    try:
        name, _q = parse_function_name(request.url)
    except ValueError:
        return None
    for r in owners:
        if name in r.functions:
            return r.handle(request)
    return owners[0].handle(request)  # answers ResourceNotFoundException


def install(session: Any = None) -> None:
    """Register the seam first on boto3's default session (where moto's interpreter makes its
    Lambda client) or on `session` (an engine's own). Once per session: a second call is a no-op
    (botocore calls *every* handler of an event; registered twice, each invocation would run twice)."""
    with _routers_lock:
        put_first(EVENT, _before_send, "smlt-local-invoke", session)
        throttle.install()


def activate(router: InvokeRouter) -> None:
    """Route Invoke calls to ``router``'s functions. Engines of one process share the moto
    server, so their function names must differ (two engines of the same stack cannot run at
    once)."""
    global _routers
    with _routers_lock:
        for other in _routers:
            clash = set(other.functions) & set(router.functions)
            if clash:
                raise RuntimeError(
                    f"functions {sorted(clash)[:3]} are already served by another running local "
                    "engine (the same stack twice?); stop it first"
                )
        _routers = [*_routers, router]


def deactivate(router: InvokeRouter) -> None:
    global _routers
    with _routers_lock:
        _routers = [r for r in _routers if r is not router]
