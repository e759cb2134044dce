"""A password in a URL is never printed or stored.

A real PostgreSQL server on 127.0.0.1 that asks for a password holds the ledger and the MLflow store; a study
is submitted, analysed, reported and served with `ui`, and wrong passwords and a missing database are tried.
Then everything the product printed or wrote is searched for the password: the console, the report (also
uploaded to MLflow), the MLflow artifacts, the server log, Ray's files, both databases, the `ui` server's
command line."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import TINY_STUDY
from test_ledger import _pg_bin
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.urls import mask_text, mask_url, passwords, without_password

PASSWORD = "Sh0wMeNot-h21b"
EXE = [sys.executable, "-m", "studyrunner.cli"]


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    """A throwaway PostgreSQL server on 127.0.0.1 whose user `sr` logs in with PASSWORD over TCP."""
    pytest.importorskip("psycopg")
    bindir = _pg_bin()
    if not bindir:
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    data = Path(tempfile.mkdtemp(prefix="sr-pgpw-"))
    as_user = []
    pwfile = data / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(data, "postgres")
        shutil.chown(pwfile, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = lambda *cmd, **kw: subprocess.run([*as_user, *cmd], check=True, capture_output=True, text=True, **kw)  # noqa: E731
    run(f"{bindir}/initdb", "-D", str(data / "db"), "-U", "sr", "--auth-local=trust", "--auth-host=scram-sha-256",
        f"--pwfile={pwfile}")  # fmt: skip
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {data}"
    run(f"{bindir}/pg_ctl", "-D", str(data / "db"), "-o", opts, "-l", str(data / "log"), "-w", "start")
    env = {**os.environ, "PGPASSWORD": PASSWORD}
    try:
        for db in ("ledger", "mlflow"):
            run(f"{bindir}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "sr", db, env=env)
        yield {
            "base": f"postgresql+psycopg://sr:{PASSWORD}@127.0.0.1:{port}",
            "dump": lambda db: run(f"{bindir}/pg_dump", "-h", "127.0.0.1", "-p", str(port), "-U", "sr", db, env=env),
        }
    finally:
        run(f"{bindir}/pg_ctl", "-D", str(data / "db"), "-m", "fast", "-w", "stop")
        shutil.rmtree(data, ignore_errors=True)


def sr(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STUDYRUNNER_DB", "MLFLOW_TRACKING_URI", "PGPASSWORD")}
    return subprocess.run([*EXE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def files_holding(root: Path, secret: str) -> list[str]:
    needle = secret.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.e2e
def test_a_password_in_a_url_is_never_printed_or_stored(pg, tmp_path):
    db, tracking = f"{pg['base']}/ledger", f"{pg['base']}/mlflow"
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY_STUDY)
    ws = tmp_path / "ws"
    where = ("--db", db, "--tracking-uri", tracking, "--workspace", str(ws))
    printed: list[str] = []

    def run(*args: str, code: int = 0):
        """The command in this process (the real CLI, without a second interpreter's start-up)."""
        result = CliRunner().invoke(app, list(args))
        printed.append(f"$ studyrunner {args[0]}\n{result.stdout}{result.stderr}")
        assert result.exit_code == code, printed[-1]
        return result

    submitted = sr("submit", str(study), "--no-progress", *where)  # a real submit: Ray, its workers, MLflow
    printed.append(f"$ studyrunner submit\n{submitted.stdout}{submitted.stderr}")
    assert submitted.returncode == 0, printed[-1]
    assert "ledger: postgresql+psycopg://sr:***@127.0.0.1" in submitted.stderr
    assert "PGPASSWORD" in submitted.stderr  # the `ui` hint says where the hidden password goes
    run("status", *where[:2])
    run("results", "tiny", *where[:2])
    run("analyze", "tiny", *where[:2])
    run("report", "tiny", *where)
    run("db", "current", *where[:2])
    run("db", "upgrade", *where[:2])
    run("resume", "tiny", "--no-progress", *where)
    run("analyze", "no-such-study", *where[:2], code=1)  # "no study named ... in URL"
    wrong = db.replace(PASSWORD, "not-" + PASSWORD[::-1])
    for args in (
        ("status", "--db", wrong),
        ("status", "--db", f"{pg['base']}/no_such_db"),
        ("submit", str(study), "--no-progress", "--db", f"{pg['base']}/no_such_db", "--workspace", str(ws)),
        ("submit", str(study), "--no-progress", *where[:2], "--tracking-uri", f"{pg['base']}/no_such_db", *where[4:]),
        ("sync-mlflow", "tiny", *where[:2], "--tracking-uri", tracking.replace(PASSWORD, "wrong-pw"), *where[4:]),
    ):
        proc = run(*args, code=1)
        assert "***" in proc.stderr, printed[-1]
    with serving_ui(where, printed) as (port, ui_args):
        # MLflow's own server, with the password in its URL (basic auth): `report` links runs there and logs to it
        server = f"http://sr:{PASSWORD}@127.0.0.1:{port}"
        report = sr("report", "tiny", *where[:2], "--tracking-uri", server, "--out", str(tmp_path / "report-http"))
        printed.append(f"$ studyrunner report\n{report.stdout}{report.stderr}")
        assert report.returncode == 0 and "logged to MLflow run" in report.stderr, printed[-1]
    assert "http://sr@127.0.0.1" in (tmp_path / "report-http" / "tiny-report.html").read_text()  # run links

    console = "\n".join(printed)
    assert PASSWORD not in console, [block for block in printed if PASSWORD in block][0]
    assert PASSWORD not in ui_args  # the MLflow server's command line, which `ps` shows every user
    assert (ws / "reports" / "tiny-report.html").is_file()
    assert list(ws.glob("mlartifacts/**/tiny-report.html"))  # the report as uploaded to MLflow
    assert files_holding(ws, PASSWORD) == []  # report, MLflow artifacts, curves, checkpoints, Ray's files, logs
    assert files_holding(tmp_path / "report-http", PASSWORD) == []
    for database in ("ledger", "mlflow"):  # params, tags, messages: nothing stores it
        assert PASSWORD not in pg["dump"](database).stdout


@contextmanager
def serving_ui(where: tuple[str, ...], printed: list[str]) -> Iterator[tuple[int, str]]:
    """`ui` on the PostgreSQL stores, serving: (its port, its MLflow server's command line); stopped after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("STUDYRUNNER_DB", "MLFLOW_TRACKING_URI")}
    proc = subprocess.Popen(
        [*EXE, "ui", "--port", str(port), *where],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    args = ""
    try:
        deadline = time.monotonic() + 180
        while not args and proc.poll() is None and time.monotonic() < deadline:
            servers = [line for line in _descendants(proc.pid) if "mlflow" in line and "server" in line]
            if servers and _answers(port):
                args = "\n".join(servers)
            time.sleep(1)
        assert args, "`ui` did not serve"
        yield port, args
    finally:
        os.killpg(proc.pid, 15)
        out, err = proc.communicate(timeout=60)
        printed.append(f"$ studyrunner ui\n{out}{err}")


def _descendants(pid: int) -> list[str]:
    """The command lines of the processes below `pid`."""
    table = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout.splitlines()
    rows = [line.split(None, 2) for line in table if len(line.split(None, 2)) == 3]
    found, below = {pid}, []
    for _ in range(5):  # a few generations: the server, its workers
        for child, parent, args in rows:
            if int(parent) in found and int(child) not in found:
                found.add(int(child))
                below.append(args)
    return below


def _answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://sr:pw%40x@db:5432/l", "postgresql+psycopg://sr:***@db:5432/l"),
        ("postgresql+psycopg://sr:p@ss@db/l", "postgresql+psycopg://sr:***@db/l"),  # an unescaped '@'
        (
            "postgresql+psycopg://sr@db/l?sslmode=require&password=x",
            "postgresql+psycopg://sr@db/l?sslmode=require&password=***",
        ),
        ("postgresql+psycopg://sr@db/l", "postgresql+psycopg://sr@db/l"),
        ("sqlite:////tmp/a b/ledger.db", "sqlite:////tmp/a b/ledger.db"),
        ("https://me:pw@mlflow:8443/x?token=abc&a=1", "https://me:***@mlflow:8443/x?token=***&a=1"),
        ("s3://AKIA:se/cret@bucket/p", "s3://AKIA:***@bucket/p"),  # an AWS secret with an unescaped '/'
        ("s3://bucket/p?secret_key=k&region=x", "s3://bucket/p?secret_key=***&region=x"),
        ("http://host:8080/p@x", "http://host:8080/p@x"),  # a port, not a password
        ("/a/local/folder", "/a/local/folder"),
        ("postgresql+psycopg://sr:pw@[::1", "postgresql+psycopg://sr:***@[::1"),  # unparsable: masked as text
        ("postgresql+psycopg//sr:pw@db/l", "postgresql+psycopg//sr:***@db/l"),  # a ':' missing
        ("", ""),
    ],  # fmt: skip
)
def test_mask_url(url, shown):
    assert mask_url(url) == shown


def test_mask_text_hides_the_passwords_of_urls_wherever_they_are_quoted():
    url = "postgresql+psycopg://sr:postgres@db/ledger"
    text = mask_text(f"failed: {url} (password postgres); postgresql is fine", url)
    assert text == "failed: postgresql+psycopg://sr:***@db/ledger (password ***); postgresql is fine"
    assert "p@ss" in passwords("postgresql+psycopg://sr:p%40ss@db/l")
    assert without_password("https://me:pw@mlflow:8443") == "https://me@mlflow:8443"
    assert mask_url(None) == "None" and mask_text(b"\xff") == "b'\\xff'"  # garbage in: no exception


# --- a password holding characters a URL reserves ---------------------------------------------------------

RAW = "Wr@ngPwQQ2"  # an '@' left unencoded: drivers read "Wr" as the password and "ngPwQQ2@host" as the host


@pytest.mark.parametrize(
    "option,url",
    [
        ("--db", f"postgresql+psycopg://sr:{RAW}@127.0.0.1:1/ledger"),
        ("--tracking-uri", f"postgresql+psycopg://sr:{RAW}@127.0.0.1:1/mlflow"),
        ("--tracking-uri", f"https://me:{RAW}@127.0.0.1:1"),
        ("--db", "postgresql+psycopg://sr:a/b@127.0.0.1:1/ledger"),
        ("--db", "postgresql+psycopg://sr:50%zz@127.0.0.1:1/ledger"),
    ],
)
def test_a_password_with_unencoded_reserved_characters_is_refused_before_anything(tmp_path, option, url):
    """Refused in one line that names the option and how to encode the password, shows no piece of it, and
    leaves no workspace behind; read verbs and submit alike."""
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY_STUDY)
    ws = tmp_path / "ws"
    read = ["status"] if option == "--db" else ["ui", "--port", "1"]  # verbs that take the option
    for args in (read, ["submit", str(study), "--workspace", str(ws)]):
        result = CliRunner().invoke(app, [*args, option, url])
        assert result.exit_code == 2, result.output
        errors = [line for line in result.output.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith(f"error: {option}"), result.output
        assert "percent-encode" in errors[0] and "%" in errors[0]
        for piece in ("ngPwQQ2", "Wr@", "a/b", "50%zz"):
            assert piece not in result.output
        assert not ws.exists()


def test_a_correctly_encoded_password_is_accepted():
    from studyrunner.urls import unencoded_password_chars

    assert unencoded_password_chars("postgresql+psycopg://sr:Wr%40ngPwQQ2@127.0.0.1/l") == ""
    assert unencoded_password_chars("http://host:8080/p@x") == ""  # a port and a path, no password
    assert unencoded_password_chars("sqlite:////tmp/a@b/ledger.db") == ""


def test_a_driver_quoting_a_password_cut_at_a_raw_at_sign_is_masked():
    url = f"postgresql+psycopg://sr:{RAW}@127.0.0.1:55433/ledger"
    shown = mask_text("failed to resolve host 'ngPwQQ2@127.0.0.1'", url)
    assert "ngPwQQ2" not in shown, shown


def test_an_interrupted_submit_offers_resume_only_for_a_registered_study(tmp_path):
    from studyrunner.cli.running import _where_next
    from studyrunner.workspace import Workspace

    ws = Workspace.resolve(tmp_path / "ws")
    again = ws.hint("submit", "tiny.yaml")
    assert "Run it again with: studyrunner submit tiny.yaml" in _where_next(ws, "tiny", again)  # no ledger at all
    CliRunner().invoke(app, ["db", "upgrade", "--workspace", str(tmp_path / "ws")])
    assert "study tiny was not registered yet" in _where_next(ws, "tiny", again)  # a ledger without it
    assert "Resume with: studyrunner resume tiny" in _where_next(ws, "tiny", None)  # resume/rerun: it exists


def test_a_database_lost_inside_mlflow_is_blamed_on_the_tracking_store(tmp_path):
    """A database error raised in MLflow's code (its store's tables gone) names the MLflow store, not the ledger."""
    import sqlite3

    from mlflow import MlflowClient
    from sqlalchemy.exc import DBAPIError

    from studyrunner.cli.running import _database_error, _store_lost
    from studyrunner.workspace import Workspace

    ws = Workspace.resolve(tmp_path / "ws")
    ws.ensure()
    client = MlflowClient(ws.tracking_uri)
    client.search_experiments()
    with sqlite3.connect(tmp_path / "ws" / "mlflow.db") as con:
        con.execute("DROP TABLE runs")
    with pytest.raises(Exception) as caught:
        client.create_run(client.create_experiment("x"))
    lost = _database_error(caught.value)
    assert isinstance(lost, DBAPIError)
    line = _store_lost(ws, "tiny", lost, caught.value, None)
    assert line.startswith("the MLflow tracking store sqlite:///") and "results ledger" not in line, line


def test_an_unreachable_tracking_server_leaves_no_workspace(tmp_path):
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY_STUDY)
    ws = tmp_path / "ws"
    result = CliRunner().invoke(
        app, ["submit", str(study), "--workspace", str(ws), "--tracking-uri", "http://127.0.0.1:1"]
    )
    assert result.exit_code == 1 and "cannot reach MLflow tracking server" in result.output, result.output
    assert "to run" not in result.output and not ws.exists()
