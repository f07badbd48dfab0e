"""The library's progress records (:mod:`smlt.runtime.progress`) printed as the CLI's output lines."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from smlt.runtime.progress import notice, progress


class _Lines(logging.Handler):
    """Each record's message as one line on stdout (stderr from WARNING up), flushed at once:
    progress lines must appear as rounds finish. The stream is looked up per line (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        print(record.getMessage(), file=stream, flush=True)


@contextmanager
def console(quiet: bool = False) -> Iterator[None]:
    """Print notices, and progress unless ``quiet``, while the block runs."""
    handler = _Lines()
    loggers = [notice] if quiet else [notice, progress]
    saved = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        for lg, level in saved:
            lg.removeHandler(handler)
            lg.setLevel(level)
