"""Why an execution failed, as the user reads it: the named error and its message (a trial's,
a run's started by an upload: `smlt/watch.py`).

The study machine starts each trial with `startExecution.sync`; when the trial fails, its catch
holds {"Error": "States.TaskFailed", "Cause": <the trial execution's DescribeExecution as JSON>},
whose own `error`/`cause` are the run's named error and (from a Lambda) a JSON of errorType and
errorMessage. Each layer is unwrapped (a Lambda's stackTrace left out); what is left is kept
whole up to MAX_CAUSE characters, and its first line, the reason, always whole.
"""

from __future__ import annotations

import json
from typing import Any

MAX_CAUSE = 2000


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def trial_cause(error: dict[str, Any] | None) -> str | None:
    """`Error: message` of the innermost named error in a Step Functions catch (None: no error)."""
    if error is None:
        return None
    name, cause = str(error.get("Error", "")), _json(error.get("Cause", ""))
    for _ in range(4):  # execution -> run's error -> Lambda's errorType/errorMessage
        if not isinstance(cause, dict):
            break
        inner_name = cause.get("Error") or cause.get("error") or cause.get("errorType")
        inner = cause.get("Cause", cause.get("cause", cause.get("errorMessage")))
        if inner_name is None and inner is None:
            break
        name = str(inner_name or name)
        cause = _json(inner)
    text = cause if isinstance(cause, str) else json.dumps(cause)
    out = f"{name}: {text}" if text else name
    return bounded(out)


def execution_cause(error: str | None, cause: str | None) -> str:
    """`Error: message` of a failed execution's DescribeExecution `error` and `cause`."""
    return trial_cause({"Error": error or "", "Cause": cause or ""}) or "no error recorded"


def bounded(text: str, limit: int = MAX_CAUSE) -> str:
    """`text` up to `limit` characters, never cutting its first line (the reason)."""
    keep = max(limit, len(text.split("\n", 1)[0]))
    return text if len(text) <= keep else text[: keep - 1] + "…"
