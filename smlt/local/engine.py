"""``LocalEngine``: the synthesized state machine running on moto, with Lambda invocations served
by local handler processes. See the package docstring (``smlt/local/__init__.py``) for the parts.

    with LocalEngine(build_app, outdir="cdk.out.local") as engine:
        arn = engine.start_execution({"dataset": ...})
        result = engine.wait(arn)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import invoke, limits, memory, patches, synth_cache
from . import server as server_mod
from .functions import FunctionSpec, function_specs
from .invoke import AfterInvoke, InvokeFilter, InvokeRouter
from .pool import DEFAULT_PRELOAD, WorkerPool
from .resolve import BUCKET, GLOBAL_TABLE, REGION, STATE_MACHINE, TABLE, Resolver, UnresolvableError
from .server import MotoServer
from .synth import Synthesized, synthesize

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


def definition_for_moto(definition: dict[str, Any]) -> str:
    """The definition as JSON text for moto. moto's ASL grammar only accepts a decimal literal
    for ``ToleratedFailurePercentage`` (``10`` fails to parse, ``10.0`` parses), and CDK, through
    JavaScript, always writes whole numbers without the decimal point. Whole numbers there are
    written as floats: the same JSON number, so the definition is unchanged."""

    def fix(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {
                k: (
                    float(v)
                    if k == "ToleratedFailurePercentage" and isinstance(v, int) and not isinstance(v, bool)
                    else fix(v)
                )
                for k, v in obj.items()
            }
        if isinstance(obj, list):
            return [fix(v) for v in obj]
        return obj

    return json.dumps(fix(definition))


def project_root() -> Path:
    """The project's root (where ``smlt/`` and ``lambdas/`` live: the repository, or its copy
    made from an installed wheel, :mod:`smlt.project`): image functions' command module paths
    resolve from here."""
    from smlt.project import root

    return root()


class LocalEngine:
    """Runs the app's (one) state machine locally. Use as a context manager.

    ``build_app(outdir=..., context=...) -> aws_cdk.App`` is synthesized in-process unless a
    :class:`Synthesized` is given; with ``synth_cache=True`` it is read from the synth cache
    when the cache has it (``synth_cache.py``: only for an app made from the project's own
    files, such as ``infra.app``; ``SMLT_SYNTH_CACHE=off`` turns it off). ``workers`` handler
    processes (default one per core) are started before any server or interpreter thread
    exists; their fork server imports
    ``preload`` (say ``("numpy", "torch")``) once, during the synth, so no worker pays for
    those imports on its first invocation. ``invoke_filter`` is the fault-injection hook
    (see :attr:`invoke_filter`); ``history_limit`` lowers the 25,000-event quota (tests).
    """

    def __init__(
        self,
        build_app: Callable[..., Any] | None = None,
        *,
        synthesized: Synthesized | None = None,
        outdir: str | os.PathLike[str] | None = None,
        synth_context: dict[str, Any] | None = None,
        synth_cache: bool = False,
        code_root: str | os.PathLike[str] | None = None,
        workers: int | None = None,
        start_method: str = "forkserver",
        invoke_filter: InvokeFilter | None = None,
        history_limit: int = limits.HISTORY_LIMIT,
        state_machine: str | None = None,
        preload: tuple[str, ...] = (),
    ) -> None:
        if build_app is None and synthesized is None:
            raise ValueError("give build_app or synthesized")
        self._build_app = build_app
        self.synthesized = synthesized
        self._outdir = outdir
        self._synth_context = synth_context
        self._synth_cache = synth_cache
        self.code_root = Path(code_root).resolve() if code_root else project_root()
        self._workers = workers
        self._start_method = start_method
        self._preload = DEFAULT_PRELOAD + tuple(m for m in preload if m not in DEFAULT_PRELOAD)
        self._invoke_filter = invoke_filter
        self._after_invoke: AfterInvoke | None = None
        self._handler_output: Path | None = None
        self.history_limit = history_limit
        self._state_machine = state_machine
        self.timings: dict[str, float] = {}
        self.pool: WorkerPool | None = None
        self.server: MotoServer | None = None
        self.resolver: Resolver | None = None
        self.functions: dict[str, FunctionSpec] = {}
        self.definition: dict[str, Any] | None = None
        self.state_machine_arn: str | None = None
        self.state_machine_arns: dict[str, str] = {}  # logical id -> ARN of the stack's other state machines
        self._router: InvokeRouter | None = None
        self._base_env: dict[str, str] = {}
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()
        self._session: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._created: list[tuple[str, str]] = []  # (service, name/ARN) this engine created

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LocalEngine:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> LocalEngine:
        if self.pool is not None:
            raise RuntimeError("this engine is already started")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        t_all = time.perf_counter()
        # 1. the fork server starts and imports the preloads on another core during the synth
        self.pool = WorkerPool(self._workers, start_method=self._start_method, preload=self._preload).prepare()

        # 2. the template (importing moto's interpreter in a thread meanwhile was measured: the
        #    GIL contention slows the synth more than it saves)
        if self.synthesized is None:
            assert self._build_app is not None  # __init__ refuses neither build_app nor synthesized
            cache = synth_cache.cache_folder() if self._synth_cache else None
            if cache is not None:
                self.synthesized = synth_cache.synthesize_cached(
                    self._build_app, cache, root=project_root(), context=self._synth_context
                )
            else:
                outdir = self._outdir
                if outdir is None:
                    self._tmp = tempfile.TemporaryDirectory(prefix="smlt-cdk-")
                    outdir = self._tmp.name
                self.synthesized = synthesize(self._build_app, outdir, context=self._synth_context)
        self.timings["synth"] = self.synthesized.seconds

        # 3. handler processes before the moto server and interpreter threads exist
        t = time.perf_counter()
        self.pool.start()
        self.timings["pool"] = time.perf_counter() - t

        # 4. patches + moto
        t = time.perf_counter()
        patches.install()
        memory.limit_malloc_arenas()  # before the server's threads: one heap, not one per thread
        limits.set_history_limit(self.history_limit)
        invoke.install()
        self.server = server_mod.acquire()
        self.timings["server"] = time.perf_counter() - t

        # 5. names, resources, functions, the state machine
        t = time.perf_counter()
        syn = self.synthesized
        self.resolver = Resolver(syn.template, syn.stack_name)
        _ = self.names  # assign every name now: errors surface at start
        self.functions = function_specs(self.resolver, syn.asset_paths, self.code_root)
        self._base_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
        sm_id = self.resolver.state_machine_id(self._state_machine)
        self.definition = self.resolver.definition(sm_id)  # errors before anything is created
        others = {lid: self.resolver.definition(lid) for lid in self.resolver.of_type(STATE_MACHINE) if lid != sm_id}
        role_arn = self.resolver.role_arn(sm_id)
        assert self.server.port is not None  # acquire() returns a started server
        router = InvokeRouter(self.functions, self.pool, self.server.port, self.runtime_env, self._invoke_filter)
        router.after_invoke = self._after_invoke
        router.output = str(self._handler_output) if self._handler_output else None
        invoke.activate(router)  # refuses a second engine of the same stack
        self._router = router
        self._create_buckets()
        self._create_tables()
        sm_props = syn.template["Resources"][sm_id].get("Properties", {})
        resp = self.client("stepfunctions").create_state_machine(
            name=self.resolver.local(sm_id).name,
            definition=definition_for_moto(self.definition),
            roleArn=role_arn,
            type=sm_props.get("StateMachineType", "STANDARD"),
        )
        self.state_machine_arn = resp["stateMachineArn"]
        self._created.append(("stepfunctions", self.state_machine_arn))
        # The stack's other state machines (the study machine, which starts this one's executions).
        for lid, definition in others.items():
            props = syn.template["Resources"][lid].get("Properties", {})
            arn = self.client("stepfunctions").create_state_machine(
                name=self.resolver.local(lid).name,
                definition=definition_for_moto(definition),
                roleArn=self.resolver.role_arn(lid),
                type=props.get("StateMachineType", "STANDARD"),
            )["stateMachineArn"]
            self.state_machine_arns[lid] = arn
            self._created.append(("stepfunctions", arn))
        self.timings["resources"] = time.perf_counter() - t
        self.timings["start"] = time.perf_counter() - t_all

    def stop(self) -> None:
        """Stop running executions, stop serving this engine's functions, end the handler
        processes, remove its resources from moto (when another engine still uses the server;
        the last one resets it). Safe to call twice or after a failed start."""
        try:
            if self.server is not None and self.state_machine_arn:
                for arn in [*self.state_machine_arns.values(), self.state_machine_arn]:
                    self._stop_running_executions(arn)
        finally:
            if self._router is not None:
                invoke.deactivate(self._router)
                self._router = None
            # Handler processes end before the server: a busy one (a Ctrl-C mid-round) would
            # otherwise go on against a reset server and log its connection errors.
            if self.pool is not None:
                self.pool.close()
                self.pool = None
            if self.server is not None:
                if server_mod.users() > 1:
                    self._delete_resources()
                server_mod.release()
                self.server = None
            self._created.clear()
            self.state_machine_arn = None
            self.state_machine_arns = {}
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
            self._clients.clear()

    def _delete_resources(self) -> None:
        for kind, name in reversed(self._created):
            try:
                if kind == "stepfunctions":
                    self.client("stepfunctions").delete_state_machine(stateMachineArn=name)
                elif kind == "dynamodb":
                    self.client("dynamodb").delete_table(TableName=name)
                elif kind == "s3":
                    s3 = self.client("s3")
                    for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
                        objs = [
                            {"Key": o["Key"], "VersionId": o["VersionId"]}
                            for o in page.get("Versions", []) + page.get("DeleteMarkers", [])
                        ]
                        if objs:
                            s3.delete_objects(Bucket=name, Delete={"Objects": objs})
                    s3.delete_bucket(Bucket=name)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass

    def _stop_running_executions(self, state_machine_arn: str) -> None:
        sfn = self.client("stepfunctions")
        try:
            pages = sfn.get_paginator("list_executions").paginate(
                stateMachineArn=state_machine_arn, statusFilter="RUNNING"
            )
            for ex in [e for page in pages for e in page["executions"]]:
                sfn.stop_execution(
                    executionArn=ex["executionArn"], error="LocalEngineStopped", cause="the local engine was stopped"
                )
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass

    # -- resources -------------------------------------------------------------------------

    def _create_buckets(self) -> None:
        assert self.resolver is not None
        s3 = self.client("s3")
        for lid in self.resolver.of_type(BUCKET):
            name = self.resolver.local(lid).name
            s3.create_bucket(Bucket=name)
            self._created.append(("s3", name))
            props = self.resolver.resources[lid].get("Properties", {})
            status = (props.get("VersioningConfiguration") or {}).get("Status")
            if status:
                s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": status})

    def _create_tables(self) -> None:
        assert self.resolver is not None
        ddb = self.client("dynamodb")
        for lid in self.resolver.of_type(TABLE, GLOBAL_TABLE):
            res = self.resolver.resources[lid]
            props = res.get("Properties", {})
            where = f"{lid}.Properties"
            r = self.resolver.resolve
            kw: dict[str, Any] = {
                "TableName": self.resolver.local(lid).name,
                "KeySchema": r(props["KeySchema"], f"{where}.KeySchema"),
                "AttributeDefinitions": r(props["AttributeDefinitions"], f"{where}.AttributeDefinitions"),
            }
            pay_per_request = props.get("BillingMode") == "PAY_PER_REQUEST"

            def throughput(pt: Any) -> dict[str, int]:
                pt = r(pt or {}, where)
                return {
                    "ReadCapacityUnits": int(pt.get("ReadCapacityUnits", 5)),
                    "WriteCapacityUnits": int(pt.get("WriteCapacityUnits", 5)),
                }

            if pay_per_request:
                kw["BillingMode"] = "PAY_PER_REQUEST"
            else:
                kw["ProvisionedThroughput"] = throughput(props.get("ProvisionedThroughput"))
            gsis = []
            for g in props.get("GlobalSecondaryIndexes") or []:
                g = r(g, f"{where}.GlobalSecondaryIndexes")
                item = {k: g[k] for k in ("IndexName", "KeySchema", "Projection")}
                if not pay_per_request:
                    item["ProvisionedThroughput"] = throughput(g.get("ProvisionedThroughput"))
                gsis.append(item)
            if gsis:
                kw["GlobalSecondaryIndexes"] = gsis
            lsis = [
                {k: x[k] for k in ("IndexName", "KeySchema", "Projection")}
                for x in r(props.get("LocalSecondaryIndexes") or [], where)
            ]
            if lsis:
                kw["LocalSecondaryIndexes"] = lsis
            stream = props.get("StreamSpecification")
            if stream and stream.get("StreamViewType"):
                kw["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream["StreamViewType"]}
            ddb.create_table(**kw)
            self._created.append(("dynamodb", kw["TableName"]))
            ttl = props.get("TimeToLiveSpecification")
            if ttl and ttl.get("Enabled"):
                ddb.update_time_to_live(
                    TableName=kw["TableName"],
                    TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
                )

    # -- public API ------------------------------------------------------------------------

    @property
    def names(self) -> dict[str, str]:
        """logical id -> local physical name of every resource of the stack."""
        if self.resolver is None:
            raise RuntimeError("the engine is not started")
        return self.resolver.names()

    @property
    def endpoint_url(self) -> str:
        if self.server is None:
            raise RuntimeError("the engine is not started")
        return self.server.endpoint_url

    @property
    def region(self) -> str:
        return self.resolver.region if self.resolver else REGION

    @property
    def invoke_filter(self) -> InvokeFilter | None:
        return self._invoke_filter

    @invoke_filter.setter
    def invoke_filter(self, value: InvokeFilter | None) -> None:
        """Fault injection: ``value(function_name, payload) -> "ok" | "fail" | "throttle" |
        "duplicate" | "timeout"`` (None: no filter). Takes effect for the next invocation.
        Optionally the filter also has ``handler_env() -> dict`` (environment added to each
        invocation: faults injected inside the handler process, see smlt/local/conflicts.py) and
        ``execution_started(input)`` (told each execution this engine starts, e.g. its seed)."""
        self._invoke_filter = value
        if self._router is not None:
            self._router.invoke_filter = value

    @property
    def after_invoke(self) -> AfterInvoke | None:
        return self._after_invoke

    @after_invoke.setter
    def after_invoke(self, value: AfterInvoke | None) -> None:
        """``value(function_name, payload, ok)``, called in the calling thread when a synchronous
        invocation returns, before the state machine goes on (None: nothing is called)."""
        self._after_invoke = value
        if self._router is not None:
            self._router.after_invoke = value

    @property
    def handler_output(self) -> Path | None:
        return self._handler_output

    @handler_output.setter
    def handler_output(self, value: Path | None) -> None:
        """A file the handler processes append what they print to (stdout and stderr, an
        invocation's at a time under a line naming it, as CloudWatch keeps a Lambda's), instead of
        this process's terminal (None). A relative path is this process's: the handlers run in
        their own working folder."""
        self._handler_output = Path(value).absolute() if value else None
        if self._router is not None:
            self._router.output = str(self._handler_output) if self._handler_output else None

    @property
    def invocations(self) -> list[tuple[str, float, str]]:
        """(function name, seconds including the seam, outcome) of every invocation so far."""
        return list(self._router.calls) if self._router else []

    @property
    def billed(self) -> list[invoke.Billed]:
        """Every handler run so far as Lambda would bill it (init, duration, memory), measured by
        the handler processes: the engine's own record, independent of smlt.runtime.ledger."""
        return list(self._router.billed) if self._router else []

    def start_trace(self) -> list[dict[str, Any]]:
        """Diagnostics: record every invocation from now on (function, start/end epoch, seconds
        in the seam, waiting for an idle handler process, in the process, in the handler, and
        the handler's AWS API calls by ``service.Operation`` as [count, seconds]). Returns the
        list being filled; :meth:`stop_trace` ends the recording."""
        if self._router is None:
            raise RuntimeError("the engine is not started")
        self._router.trace = []
        return self._router.trace

    def stop_trace(self) -> list[dict[str, Any]]:
        records = (self._router.trace if self._router else None) or []
        if self._router is not None:
            self._router.trace = None
        return records

    def outputs(self) -> dict[str, Any]:
        """The synthesized stack's outputs, resolved to this engine's names and ARNs; one the
        engine cannot resolve (a URL of the AWS console) is left out."""
        assert self.resolver is not None, "start the engine first"
        found = {}
        for key, out in (self.resolver.template.get("Outputs") or {}).items():
            try:
                found[key] = self.resolver.resolve(out.get("Value"), f"Outputs.{key}")
            except UnresolvableError:
                continue
        return found

    def client(self, service: str) -> Any:
        """A boto3 client for ``service`` on the local endpoint (dummy credentials)."""
        with self._clients_lock:
            c = self._clients.get(service)
            if c is None:
                import boto3

                if self._session is None:
                    self._session = boto3.session.Session(
                        aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                        aws_session_token=DUMMY_CREDENTIALS["AWS_SESSION_TOKEN"],
                        region_name=self.region,
                    )
                    invoke.install(self._session)  # its Lambda calls reach the handler processes too
                c = self._session.client(service, endpoint_url=self.endpoint_url)
                self._clients[service] = c
            return c

    def function(self, key: str) -> FunctionSpec:
        """A function by logical id or local name."""
        if key in self.functions:
            return self.functions[key]
        for spec in self.functions.values():
            if spec.name == key:
                return spec
        raise KeyError(f"no function {key!r}; functions: {sorted(self.functions)}")

    def runtime_env(self, spec: FunctionSpec) -> dict[str, str]:
        """The whole environment a handler process runs with: this process's environment
        without AWS_* / MOTO_* variables, the function's variables, then what the Lambda
        runtime sets (region, dummy credentials, AWS_ENDPOINT_URL to the moto server...)."""
        # A fault injector acting inside handler processes (S3/DynamoDB conflicts) sends its
        # settings for this invocation along with the environment (smlt/local/conflicts.py).
        handler_env = getattr(self._invoke_filter, "handler_env", None)
        return {**self._base_env, **self.function_env(spec.logical_id), **(handler_env() if handler_env else {})}

    def function_env(self, key: str) -> dict[str, str]:
        """The function's resolved Environment.Variables plus the local runtime variables
        (AWS_ENDPOINT_URL, region, dummy credentials, AWS_LAMBDA_*, SMLT_LOCAL_CONCURRENCY): what
        a test needs to call the handler in-process the way the engine does."""
        spec = self.function(key)
        runtime = {
            **DUMMY_CREDENTIALS,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_LAMBDA_FUNCTION_NAME": spec.name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory),
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.name}",
            # Lambda's value for the function's runtime; the handler runs on this interpreter
            "AWS_EXECUTION_ENV": "AWS_Lambda_" + (spec.runtime or f"python{sys.version_info[0]}.{sys.version_info[1]}"),
            "LAMBDA_TASK_ROOT": spec.code_dir or "",
            "_HANDLER": spec.handler,
            # local only: how many invocations run at once (the handler processes); more queue,
            # and the wait counts against a Task's TimeoutSeconds(Path) but not the function's
            "SMLT_LOCAL_CONCURRENCY": str(self.pool.size if self.pool else 0),
        }
        return {**spec.env, **runtime}

    def start_execution(self, input: Any = None, name: str | None = None) -> str:
        """Start an execution of the state machine; returns its ARN. ``input`` is JSON-able
        (or a JSON string) of at most 256 KiB."""
        text = limits.check_input({} if input is None else input)
        started = getattr(self._invoke_filter, "execution_started", None)
        if started is not None:  # a fault injector may follow the run's input (its seed)
            started(json.loads(text))
        kw: dict[str, Any] = {"stateMachineArn": self.state_machine_arn, "input": text}
        kw["name"] = name or f"local-{uuid.uuid4().hex[:16]}"
        return self.client("stepfunctions").start_execution(**kw)["executionArn"]

    def wait(
        self,
        arn: str,
        poll: Callable[[dict[str, Any]], Any] | None = None,
        interval: float = 0.1,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Poll until the execution leaves RUNNING; returns ``describe_execution``'s answer.
        ``poll(description)`` is called at every poll (progress display)."""
        sfn = self.client("stepfunctions")
        t0 = time.monotonic()
        while True:
            d = sfn.describe_execution(executionArn=arn)
            if poll is not None:
                poll(d)
            if d["status"] != "RUNNING":
                return d
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{arn} still RUNNING after {timeout} s")
            time.sleep(interval)

    def run(self, input: Any = None, name: str | None = None, timeout: float | None = None) -> dict[str, Any]:
        """start_execution + wait."""
        return self.wait(self.start_execution(input, name), timeout=timeout)

    def history(self, arn: str) -> list[dict[str, Any]]:
        """Every history event of the execution, oldest first."""
        sfn = self.client("stepfunctions")
        events: list[dict[str, Any]] = []
        kw: dict[str, Any] = {"executionArn": arn, "maxResults": 1000}
        while True:
            page = sfn.get_execution_history(**kw)
            events.extend(page["events"])
            token = page.get("nextToken")
            if not token:
                return events
            kw["nextToken"] = token
