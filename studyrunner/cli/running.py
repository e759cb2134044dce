"""`submit`, `resume`, `rerun` and `cancel`: the verbs that run trials."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..errors import StudyrunnerError, UsageError
from ..urls import mask_url
from .common import (
    AddressOpt,
    DbOpt,
    MaxConcurrentOpt,
    MaxFailuresOpt,
    ProgressOpt,
    StaleOpt,
    StorageOpt,
    StudyFile,
    StudyName,
    TrackingOpt,
    WorkspaceOpt,
    app,
    err,
    open_workspace,
    out,
    run_options,
    shown,
    user_errors,
    warn,
)


@app.command()
@user_errors
def submit(
    file: StudyFile,
    address: AddressOpt = None,
    max_concurrent: MaxConcurrentOpt = None,
    max_failures: MaxFailuresOpt = None,
    db: DbOpt = None,
    tracking_uri: TrackingOpt = None,
    storage: StorageOpt = None,
    workspace: WorkspaceOpt = None,
    progress: ProgressOpt = True,
    as_new_study: Annotated[
        str | None,
        typer.Option(help="Submit the file under this study name (for an edit that changes cells that already ran)."),
    ] = None,
):
    """Compile a study and run its new, pending and interrupted trials (failed ones: `rerun`)."""
    from ..orchestrate import submit as run
    from ..study import compile_study, load

    study = load(file)
    if as_new_study is not None:
        study = _renamed(study, as_new_study)
    compiled = compile_study(study)
    warn(compiled.warnings)
    ws = open_workspace(workspace, db, tracking_uri, storage)
    options = run_options(address, max_concurrent, max_failures, progress)
    again = ws.hint("submit", str(file), *(("--as-new-study", as_new_study) if as_new_study else ()))
    _run_and_report(lambda: run(compiled, ws, options=options, console=err), ws, compiled.study.name, again)


def _renamed(study, name: str):
    from ..study.schema import Study

    try:
        Study.model_validate({"name": name, **{k: v for k, v in study.model_dump().items() if k != "name"}})
    except Exception:  # noqa: BLE001 - pydantic says why; the name is the only change
        raise typer.BadParameter(
            f"{name!r}: a study name is lowercase letters, digits, '_' and '-'", param_hint="--as-new-study"
        ) from None
    renamed = study.model_copy(update={"name": name})
    renamed._source, renamed._node, renamed._text = study._source, study._node, study._text
    return renamed


def _run_and_report(run, ws, study_name: str, again: str | None = None) -> None:
    """Run a submit/resume/rerun and say what happened; exit 130 when interrupted (Ctrl-C, SIGTERM), 1 when
    trials failed, a `cancel` stopped it or a store's database stopped answering (then the trials it held are
    left to `resume`). Every command it prints names the stores the user gave; `again` is the command that
    runs a study not yet registered (a submit's own line).

    It runs in a child process that the command's own process watches (supervise.py): one that cannot stop
    within STUDYRUNNER_STOP_GRACE seconds of a Ctrl-C or SIGTERM (blocked in a Ray that never answers) is
    killed with its Ray, its trials are released, the same line is printed, and the exit is 130."""
    from .supervise import supervise

    supervise(lambda: _after_hard_stop(ws, study_name, again))
    try:
        _report(run, ws, study_name, again)
    except Exception as exc:
        lost = _database_error(exc)
        if lost is None:
            raise
        # A database went away mid-study: a PostgreSQL restart, a network cut.
        raise StudyrunnerError(_store_lost(ws, study_name, lost, exc, again)) from None


def _after_hard_stop(ws, study_name: str, again: str | None, wait_s: float = 10.0) -> str:
    """In the watching parent, once the stuck child and its Ray are killed: release the trials it held (its
    submission is dead now) and say how to go on."""
    import threading

    def release() -> None:
        from ..orchestrate.submission import reap_dead
        from ..store import Ledger

        try:
            reap_dead(Ledger(ws.db_url, create=False), study_name)
        except Exception:  # noqa: BLE001 - no ledger yet, or it does not answer: the next command reaps
            pass

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    thread.join(wait_s)
    return shown(
        f"interrupted; the command did not stop within its grace and was killed with its Ray; "
        f"{_where_next(ws, study_name, again)}"
    )


def _where_next(ws, study_name: str, again: str | None) -> str:
    """What to run after an interruption: `resume` for a registered study; for one the ledger does not hold
    (stopped before its registration), that nothing was written and the command to run it again."""
    if again is not None and _registered(ws, study_name) is False:
        return f"study {study_name} was not registered yet. Run it again with: {again}"
    return f"unfinished trials are pending. Resume with: {ws.hint('resume', study_name)}"


def _registered(ws, study_name: str, wait_s: float = 5.0) -> bool | None:
    """Whether the ledger holds the study; None if it cannot say within `wait_s` (a database that does not
    answer: then it is treated as registered, and `resume` will say if it is not)."""
    import threading

    answer: list[bool] = []

    def ask() -> None:
        from ..store import Ledger

        try:
            ledger = Ledger(ws.db_url, create=False, read_only=True)
            answer.append(any(s.name == study_name for s in ledger.studies()))
        except StudyrunnerError:  # no ledger at all
            answer.append(False)
        except Exception:  # noqa: BLE001 - a database that does not answer: say nothing
            pass

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(wait_s)
    return answer[0] if answer else None


def _database_error(exc: BaseException):
    """The database error behind `exc`: itself, or the one a Tune callback (the recorder) raised, which Tune
    re-raises as a TuneError holding only its traceback's text, the original as its context."""
    from sqlalchemy.exc import DBAPIError

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, DBAPIError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _report(run, ws, study_name: str, again: str | None) -> None:
    from ..orchestrate.signals import sigterm_as_ctrl_c

    resume_hint = ws.hint("resume", study_name)
    try:
        with sigterm_as_ctrl_c():  # from the first moment, not only once trials run
            result = run()
    except KeyboardInterrupt:  # before Ray Tune took over, or a second Ctrl-C: the ledger is released
        err.print(f"interrupted; {_where_next(ws, study_name, again)}", markup=False)
        raise typer.Exit(130) from None
    if result.ran or result.interrupted or result.cancelled:
        err.print(
            f"{escape(result.study)}: ran {result.ran} trials in {result.wall_time_s:.0f} s: "
            f"[green]{len(result.succeeded)} succeeded[/], [red]{len(result.failed)} failed[/]"
            + (f", [magenta]{len(result.diverged)} diverged[/]" if result.diverged else "")
            + (f", {len(result.interrupted)} interrupted (pending)" if result.interrupted else "")
            + (f", {len(result.cancelled)} cancelled" if result.cancelled else "")
        )
    elif result.busy:
        err.print(f"{escape(result.study)}: every trial to run is being run by another process")
    elif not result.study_busy:  # a search or sequential study another submit runs: said in one line already
        err.print(f"{escape(result.study)}: nothing to run")
    if not result.study_busy:  # the submit that runs the search or the waves says how it went
        _print_summary(ws, study_name, interrupted=bool(result.interrupted))
    where = f"ledger: {mask_url(ws.db_url)}\nMLflow: {mask_url(ws.tracking_uri)}  ({ws.hint('ui')})"
    err.print(where, markup=False, highlight=False)
    if result.interrupted:
        err.print(f"resume with: {resume_hint}  (runs only what has not finished)", markup=False)
        raise typer.Exit(130)
    if result.cancelled:
        err.print(f"cancelled; to run them after all: {ws.hint('resume', study_name)}", markup=False)
        raise typer.Exit(1)
    if result.failed:
        err.print(f"see errors: {ws.hint('status', result.study)}", markup=False)
        raise typer.Exit(1)


def _store_lost(ws, study_name: str, exc, raised: BaseException, again: str | None) -> str:
    """One line for a database that stopped answering mid-command: which store it was (the MLflow tracking
    store's database, or the results ledger's), and what to run once it answers."""
    first = (str(exc.orig or exc).strip().splitlines() or [""])[0]
    what = f"({type(exc.orig or exc).__name__}: {first})"
    if _raised_in_mlflow(raised):
        return (
            f"the MLflow tracking store {mask_url(ws.tracking_uri)} stopped answering {what}; the trials this command "
            f"held stay unfinished. Once it answers again: {_where_next(ws, study_name, again).split(': ', 1)[-1]}"
        )
    return (
        f"the results ledger {mask_url(ws.db_url)} stopped answering mid-study {what}; the trials this command "
        f"held stay unfinished. Once the database answers again: {ws.hint('resume', study_name)}"
    )


def _raised_in_mlflow(exc: BaseException | None) -> bool:
    """Whether the error (or one it was raised from) came out of MLflow's code: its tracking store's database."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            if "/mlflow/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
                return True
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return False


@app.command()
@user_errors
def resume(
    study: StudyName,
    address: AddressOpt = None,
    max_concurrent: MaxConcurrentOpt = None,
    max_failures: MaxFailuresOpt = None,
    db: DbOpt = None,
    tracking_uri: TrackingOpt = None,
    storage: StorageOpt = None,
    workspace: WorkspaceOpt = None,
    progress: ProgressOpt = True,
    stale_after: StaleOpt = None,
):
    """Finish a study whose submit was killed or stopped: run its pending, cancelled and stale trials."""
    from ..orchestrate import resume as run

    ws = open_workspace(workspace, db, tracking_uri, storage)
    options = run_options(address, max_concurrent, max_failures, progress, stale_after)
    _run_and_report(lambda: run(study, ws, options=options, console=err), ws, study)


@app.command()
@user_errors
def rerun(
    study: StudyName,
    failed: Annotated[bool, typer.Option("--failed", help="Trials that failed.")] = False,
    diverged: Annotated[bool, typer.Option("--diverged", help="Trials that diverged.")] = False,
    missing: Annotated[bool, typer.Option("--missing", help="Trials that never ran.")] = False,
    stale: Annotated[bool, typer.Option("--stale", help="Trials held by a submit that died.")] = False,
    cancelled: Annotated[bool, typer.Option("--cancelled", help="Trials that were cancelled.")] = False,
    seeds: Annotated[str | None, typer.Option(help="Only these seeds, e.g. 0,2.")] = None,
    cell: Annotated[list[str] | None, typer.Option(help="Only this cell (hash or its prefix); repeatable.")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Discard their checkpoints: train from step 0.")] = False,
    address: AddressOpt = None,
    max_concurrent: MaxConcurrentOpt = None,
    max_failures: MaxFailuresOpt = None,
    db: DbOpt = None,
    tracking_uri: TrackingOpt = None,
    storage: StorageOpt = None,
    workspace: WorkspaceOpt = None,
    progress: ProgressOpt = True,
    stale_after: StaleOpt = None,
):
    """Run chosen trials again (no filter: every trial not succeeded), as new attempts of the same trials."""
    from ..orchestrate import RerunSelection
    from ..orchestrate import rerun as run

    try:  # each seed once, in order: `--seeds 0,0` is `--seeds 0`
        seed_list = tuple(sorted({int(x) for x in seeds.split(",") if x.strip()})) if seeds is not None else ()
    except ValueError:
        raise typer.BadParameter(
            f"{seeds!r}: seeds are integers separated by commas, e.g. 0,2", param_hint="--seeds"
        ) from None
    if seeds is not None and not seed_list:  # `--seeds ""` is a mistake, not "every seed"
        raise UsageError(
            f"--seeds {seeds!r} names no seed; give integers separated by commas (e.g. 0,2), or leave --seeds out"
        )
    if any(not c.strip() for c in cell or ()):  # an empty prefix would match every cell
        raise UsageError("--cell '' names no cell; give a cell hash or its prefix, or leave --cell out")
    cells = tuple(dict.fromkeys(c.strip() for c in cell or ()))
    select = RerunSelection(failed, diverged, missing, stale, cancelled, seed_list, cells, fresh)
    ws = open_workspace(workspace, db, tracking_uri, storage)
    options = run_options(address, max_concurrent, max_failures, progress, stale_after)
    _run_and_report(lambda: run(study, ws, select, options=options, console=err), ws, study)


@app.command()
@user_errors
def cancel(study: StudyName, db: DbOpt = None, workspace: WorkspaceOpt = None):
    """Stop a running study from another terminal: its unfinished trials become cancelled."""
    from ..orchestrate import cancel as run

    asked, now = run(study, open_workspace(workspace, db))
    if asked:
        out.print(f"asked {asked} running submit(s) of {study} to stop; their unfinished trials end cancelled")
    out.print(f"{now} pending trials cancelled" + ("" if asked else f"; nothing of {study} is running"))


def _print_summary(ws, name: str, interrupted: bool = False) -> None:
    from ..results import cell_summary, trials_frame
    from ..store import Ledger
    from ..study import loads

    ledger = Ledger(ws.db_url)
    metric = loads(ledger.get_study(name).spec_text).metric
    summary = cell_summary(trials_frame(ledger, name), metric.name, metric.mode)
    if summary.empty:
        if not interrupted:  # stopped before any trial ended: nothing to say, the resume line follows
            warn([f"no trial reported {metric.name!r}; see `studyrunner results {name}`"])
        return
    table = Table(title=f"{metric.name} ({metric.mode}) by cell, over seeds")
    for col in ("cell", "mean", "std", "seeds", "failed"):
        table.add_column(col, justify="left" if col == "cell" else "right")
    for row in summary.itertuples():
        table.add_row(
            Text(row.cell),
            _num(row.mean),
            _num(row.std),
            str(row.seeds),
            Text(str(row.failed), style="red" if row.failed else ""),
        )
    err.print(table)


def _num(value: float) -> str:
    return "" if value != value else f"{value:.4f}"  # NaN: no seed succeeded, or one seed (no std)
