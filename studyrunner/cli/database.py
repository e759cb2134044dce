"""`db current`, `db upgrade`, `sync-mlflow` and `schema`: the ledger's schema version, mending MLflow from the
ledger, and the JSON Schema of study files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from ..errors import StudyrunnerError
from ..urls import mask_url
from .common import (
    DbOpt,
    StorageOpt,
    StudyName,
    TrackingOpt,
    WorkspaceOpt,
    app,
    err,
    open_workspace,
    out,
    user_errors,
    warn,
)

db_app = typer.Typer(
    help="The results ledger's schema: show its revision, upgrade an older ledger.", no_args_is_help=True
)
app.add_typer(db_app, name="db")


def _db_engine(workspace: Path | None, db: str | None, *, read_only: bool):
    from ..store.ledger import database_errors, open_engine

    url = open_workspace(workspace, db).db_url
    engine, _mode = open_engine(url, read_only=read_only)
    return url, engine, database_errors(url)


@db_app.command("current")
@user_errors
def db_current(db: DbOpt = None, workspace: WorkspaceOpt = None):
    """Print the ledger's schema revision and the one this version of studyrunner needs."""
    from ..store import schema_versions as ledger_schema

    url, engine, errors = _db_engine(workspace, db, read_only=True)
    with errors:
        revision = ledger_schema.current(engine, url)
    if revision is None:
        raise StudyrunnerError(
            f"{mask_url(url)!r} holds no studyrunner ledger (an empty database; `submit` creates one)"
        )
    newest = ledger_schema.head()
    state = "current" if revision == newest else f"older: run {_db_hint(workspace, db, 'upgrade')}"
    out.print(f"{mask_url(url)}: revision {revision} (this studyrunner: {newest}; {state})", markup=False)


@db_app.command("upgrade")
@user_errors
def db_upgrade(db: DbOpt = None, workspace: WorkspaceOpt = None):
    """Upgrade an existing ledger to the schema this studyrunner needs (keeps every row)."""
    from ..store import schema_versions as ledger_schema

    # What the database is, read without writing a byte: one that is not a ledger is refused as it was.
    url, reader, errors = _db_engine(workspace, db, read_only=True)
    with errors:
        try:
            before = ledger_schema.current(reader, url)
        finally:
            reader.dispose()
        if before is None:
            raise StudyrunnerError(
                f"{mask_url(url)!r} holds no studyrunner ledger: nothing to upgrade "
                "(`studyrunner submit` creates a new one)"
            )
        after = ledger_schema.head()
        if before != after:  # only now opened for writing (a current ledger on a read-only mount is fine)
            from ..store import Ledger

            Ledger.check_writable(url)
            _url, engine, _errors = _db_engine(workspace, db, read_only=False)
            before, after = ledger_schema.upgrade(engine, url)
    message = "already at" if before == after else f"upgraded from {before} to"
    err.print(f"{mask_url(url)}: {message} revision {after}", markup=False)


def _db_hint(workspace: Path | None, db: str | None, verb: str) -> str:
    flags = tuple((k, str(v)) for k, v in (("--workspace", workspace), ("--db", db)) if v)
    from ..workspace import hint

    return hint("db", verb, flags=flags)


@app.command("sync-mlflow")
@user_errors
def sync_mlflow(
    study: StudyName,
    db: DbOpt = None,
    tracking_uri: TrackingOpt = None,
    storage: StorageOpt = None,
    workspace: WorkspaceOpt = None,
):
    """Find and mend what MLflow and the curves lack of a study's trials (after MLflow was unreachable, or a
    driver died): missing runs and points, statuses, curves rebuilt from checkpoints. Safe to rerun."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..orchestrate.submission import reap_dead
    from ..store import CurveStore, Ledger
    from ..tracking.sync import sync_mlflow as sync
    from ..tracking.tracker import Tracker

    ws = open_workspace(workspace, db, tracking_uri, storage)
    ledger = Ledger(ws.db_url, create=False)
    ledger.get_study(study)  # an unknown study fails before MLflow is touched
    tracker = Tracker(ws.tracking_uri)
    reap_dead(ledger, study)  # a dead driver's trials are flagged, so the audit finds what it half wrote
    with Progress(TextColumn("auditing trials"), BarColumn(), MofNCompleteColumn(), console=err, transient=True) as bar:
        task = bar.add_task("audit", total=None)
        report = sync(
            ledger,
            tracker,
            CurveStore(ws.storage),
            study,
            console=err,
            artifact_location=ws.artifact_location(study),
            storage=ws.storage,
            on_trial=lambda done, total: bar.update(task, completed=done, total=total),
            again=ws.hint("sync-mlflow", study),
        )
    warn(report.problems)
    if not report.changed:
        agree = f"{study}: MLflow and the curves agree with the ledger (experiment {report.experiment_id})"
        out.print(agree, markup=False)
        return
    out.print(
        f"{study}: mended {report.trials_synced} trials: {report.runs_created} runs created, "
        f"{report.runs_continued} continued, {report.cell_runs_created} cell runs created, "
        f"{report.points_logged} metric points backfilled, {report.statuses_set} run statuses set, "
        f"{report.curves_rebuilt} curves rebuilt from checkpoints (experiment {report.experiment_id})",
        markup=False,
        highlight=False,
    )


@app.command()
def schema():
    """Print the JSON Schema of study files (for editor autocompletion)."""
    from ..study.jsonschema import study_json_schema

    sys.stdout.write(json.dumps(study_json_schema(), indent=2) + "\n")
