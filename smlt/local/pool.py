"""A pre-warmed pool of handler processes (one per core by default).

Each worker is a long-lived process started with the ``forkserver`` (or ``spawn``) method: the
fork server is a fresh single-threaded interpreter, so workers never inherit the locks of the moto
server's or the ASL interpreter's threads (forking a threaded process can deadlock). Start the pool
before those threads exist anyway; :class:`smlt.local.engine.LocalEngine` does.

A job carries everything the worker needs: the handler's module file and function name, the full
environment to run it with (the function's variables plus the local runtime's: endpoint, dummy
credentials, region), the payload bytes and the deadline. Nothing is configured through module
state, so a worker can serve any function, one invocation at a time.

A job's environment may ask the worker to inject AWS write conflicts into the handler's S3 and
DynamoDB requests (:mod:`smlt.local.conflicts`, the ``s3_conflict``/``ddb_conflict`` faults).

Workers cache each function's handler module (a warm start); the first call of a function in a
worker imports it (a cold start). A handler that outlives its timeout is killed and its worker
replaced; so is a worker whose process dies.
"""

from __future__ import annotations

import contextlib
import decimal
import importlib.util
import json
import multiprocessing as mp
import os
import queue
import re
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from smlt.local import conflicts
from smlt.local.responses import put_first

DEFAULT_PRELOAD = ("smlt.local.pool", "boto3", "botocore.session", "json")


class InjectedFault(Exception):
    """Raised inside a worker when the engine's invoke filter asks for a failure."""


# --------------------------------------------------------------------------------------------
# worker side


class LambdaContext:
    """The subset of the Lambda Python runtime's context object handlers use."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.function_name = job["function"]
        self.function_version = "$LATEST"
        self.invoked_function_arn = job["arn"]
        # the Python runtime passes this as a string, as here
        self.memory_limit_in_mb = str(job["memory"])
        self.aws_request_id = job["request_id"]
        self.log_group_name = f"/aws/lambda/{job['function']}"
        self.log_stream_name = f"local/{os.getpid()}"
        self.identity = None
        self.client_context = None
        self._deadline = job["deadline_epoch"]

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.time()) * 1000))


def _error(
    exc: BaseException, request_id: str, error_type: str | None = None, message: str | None = None
) -> dict[str, Any]:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    return {
        "errorMessage": str(exc) if message is None else message,
        "errorType": error_type or type(exc).__name__,
        "requestId": request_id,
        "stackTrace": traceback.format_list(frames),
    }


def _json_default(o: Any) -> Any:
    # the Lambda Python runtime serializes Decimal (what DynamoDB returns) as a number
    if isinstance(o, decimal.Decimal):
        return int(o) if o == o.to_integral_value() else float(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _load_handler(job: dict[str, Any], cache: dict[tuple[str, str], Any]) -> Any:
    key = (job["function"], job["module_file"])
    fn = cache.get(key)
    if fn is not None:
        return fn
    code_dir = job.get("code_dir")
    if code_dir and code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    name = "smlt_local_fn_" + re.sub(r"\W", "_", job["function"])
    spec = importlib.util.spec_from_file_location(name, job["module_file"])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {job['module_file']}")
    module = importlib.util.module_from_spec(spec)
    if job.get("package"):
        module.__package__ = job["package"]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    fn = getattr(module, job["attr"], None)
    if fn is None:
        raise AttributeError(f"Handler '{job['attr']}' missing on module '{job['module_name']}'")
    cache[key] = fn
    return fn


# Tracing (diagnostics, off unless a job asks with ``"trace": True``): the AWS API calls a
# handler makes, timed per ``service.Operation``, and the handler's own time.
_api_calls: dict[str, list[float]] | None = None
_T0 = "smlt_trace_t0"


def _call_started(model: Any, context: dict[str, Any], **_: Any) -> None:
    """botocore ``provide-client-params`` (the first event of an API call): note its start."""
    if _api_calls is not None:
        context[_T0] = (f"{model.service_model.service_name}.{model.name}", time.perf_counter())


def _call_ended(context: dict[str, Any], **_: Any) -> None:
    """botocore ``after-call`` / ``after-call-error``: add the call's time to its operation."""
    acc, started = _api_calls, context.pop(_T0, None)
    if acc is None or started is None:
        return
    name, t = started
    c = acc.setdefault(name, [0, 0.0])
    c[0] += 1
    c[1] += time.perf_counter() - t


# The injected failure (`--faults fail=R`): the handler's first AWS request raises, so the
# handler fails inside its own code (its meter sees it, as it sees any error the handler raises).
_fail_armed = False


def _inject_failure(**_: Any) -> None:
    global _fail_armed
    if _fail_armed:
        _fail_armed = False
        raise InjectedFault("injected failure (smlt local fault injection)")


