"""A job file as the CLI reads it (`smlt run --local`, `smlt start`): checked before anything
starts, so a bad file costs no engine, stack or upload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Step Functions' execution input limit; imported here, not in smlt.runtime.job, which the functions import
# (their import graph must not reach the local engine).
from smlt.local.limits import MAX_PAYLOAD_BYTES
from smlt.runtime.errors import InvalidJob
from smlt.runtime.job import Job, parse_job


def read_job_file(path: Path) -> tuple[Job, dict[str, Any]]:
    """A job file as (validated Job, raw dict), or InvalidJob naming the file and the problem;
    checked before anything starts. The raw dict is what the CLI sends (after staging)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidJob(f"job: cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_PAYLOAD_BYTES:
        raise InvalidJob(
            f"job: {path} is {len(data):,} bytes; a job is the execution input, which Step Functions limits "
            f"to {MAX_PAYLOAD_BYTES:,} bytes (256 KiB): move large model params into a model entry point"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidJob(f"job: {path} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSON") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidJob(
            f"job: {path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}){_hint(path, text, e)}"
        ) from None
    return parse_job(raw), raw


def _hint(path: Path, text: str, e: json.JSONDecodeError) -> str:
    """What the JSON error most likely is, said for the user: a YAML or TOML job, a comment, a
    trailing comma (JSON has neither)."""
    if path.suffix.lower() in (".yaml", ".yml", ".toml"):
        return (
            f": smlt reads a job as JSON, not {path.suffix[1:].upper()}: write it as a .json file (README, 'The job')"
        )
    if text[e.pos : e.pos + 2] in ("//", "/*") or text[e.pos : e.pos + 1] == "#":
        return ": JSON has no comments: remove them"
    if e.msg.startswith("Expecting property name") or e.msg == "Expecting value":
        rest = text[e.pos :].lstrip()
        before = text[: e.pos].rstrip()
        if before.endswith(",") and rest[:1] in ("}", "]"):
            return ": a comma before a closing bracket (JSON allows none after the last item)"
    if e.msg.startswith("Expecting property name") and text[e.pos : e.pos + 1] == "'":
        return ": JSON names and text take double quotes"
    return ""
