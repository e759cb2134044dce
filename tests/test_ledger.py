"""Ledger semantics on SQLite and, where its binaries are installed, a real PostgreSQL on 127.0.0.1."""

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import TINY_STUDY

from studyrunner.results import trials_frame
from studyrunner.store import Ledger
from studyrunner.study import compile_study, loads


def _pg_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else shutil.which("initdb") and os.path.dirname(shutil.which("initdb"))


@pytest.fixture(scope="module")
def postgres_url():
    """A throwaway PostgreSQL server on 127.0.0.1 (skipped where PostgreSQL is not installed)."""
    pytest.importorskip("psycopg")
    bindir = _pg_bin()
    if not bindir:
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    data = Path(tempfile.mkdtemp(prefix="sr-pg-"))  # pytest's tmp folders are private to root
    as_user = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(data, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = lambda *cmd: subprocess.run([*as_user, *cmd], check=True, capture_output=True, text=True)  # noqa: E731
    run(f"{bindir}/initdb", "-D", str(data / "db"), "-U", "postgres", "--auth=trust")
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {data}"
    run(f"{bindir}/pg_ctl", "-D", str(data / "db"), "-o", opts, "-l", str(data / "log"), "-w", "start")
    try:
        run(f"{bindir}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "ledger")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/ledger"
    finally:
        run(f"{bindir}/pg_ctl", "-D", str(data / "db"), "-m", "fast", "-w", "stop")
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        yield Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
        return
    url = request.getfixturevalue("postgres_url")
    led = Ledger(url)
    yield led
    from sqlalchemy import text

    from studyrunner.store.db import Base

    Base.metadata.drop_all(led.engine)
    with led.engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))


@pytest.mark.e2e
def test_register_is_idempotent_and_leaves_failed_trials_to_rerun(ledger):
    compiled = compile_study(loads(TINY_STUDY))
    keys = [t.trial_key for t in compiled.trials]
    first = ledger.register(compiled)
    assert first.new == 4 and sorted(first.to_run) == sorted(keys) and first.skipped == []
    again = ledger.register(compiled)
    assert again.new == 0 and sorted(again.to_run) == sorted(keys)

    ledger.mark_running(keys[0], run_id="r0")
    ledger.mark_succeeded(keys[0], {"eval_accuracy": 0.75, "params": 1234.0})
    ledger.mark_running(keys[1])
    ledger.mark_failed(keys[1], "ValueError: boom\ntraceback...")
    ledger.mark_running(keys[2])  # left running by a crashed driver (no lease holder: stale)

    third = ledger.register(compiled)
    assert third.skipped == [keys[0]]
    assert third.to_run == [keys[3]]  # failed -> `rerun --failed`; running-without-holder -> `resume`
    assert sorted(third.held) == sorted(keys[1:3])
    rows = {r.trial_key: r for r in ledger.trials("tiny")}
    assert rows[keys[0]].status == "succeeded" and rows[keys[0]].metrics == {"eval_accuracy": 0.75, "params": 1234.0}
    assert rows[keys[0]].mlflow_run_id == "r0" and rows[keys[0]].attempts == 1
    assert rows[keys[1]].status == "failed" and rows[keys[1]].error.startswith("ValueError")
    assert rows[keys[1]].failure_class == "error"
    assert ledger.stale_keys("tiny", stale_after=60) == {keys[2]}
    attempts = ledger.attempts(keys[1])
    assert [(a.number, a.status, a.error_class, a.message) for a in attempts] == [
        (1, "failed", "error", "ValueError: boom")
    ]


@pytest.mark.e2e
def test_leases_give_each_trial_to_one_submission(ledger):
    compiled = compile_study(loads(TINY_STUDY))
    keys = [t.trial_key for t in compiled.trials]
    ledger.register(compiled)
    a = ledger.open_submission("tiny", "submit")
    b = ledger.open_submission("tiny", "submit")
    assert sorted(ledger.claim("tiny", keys, a)) == sorted(keys)
    assert ledger.claim("tiny", keys, b) == []  # a is alive: b gets nothing
    ledger.start_attempt(keys[0], a, run_id="r0")
    ledger.finish(keys[0], "succeeded", metrics={"eval_accuracy": 1.0})
    ledger.start_attempt(keys[1], a)
    assert sorted(ledger.release(a)) == sorted(keys[1:])  # a stops (Ctrl-C): unfinished back to pending
    rows = {r.trial_key: r for r in ledger.trials("tiny")}
    assert rows[keys[1]].status == "pending" and rows[keys[1]].failure_class == "interrupted"
    assert all(r.owner is None for r in rows.values())
    assert [x.status for x in ledger.attempts(keys[1])] == ["interrupted"]
    assert sorted(ledger.claim("tiny", keys, b)) == sorted(keys[1:])  # succeeded trials are never claimed


