"""One running `submit`, `resume` or `rerun`: the lease it holds on the trials it runs, kept alive by a
heartbeat thread, and the clean-up of one that died (`kill -9`) without releasing anything.

The lease lives in the ledger (trials.owner -> submissions), not in a file lock, so it works the same
on SQLite and on a PostgreSQL ledger shared by many machines.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

from ..settings import seconds_or_default
from ..store import Ledger

log = logging.getLogger(__name__)

HEARTBEAT_S = seconds_or_default("STUDYRUNNER_HEARTBEAT", 5.0, positive=True)


class Submission:
    """`with Submission(...) as sub:` beats every HEARTBEAT_S seconds; `sub.cancelled` is set when
    `studyrunner cancel` asked this submission to stop; `sub.close()` releases what it did not finish."""

    def __init__(self, ledger: Ledger, study: str, command: str) -> None:
        self.ledger, self.study = ledger, study
        self.id = ledger.open_submission(study, command)
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def __enter__(self) -> Submission:
        self._thread = threading.Thread(target=self._beat, name="studyrunner-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if self.ledger.heartbeat(self.id):
                    self.cancelled.set()
            except Exception as exc:  # noqa: BLE001 - a ledger hiccup must not end the study
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                log.warning("could not write the submission heartbeat: %s", first)

    def close(self) -> list[str]:
        """Release the leases: unfinished trials go back to pending (cancelled, if asked to cancel)."""
        if self._closed:
            return []
        self._closed = True
        self._stop.set()
        return self.ledger.release(self.id, cancelled=self.cancelled.is_set())


def reap_dead(ledger: Ledger, study: str | None = None) -> dict[str, list[str]]:
    """Close submissions whose process is gone: their unfinished trials go back to pending, and the
    local Ray they started (its raylet, GCS, dashboard and runtime-env agents outlive a `kill -9`ed
    driver) is stopped. Returns {submission id: trial keys released}."""
    released: dict[str, list[str]] = {}
    for sub in ledger.dead_submissions(study):
        if sub.ray_session_dir and sub.host == socket.gethostname():
            stopped = stop_ray_session(sub.ray_session_dir)
            if stopped:
                log.info("stopped %d Ray processes left by submission %s", stopped, sub.id)
        released[sub.id] = ledger.release(sub.id, died=True)
    return released


def _processes_of(session_dir: str) -> list[int]:
    """Processes of a Ray session: its daemons name the session folder on their command line; its
    agents rename themselves (`ray::DashboardAgent`) but keep their logs in it open."""
    name = Path(session_dir).name
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if name in cmdline or (cmdline.startswith("ray::") and _has_open_file_in(entry, name)):
            found.append(int(entry.name))
    return found


def _has_open_file_in(proc: Path, folder_name: str) -> bool:
    try:
        return any(folder_name in os.readlink(fd) for fd in (proc / "fd").iterdir())
    except OSError:
        return False


def stop_ray_session(session_dir: str, grace_s: float = 3.0) -> int:
    """SIGTERM, then SIGKILL, every process of a local Ray session; returns how many there were."""
    if not Path("/proc").is_dir():
        return 0
    pids = _processes_of(session_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
    return len(pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
