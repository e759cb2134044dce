"""A command that trains (`submit`, `resume`, `rerun`) runs in a child process that this one watches, so that a
Ctrl-C or SIGTERM ends it with exit 130 and the line saying how to go on, in every state of its Ray.

Why a second process: while Ray's core worker connects (`ray.init`), the driver's main thread blocks in C++
holding the GIL. A Ray that never answers there (a GCS that hangs, a raylet that refuses the driver's token)
leaves a process in which no Python code runs at all, signal handlers and threads included, so nothing inside it
can stop it. The watching parent holds no Ray and no GIL of the child's:

- It waits for the child and exits as the child did (its code; a child killed by a signal kills it with the same
  signal, so `kill -9` of the command reads as it always did).
- The child runs in a process group of its own, so a Ctrl-C typed in the terminal, a SIGTERM and a signal sent
  to the command's process group all reach this process only, which passes each on to the child once; the child
  stops as on Ctrl-C.
- When the child has not ended `STUDYRUNNER_STOP_GRACE` seconds (30) after the first stop signal, the parent
  ends it the hard way: SIGKILL to the child and every process it started (its Ray), then `on_stuck()` (which
  releases what the child held in the ledger and says how to go on), and exit 130.
- If the parent itself is killed (`kill -9`), the kernel kills the child too (PR_SET_PDEATHSIG), so nothing goes
  on running unwatched.

Only the real command forks (`studyrunner.cli.main` turns it on): in-process callers (the Python API, typer's
CliRunner in tests) run the command in their own process, unsupervised.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable

from ..settings import seconds

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
WATCHED = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}
PR_SET_PDEATHSIG = 1

enabled = False  # set by `studyrunner.cli.main`


def supervise(on_stuck: Callable[[], str]) -> None:
    """Fork where supervision is on: the child returns and runs the command; the parent never returns (it exits
    as described in the module's docstring). Elsewhere (off, or no fork) a no-op."""
    if not enabled or not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return
    grace = seconds("STUDYRUNNER_STOP_GRACE", 30.0, positive=True)
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)  # none is lost between the fork and the parent's wait
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)  # signals meant for the command come through the parent, once
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WATCHED)
        _die_with(parent)
        return
    _watch(child, grace, on_stuck)


def _die_with(parent: int) -> None:
    """In the child: be killed when the parent dies (or has died already)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(137)


def _watch(child: int, grace: float, on_stuck: Callable[[], str]) -> None:
    stop_asked: float | None = None
    while True:
        info = signal.sigtimedwait(WATCHED, 0.5)
        ended = _reaped(child)
        if ended is not None:
            _exit_as(ended)
        if info is not None and info.si_signo in STOP_SIGNALS:
            stop_asked = stop_asked or time.monotonic()
            _send(child, info.si_signo)
        if stop_asked is not None and time.monotonic() - stop_asked > grace:
            _kill_tree(child)
            _reaped(child, wait=True)
            try:
                line = on_stuck()
            except Exception:  # noqa: BLE001 - the exit and its code come first
                line = "interrupted"
            sys.stderr.write(line.rstrip("\n") + "\n")
            sys.stderr.flush()
            os._exit(130)


def _reaped(child: int, wait: bool = False) -> int | None:
    """The child's wait status once it has ended (None while it runs)."""
    try:
        pid, status = os.waitpid(child, 0 if wait else os.WNOHANG)
    except ChildProcessError:
        return 0
    return status if pid else None


def _exit_as(status: int) -> None:
    """End this process as the child ended: its exit code, or killed by its signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # their action cannot be changed (nor needs to be)
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill_tree(child: int) -> None:
    """SIGKILL the child and every process it started (its Ray: the GCS, raylet, agents and workers)."""
    import psutil

    try:
        tree = [psutil.Process(child), *psutil.Process(child).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        try:
            proc.kill()
        except psutil.Error:
            pass
