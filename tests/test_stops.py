"""How a submit ends when stopped from outside, with real processes: SIGTERM ends it as
Ctrl-C does (exit 130, the resume line, its Ray stopped), and its PostgreSQL ledger going away mid-study ends
it with exit 1 and the resume command (password masked), after which `resume` finishes the study."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from sqlalchemy import select
from test_faults import cli, finish, ray_processes, statuses, study_text, wait_for
from test_ledger import _pg_bin

from studyrunner.store import Ledger
from studyrunner.store.db import SubmissionRow

pytestmark = [pytest.mark.e2e, pytest.mark.faults]


def session_dirs(ledger: Ledger, study: str) -> list[str]:
    with ledger.session() as s:
        return [r for r in s.scalars(select(SubmissionRow.ray_session_dir).where(SubmissionRow.study == study)) if r]


def test_sigterm_ends_a_submit_as_ctrl_c_does(tmp_path):
    study = tmp_path / "term.yaml"
    study.write_text(study_text("term", steps=3000, seeds="[0]"))
    ws = tmp_path / "ws"
    driver = cli("submit", str(study), "--no-progress", workspace=ws)
    wait_for(lambda: "running" in statuses(ws, "term").values(), timeout=300, what="a trial to be running")
    driver.send_signal(signal.SIGTERM)
    code, output = finish(driver, timeout=300)
    assert code == 130, output  # was -6: Ray's C++ signal handler aborted the process
    assert "SIGTERM received" not in output and "Traceback" not in output, output
    assert "resume with: studyrunner resume term" in output, output
    ledger = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False)
    rows = ledger.trials("term")
    assert {r.status for r in rows} == {"pending"} and all(r.owner is None for r in rows)
    (session,) = session_dirs(ledger, "term")
    wait_for(lambda: not ray_processes(session), timeout=60, what="the submit's Ray processes to end")


def test_sigterm_while_ray_starts_ends_the_submit_as_well(tmp_path):
    """SIGTERM as soon as the submit says what it will run: Ray is starting, and its handlers (a Python one
    whose exit Python drops inside an after-fork hook, a C++ one that aborts) must neither lose nor abort it."""
    study = tmp_path / "early.yaml"
    study.write_text(study_text("early", steps=3000, seeds="[0]"))
    ws = tmp_path / "ws"
    driver = cli("submit", str(study), "--no-progress", workspace=ws)
    said: list[str] = []

    def read() -> None:
        for line in driver.stderr:
            said.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: any(" to run" in line for line in said), timeout=300, what="the submit to start its Ray")
    driver.send_signal(signal.SIGTERM)
    code = driver.wait(timeout=300)
    reader.join(timeout=60)
    output = "".join(said)
    assert code == 130, output
    assert "esume with: studyrunner resume early" in output, output  # "Resume with" or "resume with"
    assert "Traceback" not in output and "SIGTERM received" not in output and "ignored" not in output, output
    rows = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False).trials("early")
    assert {r.status for r in rows} == {"pending"} and all(r.owner is None for r in rows)


class Postgres:
    """A PostgreSQL server on 127.0.0.1 that a test can stop mid-study and start again."""

    def __init__(self) -> None:
        bindir = _pg_bin()
        if not bindir:
            pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
        pytest.importorskip("psycopg")
        self.data = Path(tempfile.mkdtemp(prefix="sr-pg-"))  # pytest's tmp folders are private to root
        self.as_user = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            shutil.chown(self.data, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.bindir = bindir
        self.run("initdb", "-D", str(self.data / "db"), "-U", "postgres", "--auth=trust")
        self.start()
        self.run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "ledger")

    def run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_user, f"{self.bindir}/{tool}", *args], check=True, capture_output=True, text=True)

    def start(self) -> None:
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data}"
        self.run("pg_ctl", "-D", str(self.data / "db"), "-o", opts, "-l", str(self.data / "log"), "-w", "start")

    def stop(self, mode: str = "immediate") -> None:
        self.run("pg_ctl", "-D", str(self.data / "db"), "-m", mode, "-w", "stop")

    def url(self, password: str) -> str:  # the server trusts every local user: any password will do
        return f"postgresql+psycopg://postgres:{password}@127.0.0.1:{self.port}/ledger"


@pytest.fixture
def postgres():
    server = Postgres()
    yield server
    try:
        server.stop("fast")
    except subprocess.CalledProcessError:
        pass  # already stopped
    shutil.rmtree(server.data, ignore_errors=True)


def test_a_postgresql_outage_mid_study_exits_1_with_the_resume_command(tmp_path, postgres):
    password = "pw-never-printed-42"
    url = postgres.url(password)
    study = tmp_path / "outage.yaml"
    study.write_text(study_text("outage", steps=1500, seeds="[0]"))
    ws = tmp_path / "ws"
    driver = cli("submit", str(study), "--no-progress", "--db", url, workspace=ws)

    def running() -> bool:
        try:
            return any(r.status == "running" for r in Ledger(url, create=False).trials("outage"))
        except Exception:  # noqa: BLE001 - the ledger is still being created by the submit
            return False

    try:
        wait_for(running, timeout=300, what="a trial to be running")
        postgres.stop()  # the database goes away mid-study
        code, output = finish(driver, timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert code == 1, output  # not 0: the study did not finish
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    assert "stopped answering mid-study" in errors[0] and "Once the database answers again:" in errors[0], output
    masked = url.replace(password, "***")
    assert f"studyrunner resume outage --db {shlex.quote(masked)}" in errors[0], output
    assert password not in output and "Traceback" not in output, output

    postgres.start()
    ledger = Ledger(url, create=False)
    assert {r.status for r in ledger.trials("outage")} != {"succeeded"}  # left unfinished, for resume
    for session in session_dirs(ledger, "outage"):  # its Ray was stopped all the same
        wait_for(lambda session=session: not ray_processes(session), timeout=60, what="the submit's Ray to end")
    code, output = finish(cli("resume", "outage", "--no-progress", "--db", url, workspace=ws), timeout=600)
    assert code == 0, output
    rows = ledger.trials("outage")
    assert {r.status for r in rows} == {"succeeded"} and all(r.owner is None for r in rows)