# The injected crash (`--faults crash=R`): the process dies right after the handler's K-th write.
_WRITES = frozenset(
    {"s3.PutObject", "s3.DeleteObject", "s3.DeleteObjects", "dynamodb.PutItem", "dynamodb.UpdateItem"}
    | {"dynamodb.DeleteItem", "dynamodb.TransactWriteItems", "dynamodb.BatchWriteItem"}
)
_crash_after: int | None = None
_writes_done = 0


def _crash_at_write(http_response: Any = None, model: Any = None, **_: Any) -> None:
    """botocore ``after-call``: count the job's successful writes; die after the K-th."""
    global _writes_done
    if _crash_after is None or model is None or http_response is None or http_response.status_code >= 300:
        return
    if f"{model.service_model.service_name}.{model.name}" in _WRITES:
        _writes_done += 1
        if _writes_done >= _crash_after:
            os.kill(os.getpid(), signal.SIGKILL)


# What one invocation's output (`job["output"]`) keeps, as CloudWatch keeps at most 256 KB of
# a log event: the rest is left out, saying how much.
OUTPUT_KEPT = 256 << 10


@contextlib.contextmanager
def _output_to(path: str | None, job: dict[str, Any]) -> Iterator[None]:
    """The invocation's stdout and stderr (file descriptors 1 and 2: C extensions' too) held in a
    temporary file and appended to `path` when it ends, under a line naming the function and the
    request, when it printed anything (None: the worker's own, the engine's terminal)."""
    if not path:
        yield
        return
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 1)
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            size = held.seek(0, os.SEEK_END)
            if size:
                held.seek(0)
                text = held.read(OUTPUT_KEPT)
                head = f"--- {job['function']} {job['request_id']} ({time.strftime('%H:%M:%S')})\n".encode()
                tail = b"" if text.endswith(b"\n") else b"\n"
                if size > OUTPUT_KEPT:
                    tail += f"... {size - OUTPUT_KEPT:,} more bytes of this invocation left out\n".encode()
                try:
                    with open(path, "ab") as log:  # one write: whole under other workers' appends
                        log.write(head + text + tail)
                except OSError:
                    pass  # the run goes on without its handlers' output


def _run_job(job: dict[str, Any], cache: dict[tuple[str, str], Any]) -> tuple[str, bytes, dict[str, Any]]:
    """(status, payload, info): info["billed"] is what the process measured of each handler call
    as Lambda bills it, [init s, duration s] (init: the module's import on a cold call), the
    engine's own record of the invocation; info["trace"] when the job asked for one. What the
    handler prints goes to `job["output"]` when it names a file (`_output_to`)."""
    with _output_to(job.get("output"), job):
        return _run_job_output(job, cache)


def _run_job_output(job: dict[str, Any], cache: dict[tuple[str, str], Any]) -> tuple[str, bytes, dict[str, Any]]:
    global _api_calls
    billed: list[list[float]] = []
    if not job.get("trace"):
        status, payload = _run_job_untraced(job, cache, billed)
        return status, payload, {"billed": billed}
    _api_calls = {}
    t = time.perf_counter()
    try:
        status, payload = _run_job_untraced(job, cache, billed)
    finally:
        api, _api_calls = _api_calls, None
    trace = {
        "handler_s": time.perf_counter() - t,
        "pid": os.getpid(),
        "api": {k: (int(v[0]), v[1]) for k, v in api.items()},
    }
    return status, payload, {"billed": billed, "trace": trace}