@pytest.mark.e2e
def test_two_reapers_of_one_dead_submission_leave_the_new_lease_alone(ledger):
    """Two resumes reap the same dead driver at once. The slower one must not undo the lease the faster one
    took in between: it did (it read the driver's trials, then wrote them by key), and both ran every trial.
    The faster resume's claim is run exactly between the slower reaper's reads and writes."""
    from sqlalchemy import event

    compiled = compile_study(loads(TINY_STUDY))
    keys = [t.trial_key for t in compiled.trials]
    ledger.register(compiled)
    driver = ledger.open_submission("tiny", "submit")
    ledger.claim("tiny", keys, driver)
    for key in keys:
        ledger.start_attempt(key, driver)
    fast, slow = Ledger(ledger.url, create=False), Ledger(ledger.url, create=False)
    taken: list[str] = []

    def fast_resume_reaps_and_claims() -> None:
        fast.release(driver, died=True)
        taken.append(fast.open_submission("tiny", "resume"))
        assert sorted(fast.claim("tiny", keys, taken[0])) == sorted(keys)

    def between(conn, cursor, statement, *args) -> None:
        if not taken and statement.lstrip().upper().startswith("SELECT") and "FROM trials" in statement:
            fast_resume_reaps_and_claims()

    event.listen(slow.engine, "after_cursor_execute", between)
    try:
        slow.release(driver, died=True)
    finally:
        event.remove(slow.engine, "after_cursor_execute", between)
    if not taken:  # the reaper read nothing it then wrote: the claim comes after it
        fast_resume_reaps_and_claims()
    assert {r.owner for r in ledger.trials("tiny")} == {taken[0]}
    slower = ledger.open_submission("tiny", "resume")
    assert ledger.claim("tiny", keys, slower) == []  # the slow resume runs nothing
    assert {r.status for r in ledger.trials("tiny")} == {"pending"}
    assert all([a.status for a in ledger.attempts(k)] == ["interrupted"] for k in keys)


@pytest.mark.e2e
@pytest.mark.parametrize("before", ["nobody", "a dead submit"])
def test_two_submits_claiming_one_search_at_once_give_it_to_exactly_one(ledger, before):
    """Two submits of a search started at the same moment must not both run it (as they would if the check came
    before the submission registered itself). The second claim is run exactly between the first's read of which
    submissions are dead and its conditional write, with the search free or held by a dead submit."""
    from datetime import timedelta

    from sqlalchemy import event

    from studyrunner.store.db import utcnow

    compiled = compile_study(loads(TINY_STUDY))
    ledger.ensure_study(compiled.study)
    ledger.ensure_study(compiled.study)  # idempotent
    if before != "nobody":
        dead = ledger.open_submission("tiny", "submit")
        assert ledger.claim_owner("tiny", dead) is None
        _set_submission(ledger, dead, host="another-host", heartbeat_at=utcnow() - timedelta(hours=1))
    first, second = Ledger(ledger.url, create=False), Ledger(ledger.url, create=False)
    a, b = first.open_submission("tiny", "submit"), second.open_submission("tiny", "submit")
    won: list = []

    def between(conn, cursor, statement, *args) -> None:
        if not won and statement.lstrip().upper().startswith("SELECT") and "FROM submissions" in statement:
            won.append(second.claim_owner("tiny", b))

    event.listen(first.engine, "after_cursor_execute", between)
    try:
        holder = first.claim_owner("tiny", a)
    finally:
        event.remove(first.engine, "after_cursor_execute", between)
    assert won == [None]  # the second submit took the search in between
    assert holder is not None and holder.id == b  # and the first, which had seen it free, did not
    assert first.claim_owner("tiny", a) is not None and second.claim_owner("tiny", b) is None
    first.release(a)  # the loser ends: the winner keeps the search
    late = ledger.open_submission("tiny", "resume")
    assert ledger.claim_owner("tiny", late).id == b
    second.release(b)  # the winner ends: the search is free again
    assert ledger.claim_owner("tiny", late) is None


