"""smlt's local engine: the very state machine ``cdk synth`` produces, run on one machine with no
AWS account, on moto's Step Functions interpreter, with Lambda invocations served by local
handler processes.

Parts
-----
``synth.py``
    ``synthesize(build_app, outdir) -> Synthesized``: builds the CDK app in-process with
    ``aws:cdk:bundling-stacks = []`` (no Docker) and ``aws:cdk:enable-asset-metadata``, reads the
    one stack's template and the staged asset directory of every function.
``synth_cache.py``
    ``synthesize_cached(build_app, folder, root=...)``: the synth of an app made from the
    project's files, stored under a key of everything that can change it (the sources under
    ``infra/``, ``smlt/``, ``lambdas/``, ``layers/``, ``cdk.json``..., the CDK's versions, the
    context) and reused while the key holds: a hit imports no CDK. Written atomically; a damaged
    entry is made again. ``LocalEngine(synth_cache=True)`` uses it; ``SMLT_SYNTH_CACHE`` moves it
    (default ``~/.cache/smlt/synth``) or turns it ``off``.
``resolve.py``
    ``Resolver``: deterministic local names (``<stack>-<LogicalId>``, shortened with a hash where
    a service limit requires: S3 3-63 lowercase, Lambda 64, state machine 80, ...), ARNs in
    account 123456789012 / us-east-1, and resolution of ``Ref``, ``Fn::GetAtt``, ``Fn::Join``,
    ``Fn::Sub`` and the pseudo parameters. Any other intrinsic raises ``UnresolvableError``. The
    only change made to the definition is names and ARNs (``Resolver.definition()``).
``functions.py``
    How each function runs: zip = handler module file in the staged asset dir; image =
    ``ImageConfig.Command`` module path under the project root. Modules load by file path under a
    unique name per function.
``server.py``
    moto's ``ThreadedMotoServer`` on 127.0.0.1, port 0, ``MOTO_PORT`` set, Step Functions
    execution switched on (``execute_state_machine``); one per process, shared by its engines.
``pool.py``
    Pre-warmed forkserver pool of handler processes (one per core); a job carries the handler's
    file, the full environment, the payload and the deadline. Timeout -> ``Sandbox.Timedout`` and
    the process is replaced.
``invoke.py``
    The seam: a botocore ``before-send.lambda.Invoke`` handler, registered first on boto3's
    default session (and the engine's own) through botocore's event API, answers the
    interpreter's Lambda calls with Lambda's own response shapes (error payload +
    ``X-Amz-Function-Error``, 429 throttles, 6 MB limits) and hosts the fault injection filter
    (ok / fail / throttle / duplicate / timeout).
``limits.py``
    What production enforces and moto does not: 256 KiB state payloads (inclusive boundary,
    ``States.DataLimitExceeded`` not catchable by ``States.ALL``), 25,000 history events per
    execution, 256 KiB execution input, the Distributed Map's tolerated-failure threshold, and
    ``Lambda.<Code>`` error names for payload-only Lambda tasks. Small monkeypatches.
``speed.py``
    Per-request costs of moto 5.2.5 removed with patches that give the same answers (service
    routing, Lambda clients, JSONPath parses, transactions' rollback copies, DynamoDB
    serialization, Query and S3 listing over key ranges, ranged GETs, ``TCP_NODELAY``...).
    ``SMLT_LOCAL_SPEEDUPS=0`` turns them off (to measure them).
``memory.py``
    What the engine keeps in memory and what it spills. Spilled, each to one append-only
    temporary file per process (gone when the server stops): a finished execution's history
    events (GetExecutionHistory reads them back), every S3 object's body (moto would keep it
    in memory up to 5 MB) and the bytes of the DynamoDB items not used lately (thawed into moto's
    objects when read; the 512 used last stay objects). Kept in memory, as moto holds it: the S3
    objects' metadata, the running execution's history, and the engine's own records
    (``LocalEngine.billed``, ``invocations``). A long run still grows by what it stores per round,
    ~25 KB (bench/README.md, "Long local run").
``patches.py``
    The registry of every moto patch (name, kind, what it does, the behaviour tests that gate
    it, the moto issue or proposal that would make it unnecessary, when it goes; the table is in
    docs/local-engine.md) and the one ``install()``: checks the supported moto range
    (``moto>=5.2,<5.3``), then applies. Used by the engine and, once per session, by the
    functional and engine tests' conftests (unit tests import no moto).
``eventbridge.py``
    The stack's upload trigger: the S3 "Object Created" event, matched against the template's
    ``AWS::Events::Rule`` patterns by moto's EventBridge matcher, the target input rendered (moto's
    renderer leaves strings unquoted at CDK's placeholders) and StartExecution.
``conflicts.py``
    AWS write conflicts and throttling moto never returns (S3 409 ConditionalRequestConflict and
    503 SlowDown, DynamoDB TransactionConflict and ProvisionedThroughputExceededException), injected
    into the handler processes' requests (``--faults s3_conflict=..,s3_slowdown=..``).
``redis_server.py``
    ``LocalRedisServer``: a throwaway ``redis-server`` (plain or TLS with a throwaway CA) for
    tests, benchmarks and local runs.
``engine.py``
    ``LocalEngine``: puts it together (pool -> synth -> moto -> buckets, tables, state machine ->
    seam) and offers ``start_execution`` / ``wait`` / ``history`` / ``client`` / ``names`` /
    ``function_env``, and ``start_trace`` / ``stop_trace`` (per invocation: queueing for a
    handler process, handler time, its AWS calls by operation).

Traps
-----
- JSONata is not supported by moto's interpreter: definitions must use JSONPath (the resolver
  refuses a JSONata definition).
- ``ToleratedFailurePercentage`` only parses in moto as a decimal literal (``10.0``; CDK writes
  ``10``): the engine hands moto whole numbers as floats (same JSON number). moto itself ignores
  the tolerated-failure fields and leaves ``null`` for a failed child; ``limits.py`` applies AWS's
  rule (default: any failed child fails the Map with ``States.ExceedToleratedFailureThreshold``).
  Catch worker failures inside the child, as the contract does.
- Fork before threads: the pool starts before the moto server and the interpreter's threads, and
  uses ``forkserver`` (never plain ``fork``): workers fork from the single-threaded fork server,
  so replacement workers and a second engine's pool are safe too.
- Configuration reaches handler processes through the environment of each job, never through
  module-level side effects in the parent; handlers should read their settings at call time.
- moto's backends and ``MOTO_PORT`` are process-global: the engines of one process share one moto
  server (reference counted; each engine removes its own resources on stop, the last one resets
  moto). Two engines of the same stack cannot run at once (their names would clash).
- Local concurrency is the pool size (one process per core), not Lambda's 1,000: more
  invocations queue, and the wait counts against a Task's ``TimeoutSeconds(Path)`` (not against
  the function's Timeout). Handlers see the pool size in ``SMLT_LOCAL_CONCURRENCY``.
- A Task that times out (``States.Timeout``) abandons its invocation, which runs on in its worker
  until it ends or hits the function's Timeout, as a straggler does on AWS.
- Workers never re-import the parent's ``__main__`` (spawn/forkserver normally do): see
  ``pool._main_hidden``.
- moto's interpreter reaches services other than Lambda (S3 ItemReader, SDK integrations) at
  ``http://localhost:{MOTO_PORT}``; the server listens on 127.0.0.1 only.
- The seam and the injected faults live on boto3's default session (botocore's event API):
  ``boto3.setup_default_session()`` while an engine runs replaces that session and takes the
  seam from the interpreter's Lambda calls made after it (an engine's start registers it on the
  session of the moment). smlt never replaces it.
- ``tests`` is shadowed by a ``tests`` package in site-packages (dynamodb-json ships one); handler
  modules are therefore loaded by file path, not by import name.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LocalEngine",
    "Synthesized",
    "synthesize",
    "Resolver",
    "UnresolvableError",
    "resolve_definition",
    "WorkerPool",
]


def __getattr__(name: str) -> Any:  # lazy: importing smlt.local must not import CDK or moto
    if name == "LocalEngine":
        from .engine import LocalEngine

        return LocalEngine
    if name in ("Synthesized", "synthesize"):
        from . import synth

        return getattr(synth, name)
    if name in ("Resolver", "UnresolvableError", "resolve_definition"):
        from . import resolve

        return getattr(resolve, name)
    if name == "WorkerPool":
        from .pool import WorkerPool

        return WorkerPool
    raise AttributeError(name)
