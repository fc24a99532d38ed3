"""A command-line tool whose reader went away (``schedext explain ns/pod | head``).

Writing into a pipe closed at its far end raises BrokenPipeError, and Python flushes stdout
once more at exit, into the same pipe, printing a traceback. Both of schedext's commands
(``schedext`` and ``kubectl schedext``) end quietly instead, with the status a shell reports
for a command killed by SIGPIPE, as kubectl does, so that ``set -o pipefail`` sees the cut.
"""

from __future__ import annotations

import os
import sys

__all__ = ["BROKEN_PIPE", "reader_gone"]

BROKEN_PIPE = 141  # 128 + SIGPIPE


def reader_gone() -> int:
    """Point stdout at /dev/null, so that nothing more is written into the closed pipe (the
    interpreter's own flush at exit included); the exit status to return."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return BROKEN_PIPE
