"""Production limits that moto's ASL interpreter (moto 5.2.5) does not enforce, or enforces
differently, applied as small documented monkeypatches.

What moto already does: it checks each state's output, and a Task's raw result, against 256 KiB
and fails with ``States.DataLimitExceeded`` (``moto/stepfunctions/parser/quotas.py`` and the
``_verify_size_quota`` methods). What it gets wrong or misses, and what is patched here:

1. *Boundary*: moto accepts sizes strictly below 262,144 bytes; AWS accepts up to and including
   256 KiB. ``is_within_size_quota`` is replaced in the three modules that imported it.
2. *Catchability*: on AWS ``States.ALL`` does not match ``States.DataLimitExceeded`` nor
   ``States.Runtime`` (both terminal); moto's ``ErrorEqualsDecl`` matches every error. A worker
   whose result is too large would otherwise be swallowed by the child's ``Catch States.ALL``.
3. *History*: a Standard execution fails once its history would exceed 25,000 events. moto has
   no such limit. ``EventManager.add_event`` refuses progress events past the limit of an
   execution's top-level event manager (marked in ``ExecutionWorker._get_evaluation_environment``;
   a Distributed Map run gets its own manager, as child executions have their own history on
   AWS). The execution then fails with ``States.Runtime`` and a cause that names the quota.
4. *Distributed Map failure threshold*: moto counts failed child executions but never fails the
   Map Run; a failed child just leaves ``null`` in the results. On AWS the Map Run fails when
   failures exceed ``ToleratedFailureCount`` / ``ToleratedFailurePercentage`` (both default 0:
   any failure), and the Map state fails with ``States.ExceedToleratedFailureThreshold``.
   ``DistributedIterationComponent._map_run`` is wrapped to apply that rule (a value of 0 means
   "not set" when the other one is set).
5. *Execution input*: checked by the engine's ``start_execution`` (see :func:`check_input`).
6. *Lambda error names of "payload response only" tasks* (``Resource`` = the function ARN): moto
   names any Lambda API error of such a task ``Exception``; AWS names it ``Lambda.<Code>``
   (``Lambda.TooManyRequestsException``, ``Lambda.ServiceException``...), as moto already does for
   ``arn:aws:states:::lambda:invoke``. ``StateTaskLambda._from_error`` is wrapped accordingly, so
   the Retry CDK adds on Lambda service errors applies locally too.

Each patch is one function below, listed in :mod:`smlt.local.patches` with the tests that show
AWS's behaviour (the gate of a moto upgrade: a limit is never dropped silently).
"""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace
from typing import Any

MOTO_VERSION = "5.2.5"
MAX_PAYLOAD_BYTES = 262_144  # 256 KiB, state input/output and execution input
HISTORY_LIMIT = 25_000  # events per Standard execution
UNCATCHABLE_BY_ALL = frozenset({"States.DataLimitExceeded", "States.Runtime"})
HISTORY_CAUSE = (
    "The execution reached the maximum number of history events ({limit}). "
    "Continue as a new execution (smlt chains a fresh execution from the last "
    "checkpoint)."
)

_history_limit = HISTORY_LIMIT


class LimitError(ValueError):
    """A local limit check failed before anything was sent to the interpreter."""


def payload_size(value: Any) -> int:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8"))


