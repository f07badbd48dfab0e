"""What the library tells the user while it works, as log records; the CLI (smlt.cli) prints
their messages as the lines users see. Without the CLI nothing is printed (no handler)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

# per-round lines, plan changes, engine start and the run's summary: `--quiet` drops these
progress = logging.getLogger("smlt.runtime.progress")
# one-off lines (a dataset prepared, a run started, a trigger fired): always shown
notice = logging.getLogger("smlt.notice")


@contextmanager
def collected_notices() -> Iterator[list[str]]:
    """The notices (INFO and above) logged inside the block, collected in order: what a Lambda
    step answers as its `notes`, where no CLI prints them."""
    notes: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            notes.append(record.getMessage())

    handler = Collect(logging.INFO)
    level = notice.level
    notice.addHandler(handler)
    notice.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        yield notes
    finally:
        notice.removeHandler(handler)
        notice.setLevel(level)
