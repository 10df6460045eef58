"""A child process's tie to its parent: it ends when the parent ends, even by ``kill -9``.

Two independent ties, because either alone has a gap. ``die_with_parent`` asks Linux to
send a signal when the parent dies (``PR_SET_PDEATHSIG``: immediate, but Linux only, and
tied to the thread that started the child). ``on_eof`` watches a pipe whose other end only
the parent holds: the kernel closes it when the parent exits, however it exits.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(signum: int, parent_pid: int | None = None) -> bool:
    """Have the kernel send ``signum`` to this process when its parent dies. With
    ``parent_pid``, a parent that is already gone (it died before the request was made)
    sends it at once. False where prctl is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's prctl
        if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)  # orphaned before the request took effect
    return True


def on_eof(fd: int, callback: Callable[[], None]) -> threading.Thread:
    """Call ``callback`` (on a daemon thread) once file descriptor ``fd`` reaches end of
    file. Raw reads: a buffered stream's lock held by a blocked daemon thread would abort
    the interpreter's shutdown."""

    def watch() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass
        callback()

    thread = threading.Thread(target=watch, name="batchbench-lifeline", daemon=True)
    thread.start()
    return thread