def _run_job_untraced(
    job: dict[str, Any], cache: dict[tuple[str, str], Any], billed: list[list[float]]
) -> tuple[str, bytes]:
    global _fail_armed, _crash_after, _writes_done
    rid = job["request_id"]
    os.environ.clear()
    os.environ.update(job["env"])
    conflicts.arm_from_env()  # this invocation's injected S3/DynamoDB conflicts, if any
    if job.get("cwd"):
        try:
            os.chdir(job["cwd"])
        except OSError:
            pass
    cold = (job["function"], job["module_file"]) not in cache
    t_load = time.perf_counter()
    try:
        fn = _load_handler(job, cache)
    except AttributeError as e:
        return "error", json.dumps(_error(e, rid, "Runtime.HandlerNotFound")).encode()
    except Exception as e:  # noqa: BLE001 - any import failure is the function's error
        msg = f"Unable to import module '{job['module_name']}': {e}"
        return "error", json.dumps(_error(e, rid, "Runtime.ImportModuleError", msg)).encode()
    try:
        event = json.loads(job["payload"]) if job["payload"] else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        msg = f"Unable to unmarshal input: {e}"
        return "error", json.dumps(_error(e, rid, "Runtime.UnmarshalError", msg)).encode()
    init_s = time.perf_counter() - t_load if cold else 0.0
    ctx = LambdaContext(job)
    _fail_armed = job.get("fault") == "fail"
    _crash_after, _writes_done = (int(job["crash_after"]) if job.get("fault") == "crash" else None), 0
    try:
        result = None
        for _ in range(max(1, int(job.get("repeat", 1)))):
            t_call = time.perf_counter()
            try:
                result = fn(event, ctx)
            finally:
                billed.append([init_s, time.perf_counter() - t_call])
                init_s = 0.0
        _inject_failure()  # a handler that made no request fails all the same
    except Exception as e:  # noqa: BLE001 - the handler's error becomes the Lambda error
        return "error", json.dumps(_error(e, rid), default=str).encode()
    finally:
        _fail_armed, _crash_after = False, None
        if job.get("fault") == "kill":  # `--faults kill=R`: the process dies before it answers
            os.kill(os.getpid(), signal.SIGKILL)
    try:
        return "ok", json.dumps(result, default=_json_default).encode()
    except (TypeError, ValueError) as e:
        msg = f"Unable to marshal response: {e}"
        return "error", json.dumps(_error(e, rid, "Runtime.MarshalError", msg)).encode()