@pytest.mark.e2e
def test_a_dead_search_holder_is_taken_over_and_a_live_one_never(ledger):
    import subprocess
    import sys

    compiled = compile_study(loads(TINY_STUDY))
    ledger.ensure_study(compiled.study)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holder = ledger.open_submission("tiny", "submit")
        _set_submission(ledger, holder, pid=live.pid)
        assert ledger.claim_owner("tiny", holder) is None
        other = ledger.open_submission("tiny", "submit")
        assert ledger.claim_owner("tiny", other, stale_after=0).id == holder  # alive: never taken over
    finally:
        live.kill()
        live.wait()
    assert ledger.claim_owner("tiny", other) is None  # killed (-9): its search is taken over at once


def _set_submission(ledger: Ledger, sid: str, **values) -> None:
    from sqlalchemy import update

    from studyrunner.store.db import SubmissionRow

    with ledger.session() as s, s.begin():
        s.execute(update(SubmissionRow).where(SubmissionRow.id == sid).values(**values))


@pytest.mark.e2e
def test_a_silent_submission_on_another_host_loses_its_leases(ledger):
    compiled = compile_study(loads(TINY_STUDY))
    keys = [t.trial_key for t in compiled.trials]
    ledger.register(compiled)
    a = ledger.open_submission("tiny", "submit")
    _set_submission(ledger, a, host="another-host")  # its process cannot be seen from here: heartbeats decide
    ledger.claim("tiny", keys, a)
    ledger.start_attempt(keys[0], a)
    b = ledger.open_submission("tiny", "resume")
    assert ledger.claim("tiny", keys, b, stale_after=60) == []
    assert ledger.stale_keys("tiny", stale_after=60) == set()
    import time

    time.sleep(0.3)
    ledger.heartbeat(b)
    assert ledger.stale_keys("tiny", stale_after=0.2) == set(keys)  # a went silent
    counts = ledger.status_counts("tiny", stale_after=0.2)["tiny"]
    assert counts["stale"] == 4 and counts["running"] == 0 and counts["pending"] == 0
    assert sorted(ledger.claim("tiny", keys, b, stale_after=0.2)) == sorted(keys)


@pytest.mark.e2e
def test_on_this_host_the_process_decides_not_the_heartbeat(ledger):
    """A live submit is never taken over, however stale its heartbeat (`--stale-after 0`); a dead one, or
    one whose pid now belongs to a newer process, is stale at once."""
    import subprocess
    import sys
    from datetime import timedelta

    compiled = compile_study(loads(TINY_STUDY))
    keys = [t.trial_key for t in compiled.trials]
    ledger.register(compiled)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        a = ledger.open_submission("tiny", "submit")
        _set_submission(ledger, a, pid=live.pid)
        assert sorted(ledger.claim("tiny", keys, a)) == sorted(keys)
        ledger.start_attempt(keys[0], a)
        b = ledger.open_submission("tiny", "resume")
        assert ledger.stale_keys("tiny", stale_after=0) == set()
        assert ledger.claim("tiny", keys, b, stale_after=0) == []  # the live submit keeps every trial
        assert ledger.status_counts("tiny", stale_after=0)["tiny"]["stale"] == 0

        # the same pid held by a process that started after the submission did: a reused pid, not its process
        from studyrunner.store.db import utcnow

        _set_submission(ledger, a, started_at=utcnow() - timedelta(hours=1))
        assert ledger.stale_keys("tiny", stale_after=3600) == set(keys)
        _set_submission(ledger, a, started_at=utcnow())
        assert ledger.stale_keys("tiny", stale_after=3600) == set()
    finally:
        live.kill()
        live.wait()
    assert ledger.stale_keys("tiny", stale_after=3600) == set(keys)  # its process is gone: stale at once
    assert sorted(ledger.claim("tiny", keys, b, stale_after=3600)) == sorted(keys)


@pytest.mark.e2e
def test_a_claim_keeps_a_finished_trials_outcome_until_an_attempt_starts(ledger):
    """`rerun --diverged` that stops before the attempt starts (an error, Ctrl-C) loses nothing."""
    compiled = compile_study(loads(TINY_STUDY))
    key = compiled.trials[0].trial_key
    ledger.register(compiled)
    ledger.mark_running(key)
    ledger.finish(key, "diverged", metrics={"train_loss": float("nan")}, error="nan at 5", failure_class="divergence")
    sub = ledger.open_submission("tiny", "rerun")
    assert ledger.claim("tiny", [key], sub, statuses=("diverged",)) == [key]
    (row,) = ledger.trials("tiny", [key])
    assert (row.status, row.owner, row.error) == ("diverged", sub, "nan at 5")
    assert ledger.release(sub) == []
    (row,) = ledger.trials("tiny", [key])
    assert (row.status, row.owner, row.failure_class, row.error) == ("diverged", None, "divergence", "nan at 5")


