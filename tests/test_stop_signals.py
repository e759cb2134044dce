"""A SIGTERM ends `submit` with exit 130 and the line that says how to go on, whatever state its Ray is in: a GCS
that never answers while Ray starts (the driver then blocks in Ray's C++ core holding the GIL, where no handler of
its own can run) and a raylet that stops answering once trials are registered. Faults are injected into the real
Ray processes (SIGSTOP); the command's watching parent (cli/supervise.py) kills what does not stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_faults import study_text, wait_for

from studyrunner.store import Ledger

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

EXE = [sys.executable, "-m", "studyrunner.cli"]
GRACE_S = 5


def start_submit(tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path]:
    study = tmp_path / f"{name}.yaml"
    study.write_text(study_text(name, steps=200_000, seeds="[0, 1]"))
    ws = tmp_path / "ws"
    env = {**os.environ, "STUDYRUNNER_STOP_GRACE": str(GRACE_S)}
    for variable in ("STUDYRUNNER_HOME", "STUDYRUNNER_DB", "MLFLOW_TRACKING_URI", "STUDYRUNNER_STORAGE"):
        env.pop(variable, None)
    proc = subprocess.Popen(
        [*EXE, "submit", str(study), "--workspace", str(ws), "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, ws


def tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def named(pid: int, name: str) -> psutil.Process | None:
    return next((p for p in tree(pid) if _name(p) == name), None)


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


def stop_and_collect(proc: subprocess.Popen) -> tuple[int, str, float]:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=GRACE_S + 120)
    return proc.returncode, out + err, time.monotonic() - started


def alive(processes: list[psutil.Process]) -> list[int]:
    return [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_sigterm_while_the_gcs_hangs_at_start_ends_130_with_nothing_written(tmp_path):
    proc, ws = start_submit(tmp_path, "hung")
    try:
        gcs = wait_for(lambda: named(proc.pid, "gcs_server"), timeout=120, what="the GCS to start")
        gcs.send_signal(signal.SIGSTOP)  # the driver now waits for it, inside ray.init
        time.sleep(3)
        processes = tree(proc.pid)
        code, output, took = stop_and_collect(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, output
    assert "*** SIGTERM received" not in output  # Ray's C++ handler no longer aborts the driver (exit 134)
    last = output.strip().splitlines()[-1]
    assert last.startswith("interrupted;") and "Run it again with: studyrunner submit" in last, output
    assert took < GRACE_S + 60
    time.sleep(1)
    assert alive(processes) == []  # the stopped GCS and everything else of that Ray: gone
    assert not ws.exists()  # Ray starts before anything is written


def test_sigterm_while_the_raylet_hangs_after_registration_ends_130_with_the_resume_line(tmp_path):
    proc, ws = start_submit(tmp_path, "stuck")
    try:
        wait_for(lambda: (ws / "ledger.db").exists() and _registered(ws, "stuck"), timeout=180, what="registration")
        raylet = wait_for(lambda: named(proc.pid, "raylet"), timeout=30, what="the raylet")
        processes = tree(proc.pid)
        raylet.send_signal(signal.SIGSTOP)
        time.sleep(2)
        code, output, took = stop_and_collect(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, output
    assert "Resume with: studyrunner resume stuck --workspace" in output or "resume with: studyrunner resume stuck" in (
        output
    ), output
    assert took < GRACE_S + 60
    assert "no trial reported" not in output  # an interrupted study has nothing to warn about yet
    time.sleep(1)
    assert alive(processes) == []
    statuses = {t.status for t in Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False).trials("stuck")}
    assert statuses <= {"pending", "succeeded"}, statuses  # nothing left `running` under a dead submit


def _registered(ws: Path, study: str) -> bool:
    try:
        return bool(Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False, read_only=True).trials(study))
    except Exception:  # noqa: BLE001 - being created by the process under test
        return False


# The watching parent alone (no Ray): it ends as the child does, passes stop signals on once, and kills a child
# that does not stop within the grace.
CHILD = """
import os, signal, sys, time
from studyrunner.cli import supervise
supervise.enabled = True
supervise.supervise(lambda: "stuck-line")
what = sys.argv[1]
if what == "exit":
    sys.exit(7)
if what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "term":
    signal.signal(signal.SIGTERM, lambda *_: (print("child got SIGTERM", flush=True), sys.exit(130)))
    print("ready", flush=True)
    time.sleep(60)
if what == "stuck":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(60)
"""


def supervised(what: str, grace: str = "2") -> subprocess.Popen:
    env = {**os.environ, "STUDYRUNNER_STOP_GRACE": grace}
    return subprocess.Popen([sys.executable, "-c", CHILD, what], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.mark.parametrize("what,code", [("exit", 7), ("kill", -9)])
def test_the_command_ends_as_its_child_does(what, code):
    proc = supervised(what)
    assert proc.wait(timeout=60) == code


def test_a_sigterm_reaches_the_child_once_and_a_stuck_child_is_killed_after_the_grace():
    proc = supervised("term")
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out.count("child got SIGTERM") == 1, out
    stuck = supervised("stuck")
    assert stuck.stdout.readline().strip() == "ready"
    children = tree(stuck.pid)
    stuck.send_signal(signal.SIGTERM)
    out, err = stuck.communicate(timeout=60)
    assert stuck.returncode == 130 and err.strip().endswith("stuck-line"), err
    time.sleep(0.5)
    assert alive(children) == []
