"""Every monkeypatch smlt applies to moto, in one list: what each does, the behaviour tests that
gate it, the moto change that would make it unnecessary and when it goes.

Three kinds: *correctness* patches make moto behave as AWS does where smlt depends on it
(``limits.py``: payload boundary, uncatchable errors, history quota, Distributed Map failure
threshold, Lambda error names; ``moto_fixes.py``: DynamoDB and conditional S3 writes under the
threaded server, startExecution's casing); *memory* patches keep on disk what moto would hold in
the process for good, with the same answers (``memory.py``); *speed* patches remove per-request
costs with the same answers (``speed.py``). ``SMLT_LOCAL_SPEEDUPS=0`` leaves the speed patches out
(set it before the first install, in a fresh process); the correctness and memory patches stay.

The gate is behaviour, not signatures: each patch names the tests that show what it does (a
correctness patch: AWS's answer where moto's differs; a memory or speed patch: moto's own answers,
compared with moto's code put back, or run again with ``SMLT_LOCAL_SPEEDUPS=0`` by ``make
test-stock-moto``). A new moto is taken by widening :data:`SUPPORTED_MOTO` once those tests pass
on it; :func:`install` refuses any other moto, and a patch whose target is gone fails by name.
The references and the moto versions are tabled in docs/local-engine.md.

:func:`install` is the one entry point: the engine calls it at start, the functional and engine
tests' conftests once per session (unit tests import no moto). It is idempotent.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import limits, memory, moto_fixes, speed
from .errors import MotoVersionError

SUPPORTED_MOTO = SpecifierSet(">=5.2,<5.3")

_ENGINE = "tests/engine/test_local_engine.py::"
_SPEED = "tests/engine/test_local_speed.py::"
_MEMORY = "tests/engine/test_local_memory.py::"
_GATE = "tests/engine/test_moto_patches.py::"
_NONE = "none found in getmoto/moto; proposed in docs/moto-upstream/"


@dataclass(frozen=True)
class Patch:
    name: str
    kind: Literal["correctness", "memory", "speed"]
    does: str
    apply: Callable[[], None] | None  # None: applied per server (see ``does``)
    tests: tuple[str, ...]  # the behaviour tests that gate it ("path::function")
    upstream: str  # the moto issue or PR that would make it unnecessary, or where it is proposed
    until: str  # the moto version at which it is deleted, or what has to happen first


PATCHES: tuple[Patch, ...] = (
    Patch(
        "payload-boundary",
        "correctness",
        "256 KiB state payloads accepted up to and including the limit (moto: strictly below)",
        limits.patch_size_boundary,
        (_ENGINE + "test_size_quota_boundary_is_inclusive", _ENGINE + "test_state_payload_limit"),
        _NONE + "payload-boundary.md",
        "the first moto with the proposed fix",
    ),
    Patch(
        "uncatchable-by-all",
        "correctness",
        "States.ALL does not catch States.DataLimitExceeded / States.Runtime",
        limits.patch_uncatchable_by_all,
        (_ENGINE + "test_state_payload_limit",),
        _NONE + "uncatchable-by-all.md",
        "the first moto with the proposed fix",
    ),
    Patch(
        "history-limit",
        "correctness",
        "25,000 history events per execution, then States.Runtime",
        limits.patch_history_limit,
        (_ENGINE + "test_history_limit",),
        _NONE + "history-limit.md",
        "the first moto that enforces the quota",
    ),
    Patch(
        "map-tolerated-failures",
        "correctness",
        "a Distributed Map fails past ToleratedFailureCount/Percentage (moto never fails it)",
        limits.patch_map_tolerated_failures,
        (_ENGINE + "test_state_payload_limit", _ENGINE + "test_map_run_failure_threshold"),
        _NONE + "map-tolerated-failures.md (LocalStack, whose interpreter moto vendors, records the "
        "fields without applying them: localstack/localstack#11058)",
        "the first moto whose vendored interpreter applies the threshold",
    ),
    Patch(
        "lambda-error-names",
        "correctness",
        "Lambda.<Code> error names for payload-only Lambda tasks (moto: Exception)",
        limits.patch_lambda_error_names,
        (_ENGINE + "test_throttled_payload_only_task_is_named_like_on_aws",),
        _NONE + "lambda-error-names.md",
        "the first moto with the proposed fix",
    ),
    Patch(
        "dynamodb-lock",
        "correctness",
        "one lock around DynamoDB table operations (moto's are not thread-safe under the threaded server)",
        moto_fixes.patch_dynamodb_lock,
        (_GATE + "test_dynamodb_operations_take_turns",),
        "none planned: moto documents that it is not thread-safe (getmoto/moto#7166, #372)",
        "kept while moto serves DynamoDB",
    ),
    Patch(
        "s3-conditional-put-lock",
        "correctness",
        "a conditional PutObject checks and writes its key under one lock (atomic, as on AWS)",
        moto_fixes.patch_s3_conditional_put,
        (_GATE + "test_racing_conditional_puts_have_one_winner",),
        "none planned: moto documents that it is not thread-safe (getmoto/moto#7166)",
        "kept while moto serves S3",
    ),
    Patch(
        "sfn-start-execution-case",
        "correctness",
        "states:startExecution tasks map PascalCase parameters and answers as AWS does (moto: passed as written)",
        moto_fixes.patch_sfn_start_execution_case,
        (_GATE + "test_start_execution_task_is_cased_as_on_aws",),
        _NONE + "sfn-start-execution-case.md",
        "the first moto with the proposed fix",
    ),
    Patch(
        "spilled-history",
        "memory",
        "a finished execution's history events kept in a temporary file, not in moto's memory",
        memory.patch_spilled_history,
        (_ENGINE + "test_a_finished_executions_history_leaves_memory_and_reads_back_as_moto_kept_it",),
        _NONE + "memory.md",
        "a moto that bounds what it keeps of finished executions",
    ),
    Patch(
        "spilled-s3-bodies",
        "memory",
        "S3 object bodies kept in one temporary file, not in moto's memory (moto: in memory up to 5 MB each)",
        memory.patch_spilled_s3_bodies,
        (
            _ENGINE + "test_s3_bodies_live_in_the_spill_file_and_read_back_whole_ranged_copied_and_overwritten",
            "tests/engine/test_local_units.py::test_spilled_body_is_the_file_like_object_moto_uses",
        ),
        _NONE + "memory.md (moto's own file handling of large keys: getmoto/moto#5102, #5551)",
        "a moto that keeps bodies out of memory (MOTO_S3_DEFAULT_KEY_BUFFER_SIZE=0 keeps one file per object)",
    ),
    Patch(
        "compact-dynamodb-items",
        "memory",
        "DynamoDB items not used lately kept as bytes in a temporary file, thawed into moto's objects when read (moto: ~6 KB of objects an item)",
        memory.patch_compact_dynamodb_items,
        (
            _MEMORY + "test_items_held_as_bytes_answer_as_moto_objects",
            _MEMORY + "test_a_frozen_item_thaws_to_the_same_moto_item",
        ),
        _NONE + "memory.md",
        "a moto whose items are compact",
    ),
    Patch(
        "backend-for-host",
        "speed",
        "memoised service routing of the server's dispatcher",
        speed.patch_backend_for_host,
        (_SPEED + "test_install_is_idempotent_and_keeps_answers",),
        _NONE + "speed.md",
        "the first moto with the proposed memo",
    ),
    Patch(
        "lambda-client-cache",
        "speed",
        "one boto3 Lambda client per (region, stubber, port) for the interpreter's tasks",
        speed.patch_boto_client_for,
        (_SPEED + "test_install_is_idempotent_and_keeps_answers",),
        _NONE + "speed.md",
        "the first moto with the proposed cache",
    ),
    Patch(
        "jsonpath-cache",
        "speed",
        "JSONPath expressions parsed once per path string",
        speed.patch_jsonpath_parse,
        (_SPEED + "test_install_is_idempotent_and_keeps_answers",),
        _NONE + "speed.md",
        "the first moto with the proposed cache",
    ),
    Patch(
        "untracked-models",
        "speed",
        "moto's list of every model object it made (its dashboard, growing every round) kept for S3 keys only",
        speed.patch_instance_tracking,
        (_SPEED + "test_moto_keeps_no_dynamodb_object_nor_finished_thread_for_good",),
        _NONE + "speed.md",
        "a moto that tracks instances only while its dashboard is used",
    ),
    Patch(
        "finished-threads",
        "speed",
        "the interpreter's list of every thread it started (growing every round) drops the finished ones",
        speed.patch_finished_threads,
        (_SPEED + "test_moto_keeps_no_dynamodb_object_nor_finished_thread_for_good",),
        _NONE + "speed.md",
        "the first moto with the proposed fix",
    ),
    Patch(
        "transact-snapshot",
        "speed",
        "TransactWriteItems rollback snapshot of the named items instead of a deep copy of every table",
        speed.patch_transact_snapshot,
        (_SPEED + "test_transaction_rollback_restores_exactly_the_named_items",),
        _NONE + "speed.md",
        "the first moto with the proposed snapshot",
    ),
    Patch(
        "attribute-value-serializer",
        "speed",
        "DynamoDB AttributeValues written in their wire form, not walked through the botocore model",
        speed.patch_attribute_value_serializer,
        (_SPEED + "test_dynamodb_serializer_and_conversion_match_moto",),
        _NONE + "speed.md",
        "the first moto with the proposed fast path",
    ),
    Patch(
        "table-query",
        "speed",
        "Query reads the key range of one partition (its keys kept in order) and sizes items only when it can decide",
        speed.patch_table_query,
        (
            _SPEED + "test_query_matches_moto",
            _SPEED + "test_query_over_the_sorted_keys_matches_moto_as_the_partition_changes",
            _SPEED + "test_query_reads_only_its_key_range",
            _SPEED + "test_query_size_limit_with_an_oversized_item_matches_moto",
            _SPEED + "test_item_size_and_copy_match_moto",
        ),
        _NONE + "speed.md (the results' copy was this patch's until getmoto/moto#9670, in moto 5.2)",
        "a moto whose Query reads a key range",
    ),
    Patch(
        "dynamo-to-dict",
        "speed",
        "response conversion by exact type",
        speed.patch_dynamo_to_dict,
        (_SPEED + "test_dynamodb_serializer_and_conversion_match_moto",),
        _NONE + "speed.md",
        "the first moto with the proposed fast path",
    ),
    Patch(
        "s3-ranged-get",
        "speed",
        "a ranged GET reads its bytes, not the whole object; a large PUT is written once",
        speed.patch_ranged_get,
        (_SPEED + "test_s3_ranged_get_and_large_put_match_moto",),
        _NONE + "speed.md",
        "the first moto with the proposed ranged read",
    ),
    Patch(
        "s3-list-range",
        "speed",
        "ListObjectsV2 without a delimiter reads its key range (prefix, StartAfter), not the whole bucket",
        speed.patch_list_objects_v2,
        (
            _SPEED + "test_s3_listing_over_sorted_names_matches_moto_as_the_bucket_changes",
            _SPEED + "test_s3_listing_reads_only_its_key_range",
        ),
        _NONE + "speed.md",
        "a moto whose listing reads a key range",
    ),
    Patch(
        "tcp-nodelay",
        "speed",
        "TCP_NODELAY on the moto server's accepted sockets (applied per server by server.MotoServer.start)",
        None,
        (_SPEED + "test_nodelay_on_accepted_connections",),
        _NONE + "speed.md",
        "the first moto whose server sets it",
    ),
)

_lock = threading.Lock()
_installed: set[str] = set()


def speedups_enabled() -> bool:
    return speed.enabled()


def selected(speedups: bool | None = None) -> list[Patch]:
    """The patches :func:`install` applies: all correctness and memory patches, the speed ones unless
    off, less those named in ``SMLT_LOCAL_WITHOUT`` (comma-separated: to run a patch's tests on moto
    alone; when they pass on a new moto, the patch is deleted)."""
    with_speed = speedups_enabled() if speedups is None else speedups
    without = {n.strip() for n in os.environ.get("SMLT_LOCAL_WITHOUT", "").split(",") if n.strip()}
    unknown = without - {p.name for p in PATCHES}
    if unknown:
        raise ValueError(f"SMLT_LOCAL_WITHOUT names no patch: {', '.join(sorted(unknown))} (see smlt/local/patches.py)")
    return [p for p in PATCHES if (p.kind != "speed" or with_speed) and p.name not in without]


def check_version(version: str | None = None) -> None:
    found = version or importlib.metadata.version("moto")
    if Version(found) not in SUPPORTED_MOTO:
        raise MotoVersionError(
            f"smlt.local patches moto{SUPPORTED_MOTO}; found moto {found}. Run the patches' behaviour "
            "tests on it (make test-stock-moto and tests/engine, see smlt/local/patches.py), then widen "
            "SUPPORTED_MOTO."
        )


def install(speedups: bool | None = None) -> list[str]:
    """Check the moto version, then apply every selected patch not yet applied in this process;
    returns the names applied so far. ``speedups`` None: from ``SMLT_LOCAL_SPEEDUPS``."""
    with _lock:
        todo = [p for p in selected(speedups) if p.name not in _installed]
        if todo:
            check_version()
        for p in todo:
            if p.apply is not None:
                try:
                    p.apply()
                except (ImportError, AttributeError, MotoVersionError) as e:
                    raise MotoVersionError(f"moto patch {p.name!r}: {e}") from e
            _installed.add(p.name)
        return sorted(_installed)
