"""Signals during a study: SIGTERM stops it like Ctrl-C does, and the ledger clean-up after a stop
runs to the end even when Ctrl-C is pressed again (it is short: a few database writes)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """`kill PID` (SIGTERM) ends a submit the way Ctrl-C does: trials released, not left running."""
    if not _main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigterm_handler_kept() -> Iterator[None]:
    """Inside, Ray starts; afterwards this process's SIGTERM handler is the one from before (where there was
    none, Ray's Python one), and no Ctrl-C or SIGTERM that came meanwhile is lost.

    Starting Ray replaces the SIGTERM handler twice: `ray.init` installs a Python one (`sys.exit`, so Ray
    is shut down at exit), and its core worker a C++ one (absl's failure handler, which prints `*** SIGTERM
    received ... fdatasync` and aborts: exit 134, Ray's agents left running). And while Ray spawns its
    processes, a Python signal handler often runs inside an after-fork hook, where the exception it raises
    (SystemExit, KeyboardInterrupt) is dropped, with a traceback printed as "ignored". So the signals that
    arrive are also counted (Python's wakeup fd), one whose exception never came out is handed to its
    handler here, where raising is safe, and the dropped exception is not printed."""
    if not _main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: None if isinstance(u.exc_value, SystemExit | KeyboardInterrupt) else hook(u)
    try:
        yield
    except SystemExit as exc:  # Ray's Python handler ran: a SIGTERM came while Ray started
        if exc.code != signal.SIGTERM or not callable(previous):
            raise
        previous(signal.SIGTERM, None)
        raise
    finally:
        sys.unraisablehook = hook
        signal.set_wakeup_fd(wakeup)
        arrived = _drained(read)
        os.close(read)
        os.close(write)
        kept = previous if previous not in (None, signal.SIG_DFL) else signal.getsignal(signal.SIGTERM)
        if kept is not None:  # None: a handler not installed from Python, which Python cannot put back
            signal.signal(signal.SIGTERM, kept)
    if signal.SIGINT in arrived:  # its KeyboardInterrupt was dropped
        raise KeyboardInterrupt
    if signal.SIGTERM in arrived and callable(kept):
        kept(signal.SIGTERM, None)


def _drained(fd: int) -> set[int]:
    received = b""
    while True:
        try:
            chunk = os.read(fd, 512)
        except BlockingIOError:
            break
        if not chunk:
            break
        received += chunk
    return set(received)


@contextmanager
def interrupts_deferred() -> Iterator[list[int]]:
    """Inside: SIGINT and SIGTERM are remembered (the list yielded), not raised."""
    if not _main_thread():
        yield []
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: received.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