@pytest.mark.e2e
def test_cancel_marks_unheld_pending_trials(ledger):
    compiled = compile_study(loads(TINY_STUDY))
    keys = [t.trial_key for t in compiled.trials]
    ledger.register(compiled)
    a = ledger.open_submission("tiny", "submit")
    ledger.claim("tiny", keys[:2], a)
    asked, cancelled = ledger.request_cancel("tiny")
    assert (asked, cancelled) == (1, 2)
    assert ledger.heartbeat(a) is True  # the holder learns it was asked to stop
    assert sorted(ledger.release(a, cancelled=True)) == sorted(keys[:2])
    assert {r.status for r in ledger.trials("tiny")} == {"cancelled"}
    assert sorted(ledger.register(compiled).to_run) == sorted(keys)  # a later submit runs them


@pytest.mark.e2e
def test_status_counts_and_results_frame(ledger):
    compiled = compile_study(loads(TINY_STUDY))
    ledger.register(compiled)
    key = compiled.trials[0].trial_key
    ledger.mark_running(key)
    ledger.mark_succeeded(key, {"eval_accuracy": 0.5})
    counts = ledger.status_counts("tiny")["tiny"]
    assert counts["succeeded"] == 1 and counts["pending"] == 3 and counts["failed"] == 0
    df = trials_frame(ledger, "tiny")
    assert len(df) == 4
    assert df.set_index("trial_key").loc[key, "eval_accuracy"] == 0.5
    assert df.set_index("trial_key").loc[key, "duration_s"] >= 0
    assert set(df["model.params.loops"]) == {1, 2}


@pytest.mark.e2e
def test_unknown_study_names_the_known_ones(ledger):
    from studyrunner.errors import StudyrunnerError

    ledger.register(compile_study(loads(TINY_STUDY)))
    with pytest.raises(StudyrunnerError, match="no study named 'nope'.*tiny"):
        ledger.status_counts("nope")


def test_bad_database_url_is_a_clear_error():
    from studyrunner.errors import StudyrunnerError

    with pytest.raises(StudyrunnerError, match="cannot open results database"):
        Ledger("notadb://x")


def test_cell_summary_orders_by_mode_and_counts_failed_seeds(tmp_path):
    from studyrunner.results import cell_summary

    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    compiled = compile_study(loads(TINY_STUDY))
    ledger.register(compiled)
    (a0, a1, b0, b1) = compiled.trials  # cells loops=1 (a) and loops=2 (b), seeds 0 and 1
    for trial, acc in ((a0, 0.4), (a1, 0.6), (b0, 0.9)):
        ledger.mark_running(trial.trial_key)
        ledger.mark_succeeded(trial.trial_key, {"eval_accuracy": acc})
    ledger.mark_running(b1.trial_key)
    ledger.mark_failed(b1.trial_key, "RuntimeError: diverged")
    df = trials_frame(ledger, "tiny")
    best_first = cell_summary(df, "eval_accuracy", "max")
    assert list(best_first.cell) == [b0.label, a0.label]
    assert best_first.set_index("cell").loc[a0.label, "mean"] == pytest.approx(0.5)
    assert best_first.set_index("cell").loc[b0.label, ["seeds", "failed"]].tolist() == [1, 1]
    assert list(cell_summary(df, "eval_accuracy", "min").cell) == [a0.label, b0.label]
    # A metric nobody reported still lists the cells with failures, so failures are never hidden.
    unreported = cell_summary(df, "no_such_metric").set_index("cell")
    assert unreported["mean"].isna().all() and unreported["failed"].to_dict() == {a0.label: 0, b0.label: 1}
    ledger.mark_running(b0.trial_key)  # a rerun's attempt: an ended trial changes only through a new one
    ledger.mark_failed(b0.trial_key, "RuntimeError: diverged")  # now every seed of cell b failed
    summary = cell_summary(trials_frame(ledger, "tiny"), "eval_accuracy").set_index("cell")
    assert summary.loc[b0.label, ["seeds", "failed"]].tolist() == [0, 2]
    assert summary.index.tolist() == [a0.label, b0.label]  # the all-failed cell is last, not dropped
    succeeded_only = ledger.trials("tiny")
    assert cell_summary(trials_frame(ledger, "tiny").iloc[0:0], "eval_accuracy").empty
    assert len(succeeded_only) == 4


