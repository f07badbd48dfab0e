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
    job = parse_job(text)
    return job, json.loads(text)
