"""The library's progress records (:mod:`smlt.runtime.progress`) printed as the CLI's output lines,
and the CLI's one rule for a reader that stops early (`smlt export ... | head -1`): a write into a
closed pipe ends the output quietly (`reader_gone`), never a BrokenPipeError traceback."""

from __future__ import annotations

import logging
import os
import select
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from smlt.runtime.progress import notice, progress


def reader_gone(stream: TextIO) -> None:
    """`stream`'s reader has closed the pipe (`| head`): what it read is what it wanted. Later
    writes, and Python's flush at exit, go to the null device instead of raising BrokenPipeError
    again; the command goes on to its end and its own exit code."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a file (a test's)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll's POLLERR on its write end): a
    BrokenPipeError that reaches the CLI's top is the reader's doing, not another pipe's."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


class _Lines(logging.Handler):
    """Each record's message as one line on stdout (stderr from WARNING up), flushed at once:
    progress lines must appear as rounds finish. The stream is looked up per line (tests swap it).
    A closed stream (`| head`) takes no more lines (`reader_gone`)."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            print(record.getMessage(), file=stream, flush=True)
        except BrokenPipeError:
            reader_gone(stream)


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