def check_input(value: Any) -> str:
    """The execution input as JSON text; raises :class:`LimitError` past 256 KiB (StartExecution
    rejects such input on AWS)."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    n = len(text.encode("utf-8"))
    if n > MAX_PAYLOAD_BYTES:
        raise LimitError(f"execution input is {n} bytes; Step Functions accepts at most {MAX_PAYLOAD_BYTES} (256 KiB)")
    return text


def set_history_limit(limit: int) -> None:
    """Events allowed per execution for executions started from now on (tests lower it)."""
    global _history_limit
    _history_limit = int(limit)


def history_limit() -> int:
    return _history_limit


def map_run_exceeds(failed: int, total: int, count: Any, percentage: Any) -> bool:
    """AWS's Map Run rule: fail when the failed items exceed the tolerated count or percentage.
    Both 0 (the defaults): any failure fails. One of them 0 while the other is set: only the
    set one applies."""
    count = int(count or 0)
    percentage = float(percentage or 0.0)
    if count == 0 and percentage == 0.0:
        return failed > 0
    over_count = count > 0 and failed > count
    over_pct = percentage > 0.0 and total > 0 and failed * 100.0 / total > percentage
    return over_count or over_pct


def _is_within_size_quota(value: Any) -> bool:
    from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

    text = value if isinstance(value, str) else to_json_str(value)
    return len(text.encode("utf-8")) <= MAX_PAYLOAD_BYTES


def _details(**fields: Any) -> Any:
    """moto's ``EventDetails``: a dict with the one ``...EventDetails`` key of the event (its
    TypedDict declares every key as required; moto builds it with one, as here)."""
    return dict(fields)


# FailureEvent copies the state name and source event id from an Environment; a history-limit
# failure belongs to no state (as AWS reports it).
_NO_STATE: Any = SimpleNamespace(next_state_name=None, event_history_context=SimpleNamespace(source_event_id=0))


SIZE_QUOTA_MODULES = (
    "moto.stepfunctions.parser.quotas",
    "moto.stepfunctions.parser.asl.component.state.state",
    "moto.stepfunctions.parser.asl.component.state.exec.state_task.state_task_lambda",
    "moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service",
)


def patch_size_boundary() -> None:
    """1. the 256 KiB boundary, inclusive"""
    import importlib

    for name in SIZE_QUOTA_MODULES:
        module: Any = importlib.import_module(name)
        module.is_within_size_quota = _is_within_size_quota


def patch_uncatchable_by_all() -> None:
    """2. States.ALL does not catch terminal errors"""
    from moto.stepfunctions.parser.asl.component.common.error_name import error_equals_decl

    decl: Any = error_equals_decl.ErrorEqualsDecl
    orig_eval = decl._eval_body
    all_name = decl._STATE_ALL_ERROR

    @functools.wraps(orig_eval)
    def _eval_body(self: Any, env: Any) -> None:
        error_name = env.stack[-1] if env.stack else None
        name = getattr(error_name, "error_name", None)
        if (
            name in UNCATCHABLE_BY_ALL
            and all_name in self.error_names
            and not any(getattr(e, "error_name", None) == name for e in self.error_names)
        ):
            env.stack.pop()
            env.stack.append(False)
            return
        orig_eval(self, env)

    decl._eval_body = _eval_body


def patch_history_limit() -> None:
    """3. 25,000 history events per execution"""
    from moto.stepfunctions.parser.api import HistoryEventType
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.eval.event import event_manager
    from moto.stepfunctions.parser.backend import execution_worker

    manager: Any = event_manager.EventManager
    orig_add = manager.add_event
    always = {
        HistoryEventType.ExecutionFailed,
        HistoryEventType.ExecutionAborted,
        HistoryEventType.ExecutionTimedOut,
        HistoryEventType.ExecutionSucceeded,
    }

    @functools.wraps(orig_add)
    def add_event(self: Any, context: Any, event_type: Any, *args: Any, **kwargs: Any) -> int:
        limit = getattr(self, "_smlt_history_limit", None)
        if (
            limit is not None
            and event_type not in always
            and not str(event_type).endswith(("Failed", "Aborted", "TimedOut"))
        ):
            if self._event_id_gen._next_id > limit:
                err = StatesErrorNameType.StatesRuntime.to_name()
                cause = HISTORY_CAUSE.format(limit=limit)
                raise FailureEventException(
                    failure_event=FailureEvent(
                        env=_NO_STATE,
                        error_name=StatesErrorName(typ=StatesErrorNameType.StatesRuntime),
                        event_type=HistoryEventType.ExecutionFailed,
                        event_details=_details(executionFailedEventDetails={"error": err, "cause": cause}),
                    )
                )
        return orig_add(self, context, event_type, *args, **kwargs)

    manager.add_event = add_event

    worker: Any = execution_worker.ExecutionWorker
    orig_env = worker._get_evaluation_environment

    @functools.wraps(orig_env)
    def _get_evaluation_environment(self: Any) -> Any:
        env = orig_env(self)
        env.event_manager._smlt_history_limit = _history_limit
        return env

    worker._get_evaluation_environment = _get_evaluation_environment


def patch_map_tolerated_failures() -> None:
    """4. Distributed Map: tolerated failure threshold"""
    from moto.stepfunctions.parser.api import HistoryEventType
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration import (
        distributed_iteration_component,
    )

    component: Any = distributed_iteration_component.DistributedIterationComponent
    orig_map_run = component._map_run

    @functools.wraps(orig_map_run)
    def _map_run(self: Any, env: Any, eval_input: Any) -> None:
        orig_map_run(self, env, eval_input)
        record = eval_input.map_run_record
        counts = record.item_counter
        failed = counts.failed.get() + counts.timed_out.get()
        total = counts.total.get()
        if failed and map_run_exceeds(
            failed, total, record.tolerated_failure_count, record.tolerated_failure_percentage
        ):
            err = StatesErrorNameType.StatesExceedToleratedFailureThreshold.to_name()
            cause = f"The specified tolerated failure threshold was exceeded ({failed} of {total} items failed)"
            raise FailureEventException(
                failure_event=FailureEvent(
                    env=env,
                    error_name=StatesErrorName(typ=StatesErrorNameType.StatesExceedToleratedFailureThreshold),
                    event_type=HistoryEventType.ExecutionFailed,
                    event_details=_details(executionFailedEventDetails={"error": err, "cause": cause}),
                )
            )

    component._map_run = _map_run


def patch_lambda_error_names() -> None:
    """6. Lambda.<Code> for API errors of payload-response-only Lambda tasks"""
    from botocore.exceptions import ClientError
    from moto.stepfunctions.parser.api import HistoryEventType, LambdaFunctionFailedEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import (
        CustomErrorName,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEvent
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import state_task_lambda

    task_lambda: Any = state_task_lambda.StateTaskLambda
    orig_from_error = task_lambda._from_error

    @functools.wraps(orig_from_error)
    def _from_error(self: Any, env: Any, ex: Exception) -> Any:
        if not isinstance(ex, ClientError):
            return orig_from_error(self, env, ex)
        error = f"Lambda.{ex.response['Error']['Code']}"
        cause = ex.response["Error"].get("Message", "")
        return FailureEvent(
            env=env,
            error_name=CustomErrorName(error),
            event_type=HistoryEventType.LambdaFunctionFailed,
            event_details=_details(
                lambdaFunctionFailedEventDetails=(LambdaFunctionFailedEventDetails(error=error, cause=cause))
            ),
        )

    task_lambda._from_error = _from_error
