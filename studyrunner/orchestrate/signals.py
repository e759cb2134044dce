"""Signals during a study: SIGTERM stops it like Ctrl-C does, and the ledger clean-up after a stop
runs to the end even when Ctrl-C is pressed again (it is short: a few database writes)."""

from __future__ import annotations

import signal
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
    """Starting Ray replaces this process's SIGTERM handler twice: `ray.init` installs a Python one
    (`sys.exit`, so Ray is shut down at exit), and its core worker a C++ one (absl's failure handler, which
    prints `*** SIGTERM received ... fdatasync` and aborts: exit 134, Ray's agents left running). Inside,
    Ray starts; afterwards the handler from before is back (where there was none, Ray's Python one), and a
    SIGTERM that came while Ray started is handed to it."""
    if not _main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    except SystemExit as exc:  # Ray's Python handler ran: a SIGTERM came while Ray started
        if exc.code != signal.SIGTERM or not callable(previous):
            raise
        previous(signal.SIGTERM, None)
        raise
    finally:
        kept = previous if previous not in (None, signal.SIG_DFL) else signal.getsignal(signal.SIGTERM)
        if kept is not None:  # None: a handler not installed from Python, which Python cannot put back
            signal.signal(signal.SIGTERM, kept)


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