# --- schema revisions (Alembic) --------------------------------------------------------------------


def _first_release_ledger(url: str) -> None:
    """A ledger as the first release wrote it: revision 0001's tables, no version table, one study."""
    from alembic import command
    from sqlalchemy import create_engine, text

    from studyrunner.store import schema_versions as schema

    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(schema._config(conn), "0001")
        conn.execute(text("DROP TABLE alembic_version"))
        conn.execute(
            text("INSERT INTO studies VALUES ('old', '', 'name: old', 'h', NULL, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
        )
        conn.execute(text("INSERT INTO cells VALUES ('old', 'c0', 'base', '{}', '{}', NULL)"))
        conn.execute(
            text(
                "INSERT INTO trials VALUES ('old-c0-s0', 'old', 'c0', 0, 'succeeded', 1, CURRENT_TIMESTAMP, "
                "NULL, NULL, NULL, '{\"eval_accuracy\": 0.5}', NULL)"
            )
        )
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    url = request.getfixturevalue("postgres_url")
    yield url
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as conn:
        tables = ("look_claims", "looks", "search_points", "trial_metrics", "cell_params", "attempts", "submissions")
        tables += ("trials", "cells")
        for table in (*tables, "studies"):
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    engine.dispose()


@pytest.mark.e2e
def test_an_older_ledger_is_refused_until_db_upgrade_which_keeps_its_rows(empty_url):
    from typer.testing import CliRunner

    from studyrunner.cli import app
    from studyrunner.errors import StudyrunnerError

    _first_release_ledger(empty_url)
    for create in (True, False):  # submit and status alike say what to run
        with pytest.raises(StudyrunnerError, match=r"revision 0001, this studyrunner needs 0006.*db upgrade"):
            Ledger(empty_url, create=create)
    runner = CliRunner()
    assert "revision 0001" in runner.invoke(app, ["db", "current", "--db", empty_url]).output
    result = runner.invoke(app, ["db", "upgrade", "--db", empty_url])
    assert result.exit_code == 0 and "upgraded from 0001 to revision 0006" in result.output
    ledger = Ledger(empty_url)
    (row,) = ledger.trials("old")
    assert row.status == "succeeded" and row.metrics == {"eval_accuracy": 0.5}
    ledger.register(compile_study(loads(TINY_STUDY.replace("seeds: [0, 1]", "baselines: [iso_flop]\nseeds: [0]"))))
    assert any(c.baseline_of for c in ledger.cells("tiny"))
    assert "already at revision 0006" in runner.invoke(app, ["db", "upgrade", "--db", empty_url]).output


@pytest.mark.e2e
def test_migrating_from_nothing_gives_exactly_the_declared_tables(empty_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    from studyrunner.store import schema_versions as schema
    from studyrunner.store.db import Base

    engine = create_engine(empty_url)
    schema.upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    assert schema.current(engine) == schema.head()
    engine.dispose()


def test_analysis_warns_when_one_cell_mixes_code_versions(tmp_path):
    from sqlalchemy import update

    from studyrunner.analysis.data import load
    from studyrunner.store.db import AttemptRow

    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    compiled = compile_study(loads(TINY_STUDY))
    ledger.register(compiled)
    for t in compiled.trials:
        ledger.start_attempt(t.trial_key)
        ledger.note_attempt(
            t.trial_key, provenance={"git_sha": "a" * 40, "git_dirty": "false", "studyrunner_version": "0.1"}
        )
        ledger.finish(t.trial_key, "succeeded", metrics={"eval_accuracy": 0.5, "effective_depth": 1.0})
    assert load("tiny", workspace=tmp_path).warnings == []
    odd = compiled.trials[1]  # cell loops=1, seed 1 ran from a dirty tree
    with ledger.session() as s, s.begin():
        s.execute(
            update(AttemptRow)
            .where(AttemptRow.trial_key == odd.trial_key)
            .values(provenance={"git_sha": "b" * 40, "git_dirty": "true", "studyrunner_version": "0.1"})
        )
    (line,) = load("tiny", workspace=tmp_path).warnings
    assert odd.cell_hash in line and "aaaaaaaaaa v0.1 (1 seeds)" in line and "bbbbbbbbbb (dirty) v0.1 (1 seeds)" in line
