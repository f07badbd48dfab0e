"""Every monkeypatch smlt applies to moto, in one list, behind one gate.

Three kinds: *correctness* patches make moto behave as AWS does where smlt depends on it
(``limits.py``: payload boundary, uncatchable errors, history quota, Distributed Map failure
threshold, Lambda error names; ``moto_fixes.py``: DynamoDB under the threaded server); *memory*
patches keep on disk what moto would hold in the process for good, with the same answers
(``memory.py``: finished executions' histories, S3 bodies, DynamoDB items as bytes); *speed* patches remove per-request
costs with the same answers (``speed.py``).
``SMLT_LOCAL_SPEEDUPS=0`` leaves the speed patches out (set it before the first install, in a
fresh process); the correctness and memory patches stay.

The gate, before anything is applied: the installed moto (from its distribution metadata) is in
:data:`SUPPORTED_MOTO`, and every attribute a patch replaces exists and, where listed, has the
parameters the patch was written against. A patch body re-checks finer details (code objects,
shapes) and raises :class:`MotoVersionError` too. Any failure names the patch and what changed.

:func:`install` is the one entry point: the engine calls it at start, the root ``tests/conftest.py``
once per test session. It is idempotent.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import limits, memory, moto_fixes, speed
from .errors import MotoVersionError

SUPPORTED_MOTO = SpecifierSet(">=5.2,<5.3")


@dataclass(frozen=True)
class Need:
    """An attribute a patch replaces or relies on: ``"module:Qual.name"``, and the parameter names
    it must have (None: not checked)."""

    target: str
    params: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Patch:
    name: str
    kind: Literal["correctness", "memory", "speed"]
    does: str
    needs: tuple[Need, ...]
    apply: Callable[[], None] | None  # None: applied per server (see ``does``)


_SFN = "moto.stepfunctions.parser"
_DDB = "moto.dynamodb"


def _n(target: str, *params: str) -> Need:
    return Need(target, tuple(params) if params else None)


PATCHES: tuple[Patch, ...] = (
    Patch(
        "payload-boundary",
        "correctness",
        "256 KiB state payloads accepted up to and including the limit (moto: strictly below)",
        tuple(_n(f"{m}:is_within_size_quota", "value") for m in limits.SIZE_QUOTA_MODULES),
        limits.patch_size_boundary,
    ),
    Patch(
        "uncatchable-by-all",
        "correctness",
        "States.ALL does not catch States.DataLimitExceeded / States.Runtime",
        (
            _n(f"{_SFN}.asl.component.common.error_name.error_equals_decl:ErrorEqualsDecl._eval_body", "self", "env"),
            _n(f"{_SFN}.asl.component.common.error_name.error_equals_decl:ErrorEqualsDecl._STATE_ALL_ERROR"),
        ),
        limits.patch_uncatchable_by_all,
    ),
    Patch(
        "history-limit",
        "correctness",
        "25,000 history events per execution, then States.Runtime",
        (
            _n(
                f"{_SFN}.asl.eval.event.event_manager:EventManager.add_event",
                *("self", "context", "event_type", "event_details", "timestamp", "update_source_event_id"),
            ),
            _n(f"{_SFN}.backend.execution_worker:ExecutionWorker._get_evaluation_environment", "self"),
        ),
        limits.patch_history_limit,
    ),
    Patch(
        "map-tolerated-failures",
        "correctness",
        "a Distributed Map fails past ToleratedFailureCount/Percentage (moto never fails it)",
        (
            _n(
                f"{_SFN}.asl.component.state.exec.state_map.iteration.distributed_iteration_component"
                ":DistributedIterationComponent._map_run",
                *("self", "env", "eval_input"),
            ),
        ),
        limits.patch_map_tolerated_failures,
    ),
    Patch(
        "lambda-error-names",
        "correctness",
        "Lambda.<Code> error names for payload-only Lambda tasks (moto: Exception)",
        (
            _n(
                f"{_SFN}.asl.component.state.exec.state_task.state_task_lambda:StateTaskLambda._from_error",
                *("self", "env", "ex"),
            ),
        ),
        limits.patch_lambda_error_names,
    ),
    Patch(
        "dynamodb-lock",
        "correctness",
        "one lock around DynamoDB table operations (moto's are not thread-safe under the threaded server)",
        tuple(_n(f"{_DDB}.models:DynamoDBBackend.{op}") for op in moto_fixes.OPERATIONS),
        moto_fixes.patch_dynamodb_lock,
    ),
    Patch(
        "s3-conditional-put-lock",
        "correctness",
        "a conditional PutObject checks and writes its key under one lock (atomic, as on AWS)",
        (_n("moto.s3.responses:S3Response.put_object", "self"),),
        moto_fixes.patch_s3_conditional_put,
    ),
    Patch(
        "spilled-history",
        "memory",
        "a finished execution's history events kept in a temporary file, not in moto's memory",
        (
            _n(f"{_SFN}.backend.execution:BaseExecutionWorkerCommunication.terminated", "self"),
            _n(f"{_SFN}.backend.execution:Execution.to_history_output", "self"),
            _n(f"{_SFN}.asl.eval.event.event_manager:EventManager.get_event_history", "self"),
            _n(f"{_SFN}.api:GetExecutionHistoryOutput"),
        ),
        memory.patch_spilled_history,
    ),
    Patch(
        "spilled-s3-bodies",
        "memory",
        "S3 object bodies kept in one temporary file, not in moto's memory (moto: in memory up to 5 MB each)",
        (
            _n("moto.s3.models:FakeKey.__init__"),
            _n("moto.s3.models:FakeKey.value"),
            _n("moto.s3.models:FakeKey.etag"),
            _n("moto.s3.models:FakeKey.dispose", "self", "garbage"),
        ),
        memory.patch_spilled_s3_bodies,
    ),
    Patch(
        "compact-dynamodb-items",
        "memory",
        "DynamoDB items not used lately kept as bytes in a temporary file, thawed into moto's objects when read (moto: ~6 KB of objects an item)",
        (
            _n(f"{_DDB}.models.table:Table.__init__"),
            _n(f"{_DDB}.models.dynamo_type:Item.__init__", "self", "hash_key", "range_key", "attrs"),
            _n(f"{_DDB}.models.dynamo_type:LimitedSizeDict"),
        ),
        memory.patch_compact_dynamodb_items,
    ),
    Patch(
        "backend-for-host",
        "speed",
        "memoised service routing of the server's dispatcher",
        (_n("moto.moto_server.werkzeug_app:DomainDispatcherApplication.get_backend_for_host", "self", "host"),),
        speed.patch_backend_for_host,
    ),
    Patch(
        "lambda-client-cache",
        "speed",
        "one boto3 Lambda client per (region, stubber, port) for the interpreter's tasks",
        (
            _n(f"{_SFN}.asl.utils.boto_client:boto_client_for", "region", "service", "state_credentials"),
            _n(f"{_SFN}.asl.component.state.exec.state_task.lambda_eval_utils:boto_client_for"),
        ),
        speed.patch_boto_client_for,
    ),
    Patch(
        "jsonpath-cache",
        "speed",
        "JSONPath expressions parsed once per path string",
        (
            _n(f"{_SFN}.asl.utils.json_path:parse", "path", "debug"),
            _n(f"{_SFN}.asl.component.common.path.result_path:parse", "string"),
        ),
        speed.patch_jsonpath_parse,
    ),
    Patch(
        "untracked-models",
        "speed",
        "moto's list of every model object it made (its dashboard, growing every round) kept for S3 keys only",
        (_n("moto.core.common_models:BaseModel.__new__", "cls", "args", "kwargs"),),
        speed.patch_instance_tracking,
    ),
    Patch(
        "finished-threads",
        "speed",
        "the interpreter's list of every thread it started (growing every round) drops the finished ones",
        (_n(f"{_SFN}.utils:TMP_THREADS"),),
        speed.patch_finished_threads,
    ),
    Patch(
        "transact-snapshot",
        "speed",
        "TransactWriteItems rollback snapshot of the named items instead of a deep copy of every table",
        (
            _n(f"{_DDB}.models:DynamoDBBackend.transact_write_items", "self", "transact_items"),
            _n(f"{_DDB}.models:copy"),
        ),
        speed.patch_transact_snapshot,
    ),
    Patch(
        "attribute-value-serializer",
        "speed",
        "DynamoDB AttributeValues written in their wire form, not walked through the botocore model",
        (
            _n(
                "moto.core.serialize:BaseJSONSerializer._serialize_type_structure",
                *("self", "serialized", "value", "shape", "key"),
            ),
        ),
        speed.patch_attribute_value_serializer,
    ),
    Patch(
        "table-query",
        "speed",
        "Query reads the key range of one partition (its keys kept in order), sizes items only when it can decide, copies results directly",
        (
            _n(
                f"{_DDB}.models.table:Table.query",
                *("self", "hash_key", "range_comparison", "range_objs", "limit", "exclusive_start_key"),
                *("scan_index_forward", "projection_expressions", "index_name", "consistent_read"),
                *("filter_expression", "hash_key_conditions", "range_key_conditions", "filter_kwargs"),
            ),
            _n(f"{_DDB}.parsing.executors:UpdateExpressionExecutor.execute", "self", "node"),
            _n(f"{_DDB}.models.dynamo_type:Item.update_with_attribute_updates", "self", "attribute_updates"),
        ),
        speed.patch_table_query,
    ),
    Patch(
        "dynamo-to-dict",
        "speed",
        "response conversion by exact type",
        (_n(f"{_DDB}.responses:dynamo_to_dict", "obj"),),
        speed.patch_dynamo_to_dict,
    ),
    Patch(
        "s3-ranged-get",
        "speed",
        "a ranged GET reads its bytes, not the whole object; a large PUT is written once",
        (
            _n("moto.s3.models:FakeKey.value"),
            _n("moto.s3.responses:S3Response.get_object", "self"),
            _n("moto.s3.responses:S3Response.key_response", "self", "request", "full_url", "headers"),
            _n(
                "moto.s3.responses:S3Response._handle_range_header",
                *("self", "request", "response_headers", "response_content"),
            ),
        ),
        speed.patch_ranged_get,
    ),
    Patch(
        "s3-list-range",
        "speed",
        "ListObjectsV2 without a delimiter reads its key range (prefix, StartAfter), not the whole bucket",
        (
            _n(
                "moto.s3.models:S3Backend.list_objects_v2",
                *("self", "bucket", "prefix", "delimiter", "continuation_token", "start_after", "max_keys"),
            ),
            _n("moto.s3.utils:_VersionedKeyStore.setlist", "self", "key", "list_"),
        ),
        speed.patch_list_objects_v2,
    ),
    Patch(
        "sfn-start-execution-case",
        "correctness",
        "states:startExecution tasks map PascalCase parameters and answers as AWS does (moto: passed as written)",
        (
            _n(
                f"{_SFN}.asl.component.state.exec.state_task.service.state_task_service_sfn:"
                "StateTaskServiceSfn._normalise_parameters",
                *("self", "parameters", "boto_service_name", "service_action_name"),
            ),
            _n(
                f"{_SFN}.asl.component.state.exec.state_task.service.state_task_service_sfn:StateTaskServiceSfn._normalise_response"
            ),
        ),
        moto_fixes.patch_sfn_start_execution_case,
    ),
    Patch(
        "tcp-nodelay",
        "speed",
        "TCP_NODELAY on the moto server's accepted sockets (applied per server by server.MotoServer.start)",
        (_n("socketserver:TCPServer.get_request", "self"),),
        None,
    ),
)

_lock = threading.Lock()
_installed: set[str] = set()


def speedups_enabled() -> bool:
    return speed.enabled()


def selected(speedups: bool | None = None) -> list[Patch]:
    """The patches :func:`install` applies: all correctness and memory patches, the speed ones unless off."""
    with_speed = speedups_enabled() if speedups is None else speedups
    return [p for p in PATCHES if p.kind != "speed" or with_speed]


def check_version(version: str | None = None) -> None:
    found = version or importlib.metadata.version("moto")
    if Version(found) not in SUPPORTED_MOTO:
        raise MotoVersionError(
            f"smlt.local patches moto{SUPPORTED_MOTO}; found moto {found}. Re-check the patches in "
            "smlt/local/patches.py against the new moto, then widen SUPPORTED_MOTO."
        )


def _resolve(target: str) -> Any:
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def check(patch: Patch) -> None:
    """Raise :class:`MotoVersionError` naming ``patch`` if an attribute it needs is gone or changed."""
    for need in patch.needs:
        try:
            obj = _resolve(need.target)
        except (ImportError, AttributeError) as e:
            raise MotoVersionError(f"moto patch {patch.name!r}: {need.target} is gone ({e})") from e
        if need.params is None:
            continue
        found = tuple(inspect.signature(obj).parameters)
        if found != need.params:
            raise MotoVersionError(
                f"moto patch {patch.name!r}: {need.target} takes {found}, the patch was written for {need.params}"
            )


def install(speedups: bool | None = None) -> list[str]:
    """Check, then apply, every selected patch not yet applied in this process; returns the names
    applied so far. ``speedups`` None: from ``SMLT_LOCAL_SPEEDUPS``."""
    with _lock:
        todo = [p for p in selected(speedups) if p.name not in _installed]
        if todo:
            check_version()
            for p in todo:  # every check before any patch: a refused moto stays unpatched
                check(p)
        for p in todo:
            if p.apply is not None:
                try:
                    p.apply()
                except (ImportError, AttributeError, MotoVersionError) as e:
                    raise MotoVersionError(f"moto patch {p.name!r}: {e}") from e
            _installed.add(p.name)
        return sorted(_installed)