def _worker_main(conn: Any) -> None:
    """Entry point of a worker process: run jobs until told to stop or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers end
    conflicts.install()  # before any handler makes a client; idle until a job arms it
    put_first("before-send", _inject_failure, "smlt-local-fail")  # idle until a job asks for it
    put_first("after-call", _crash_at_write, "smlt-local-crash")  # idle until a job asks for it
    for event, handler in (("provide-client-params", _call_started), ("after-call", _call_ended)):
        put_first(event, handler, f"smlt-local-trace-{event}")  # idle until a job asks for a trace
    put_first("after-call-error", _call_ended, "smlt-local-trace-after-call-error")
    cache: dict[tuple[str, str], Any] = {}
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            out = _run_job(job, cache)
        except BaseException as e:  # noqa: BLE001 - SystemExit etc. in a handler
            out = ("error", json.dumps(_error(e, job.get("request_id", ""), "Runtime.ExitError")).encode(), {})
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.send(out)
        except OSError:  # BrokenPipeError: the engine's process is gone (killed): no one to answer
            return


# --------------------------------------------------------------------------------------------
# parent side


@dataclass
class InvokeOutcome:
    ok: bool
    payload: bytes  # the JSON result, or the Lambda error payload when not ok
    seconds: float
    error_type: str | None = None
    queued_s: float = 0.0  # waiting for an idle worker (the pool's concurrency)
    trace: dict[str, Any] | None = None  # the worker's trace when the job asked for one
    # [init s, duration s] of each handler call, as the process measured it (None: the process
    # was killed or died, so only `seconds` is known)
    billed: list[list[float]] | None = None


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Start a process without it re-importing this program's ``__main__``.

    spawn/forkserver children import the parent's main module (as ``__mp_main__``) so that
    pickled objects defined there resolve. Workers only need ``smlt.local.pool``; re-importing
    main would run a script without a ``__main__`` guard again, and re-import whatever main
    imports (the CDK, pytest...) in every worker. ``multiprocessing.spawn.get_preparation_data``
    reads ``__main__.__spec__`` and ``__main__.__file__``; they are hidden while the child's
    preparation data is taken."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    with _MAIN_LOCK:
        saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
        main.__dict__["__spec__"] = None
        main.__dict__.pop("__file__", None)
        try:
            yield
        finally:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


@dataclass
class _Worker:
    proc: Any
    conn: Any
    index: int


def timeout_payload(request_id: str, seconds: float) -> bytes:
    return json.dumps(
        {
            "errorType": "Sandbox.Timedout",
            "errorMessage": f"RequestId: {request_id} Error: Task timed out after {seconds:.2f} seconds",
        }
    ).encode()


class WorkerPool:
    """``size`` worker processes (default: one per core) that run handler jobs."""

    def __init__(
        self, size: int | None = None, *, start_method: str = "forkserver", preload: tuple[str, ...] = DEFAULT_PRELOAD
    ) -> None:
        """``preload``: modules the fork server imports once, so every worker (and every
        replacement) starts with them loaded. Only modules that are safe to fork after import
        (numpy and torch are: OpenBLAS registers fork handlers, torch's pools start lazily)."""
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(
                "start_method must be 'forkserver' or 'spawn' (never 'fork': the engine's process has threads)"
            )
        self.size = size or os.cpu_count() or 1
        self.start_method = start_method
        self.preload = preload
        self._ctx: Any = mp.get_context(start_method)  # typeshed's BaseContext lacks Process
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[int] = set()
        self._workers: dict[int, _Worker] = {}
        self._lock = threading.Lock()
        self._counter = 0
        self._closed = True
        self.stats = {"started": 0, "replaced": 0, "invocations": 0, "timeouts": 0, "crashes": 0}

    # -- lifecycle -------------------------------------------------------------------------

    def prepare(self) -> WorkerPool:
        """Start the fork server without waiting for it: it imports the ``preload`` modules
        (``torch``, say) on another core while this process does something else (synth). A fork
        server already running in this process is reused as it is."""
        if self.start_method == "forkserver":
            from multiprocessing import forkserver

            self._ctx.set_forkserver_preload(list(self.preload))
            forkserver.ensure_running()
        return self

    def start(self) -> WorkerPool:
        """Start the worker processes (waits for the fork server's preloads)."""
        self.prepare()
        self._closed = False
        for _ in range(self.size):
            self._idle.put(self._spawn())
        return self

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        with self._lock:
            self._counter += 1
            index = self._counter
        proc = self._ctx.Process(target=_worker_main, args=(child,), daemon=True, name=f"smlt-lambda-{index}")
        with _main_hidden():
            proc.start()
        child.close()
        w = _Worker(proc, parent, index)
        with self._lock:
            self._workers[index] = w
            self.stats["started"] += 1
        return w

    def _discard(self, w: _Worker) -> None:
        # Once per worker: close() and the thread of an invocation it interrupted both discard
        # it, and a second close of its pipe would close another file's descriptor or fail (EBADF).
        with self._lock:
            if self._workers.pop(w.index, None) is None:
                return
        try:
            if w.proc.is_alive():
                w.proc.kill()
            w.proc.join(timeout=5)
        finally:
            w.conn.close()

    def _replace(self, w: _Worker) -> _Worker:
        self._discard(w)
        new = self._spawn()
        with self._lock:
            self.stats["replaced"] += 1
        return new

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 3
        for w in workers:
            w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            self._discard(w)

    def recycle(self) -> None:
        """Replace every handler process (waits for busy ones): the next invocation of each
        function is a cold start, as after a deployment."""
        old = [self._idle.get() for _ in range(self.size)]
        for w in old:
            self._idle.put(self._replace(w))

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._workers.values()]

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- running ---------------------------------------------------------------------------

    def run(self, job: dict[str, Any], timeout: float) -> InvokeOutcome:
        """Run one job on an idle worker (waits for one) and return its outcome. Thread-safe.

        ``timeout`` counts from the moment a worker takes the job."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        rid = job.setdefault("request_id", str(uuid.uuid4()))
        job.setdefault("module_name", os.path.basename(job.get("module_file") or "?"))
        tq = time.perf_counter()
        w = self._idle.get()
        back = w
        t0 = time.perf_counter()
        queued = t0 - tq
        job["deadline_epoch"] = time.time() + timeout
        try:
            with self._lock:
                self.stats["invocations"] += 1
            try:
                w.conn.send(job)
                ready = w.conn.poll(timeout)
            except (OSError, ValueError, BrokenPipeError):
                ready = True  # dead worker: recv below raises
            seconds = time.perf_counter() - t0
            if not ready:
                with self._lock:
                    self.stats["timeouts"] += 1
                if not self._closed:
                    back = self._replace(w)
                return InvokeOutcome(False, timeout_payload(rid, timeout), seconds, "Sandbox.Timedout", queued)
            try:
                status, payload, info = w.conn.recv()
                trace, billed = info.get("trace"), info.get("billed")
            except (EOFError, OSError):
                w.proc.join(timeout=2)
                code = w.proc.exitcode
                with self._lock:
                    self.stats["crashes"] += 1
                if not self._closed:  # closing kills busy workers: nothing to replace then
                    back = self._replace(w)
                msg = f"RequestId: {rid} Error: Runtime exited with error: " + (
                    f"signal: {-code}" if code is not None and code < 0 else f"exit status {code}"
                )
                return InvokeOutcome(
                    False,
                    json.dumps({"errorType": "Runtime.ExitError", "errorMessage": msg}).encode(),
                    time.perf_counter() - t0,
                    "Runtime.ExitError",
                    queued,
                )
            if status == "ok":
                return InvokeOutcome(True, payload, seconds, None, queued, trace, billed)
            try:
                etype = json.loads(payload).get("errorType")
            except (ValueError, AttributeError):
                etype = None
            return InvokeOutcome(False, payload, seconds, etype, queued, trace, billed)
        finally:
            if self._closed:
                self._discard(back)
            else:
                self._idle.put(back)
