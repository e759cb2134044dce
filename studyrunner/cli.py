"""The `studyrunner` command: a thin layer over the Python API (nothing imports this module)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .errors import StudyrunnerError

app = typer.Typer(
    name="studyrunner",
    help="Declarative ablation and scaling studies of looped transformers (Ray Tune + MLflow + SQL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped output (CI logs, `| less`) gets room for wide tables instead of rich's 80-column fallback.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

StudyFile = Annotated[Path, typer.Argument(help="Study file (YAML).", show_default=False)]
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", help="SQLAlchemy URL of the results ledger [env STUDYRUNNER_DB; default: SQLite in the workspace]."
    ),
]
WorkspaceOpt = Annotated[
    Path | None, typer.Option("--workspace", help="Workspace folder [env STUDYRUNNER_HOME; default ./.studyrunner].")
]
TrackingOpt = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri", help="MLflow tracking URI [env MLFLOW_TRACKING_URI; default: SQLite in the workspace]."
    ),
]


def say_error(message: str) -> None:
    """One line on stderr; the message (file names, user text, schema patterns) prints literally."""
    err.print(Text.assemble(("error: ", "red"), str(message)), highlight=False, soft_wrap=True)


def user_errors(fn):
    """The CLI's error boundary: every failure ends in one line and a non-zero exit, never a traceback.

    A StudyrunnerError is the user's to mend (its code: 2 for a study file, 1 otherwise). Anything else
    is a bug or an environment problem: one line naming it, exit 1, and STUDYRUNNER_DEBUG=1 shows the
    traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _footer.clear()
        try:
            value = fn(*args, **kwargs)
            _print_footer()
            return value
        except typer.Exit:
            _print_footer()  # a verdict (verify's exit 1), not an error
            raise
        except StudyrunnerError as exc:
            say_error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except (typer.Abort, typer.BadParameter, KeyboardInterrupt, SystemExit):
            raise  # click's own usage errors (a bad option value) print as usual, exit 2
        except Exception as exc:  # noqa: BLE001 - the boundary itself
            if os.environ.get("STUDYRUNNER_DEBUG"):
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            say_error(f"{type(exc).__name__}: {first} (unexpected; STUDYRUNNER_DEBUG=1 shows the traceback)")
            raise typer.Exit(1) from None

    return wrapper


# Lines printed once a command has done its work (which ledger a read verb read), so that an error stays one line.
_footer: list[str] = []


def _print_footer() -> None:
    for line in dict.fromkeys(_footer):
        err.print(line, markup=False, highlight=False, soft_wrap=True)
    _footer.clear()


def _warn(lines: list[str]) -> None:
    for line in lines:
        err.print(Text.assemble(("warning: ", "yellow"), line), highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        from . import __version__

        out.print(f"studyrunner {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
):
    """Declarative ablation and scaling studies of looped transformers (Ray Tune + MLflow + SQL)."""


def _workspace(
    workspace: Path | None, db: str | None = None, tracking_uri: str | None = None, storage: str | None = None
):
    from .workspace import Workspace

    ws = Workspace.resolve(workspace, db=db, tracking_uri=tracking_uri, storage=storage)
    for line in ws.ignored_env:
        err.print(Text.assemble(("note: ", "cyan"), line), highlight=False, soft_wrap=True)
    return ws


def _reader(ws):
    """The ledger of `ws` for a read verb: opened without writing anything, and said which it is read from
    (on stderr, so a verb's output on stdout stays clean)."""
    from .store import Ledger

    ledger = Ledger(ws.db_url, create=False, read_only=True)
    _footer.append(f"read from ledger {ws.db_url}")
    if ledger.read_note:
        err.print(Text.assemble(("note: ", "cyan"), ledger.read_note), highlight=False, soft_wrap=True)
    return ledger


AddressOpt = Annotated[
    str | None, typer.Option(help="Ray cluster address [env RAY_ADDRESS; default: start a local Ray].")
]
MaxConcurrentOpt = Annotated[int | None, typer.Option(min=1, help="At most this many trials at once.")]
MaxFailuresOpt = Annotated[
    int | None,
    typer.Option(min=0, help="Retries per trial after infrastructure failures [default: the study's `retries:`]."),
]
StorageOpt = Annotated[
    str | None, typer.Option(help="Folder or URI for curves, checkpoints and Ray results [env STUDYRUNNER_STORAGE].")
]
ProgressOpt = Annotated[bool, typer.Option(help="Live progress display.")]
StaleOpt = Annotated[
    float | None,
    typer.Option(
        min=0,
        help="Seconds without a heartbeat before a submit counts as dead [env STUDYRUNNER_STALE_AFTER; 60].",
    ),
]
StudyName = Annotated[str, typer.Argument(help="Study name (as in the ledger).", show_default=False)]


def _options(address=None, max_concurrent=None, max_failures=None, progress=True, stale_after=None):
    from .orchestrate import RunOptions
    from .store.ledger import STALE_AFTER_S

    return RunOptions(
        address=address,
        max_concurrent=max_concurrent,
        max_failures=max_failures,
        show_progress=progress,
        stale_after=STALE_AFTER_S if stale_after is None else stale_after,
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
    from .orchestrate import submit as run
    from .spec import compile_study, load

    study = load(file)
    if as_new_study is not None:
        study = _renamed(study, as_new_study)
    compiled = compile_study(study)
    _warn(compiled.warnings)
    ws = _workspace(workspace, db, tracking_uri, storage)
    _run_and_report(
        lambda: run(compiled, ws, options=_options(address, max_concurrent, max_failures, progress), console=err),
        ws,
        compiled.study.name,
    )


def _renamed(study, name: str):
    from .spec.schema import Study

    try:
        Study.model_validate({"name": name, **{k: v for k, v in study.model_dump().items() if k != "name"}})
    except Exception:  # noqa: BLE001 - pydantic says why; the name is the only change
        raise typer.BadParameter(
            f"{name!r}: a study name is lowercase letters, digits, '_' and '-'", param_hint="--as-new-study"
        ) from None
    renamed = study.model_copy(update={"name": name})
    renamed._source, renamed._node, renamed._text = study._source, study._node, study._text
    return renamed


def _run_and_report(run, ws, study_name: str) -> None:
    """Run a submit/resume/rerun and say what happened; exit 130 when interrupted, 1 when trials failed or
    a `cancel` stopped it. Every command it prints names the stores the user gave."""
    resume_hint = ws.hint("resume", study_name)
    try:
        result = run()
    except KeyboardInterrupt:  # before Ray Tune took over, or a second Ctrl-C: the ledger is released
        err.print(f"interrupted; unfinished trials are pending. Resume with: {resume_hint}", markup=False)
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
    else:
        err.print(f"{escape(result.study)}: nothing to run")
    _print_summary(ws, study_name)
    err.print(f"ledger: {ws.db_url}\nMLflow: {ws.tracking_uri}  ({ws.hint('ui')})", markup=False, highlight=False)
    if result.interrupted:
        err.print(f"resume with: {resume_hint}  (runs only what has not finished)", markup=False)
        raise typer.Exit(130)
    if result.cancelled:
        err.print(f"cancelled; to run them after all: {ws.hint('resume', study_name)}", markup=False)
        raise typer.Exit(1)
    if result.failed:
        err.print(f"see errors: {ws.hint('status', result.study)}", markup=False)
        raise typer.Exit(1)


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
    from .orchestrate import resume as run

    ws = _workspace(workspace, db, tracking_uri, storage)
    options = _options(address, max_concurrent, max_failures, progress, stale_after)
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
    from .orchestrate import RerunSelection
    from .orchestrate import rerun as run

    try:
        seed_list = tuple(int(x) for x in seeds.split(",") if x.strip()) if seeds is not None else ()
    except ValueError:
        raise typer.BadParameter(
            f"{seeds!r}: seeds are integers separated by commas, e.g. 0,2", param_hint="--seeds"
        ) from None
    if seeds is not None and not seed_list:  # `--seeds ""` is a mistake, not "every seed"
        raise StudyrunnerError(
            f"--seeds {seeds!r} names no seed; give integers separated by commas (e.g. 0,2), or leave --seeds out"
        )
    if any(not c.strip() for c in cell or ()):  # an empty prefix would match every cell
        raise StudyrunnerError("--cell '' names no cell; give a cell hash or its prefix, or leave --cell out")
    select = RerunSelection(failed, diverged, missing, stale, cancelled, seed_list, tuple(cell or ()), fresh)
    ws = _workspace(workspace, db, tracking_uri, storage)
    options = _options(address, max_concurrent, max_failures, progress, stale_after)
    _run_and_report(lambda: run(study, ws, select, options=options, console=err), ws, study)


@app.command()
@user_errors
def cancel(study: StudyName, db: DbOpt = None, workspace: WorkspaceOpt = None):
    """Stop a running study from another terminal: its unfinished trials become cancelled."""
    from .orchestrate import cancel as run

    asked, now = run(study, _workspace(workspace, db))
    if asked:
        out.print(f"asked {asked} running submit(s) of {study} to stop; their unfinished trials end cancelled")
    out.print(f"{now} pending trials cancelled" + ("" if asked else f"; nothing of {study} is running"))


def _print_summary(ws, name: str) -> None:
    from .results import cell_summary, trials_frame
    from .spec import loads
    from .store import Ledger

    ledger = Ledger(ws.db_url)
    metric = loads(ledger.get_study(name).spec_text).metric
    summary = cell_summary(trials_frame(ledger, name), metric.name, metric.mode)
    if summary.empty:
        _warn([f"no trial reported {metric.name!r}; see `studyrunner results {name}`"])
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


@app.command()
@user_errors
def validate(file: StudyFile):
    """Check a study file (schema, family and task params, grid) without running it."""
    from .spec import load_and_compile

    compiled = load_and_compile(file)
    _warn(compiled.warnings)
    counts = (
        _search_line(compiled)
        if compiled.study.search
        else f"{len(compiled.cells)} cells, {len(compiled.trials)} trials"
    )
    out.print(f"{file}: ok ({counts})", markup=False, highlight=False)


def _search_line(compiled) -> str:
    search, seeds, grid = compiled.study.search, len(compiled.study.seeds), len(compiled.bases)
    per = f" in each of {grid} grid cells" if grid > 1 else ""
    return (
        f"search: {search.algorithm} {search.sampler}, {search.n_trials} configurations x {seeds} seeds{per} = "
        f"up to {grid * search.n_trials * seeds} trials"
    )


@app.command()
@user_errors
def plan(file: StudyFile):
    """Show the cells and trials a study compiles to, with parameter counts, without training."""
    import torch

    from .models import build_model, count_params
    from .spec import load_and_compile
    from .tasks import build_task

    compiled = load_and_compile(file)
    _warn(compiled.warnings)
    study = compiled.study
    title = f"{study.name}: {len(compiled.cells)} cells x {len(study.seeds)} seeds = {len(compiled.trials)} trials"
    if study.search:  # the grid cells its searches run in, at the base values of the searched paths
        compiled = dataclasses.replace(compiled, cells=compiled.bases)
        title = f"{study.name}: {_search_line(compiled)}; grid cells (searched paths at their base values)"
    table = Table(title=Text(title))
    columns = ["#", "cell", "cell_hash", "family", "params", "effective_depth", "steps"]
    has_baselines = any(c.baseline_of for c in compiled.cells)
    for col in columns + (["baseline of"] if has_baselines else []):
        table.add_column(col, justify="right" if col in ("#", "params", "effective_depth", "steps") else "left")
    number = {c.cell_hash: i for i, c in enumerate(compiled.cells, 1)}
    for i, cell in enumerate(compiled.cells, 1):
        task = build_task(cell.config["task"]["name"], cell.config["task"]["params"], seed=0)
        with torch.device("meta"):  # count parameters without allocating them
            model = build_model(cell.config["model"]["family"], cell.config["model"]["params"], task.facts)
        table.add_row(
            str(i),
            Text(cell.label),
            cell.cell_hash,
            cell.config["model"]["family"],
            f"{count_params(model):,}",
            str(model.effective_depth),
            str(cell.config["train"]["steps"]),
            *([", ".join(f"{kind} of #{number[h]}" for kind, h in cell.baseline_of)] if has_baselines else []),
        )
    out.print(table)
    if study.search:
        space = Table(title=Text(f"search space ({study.search.sampler}, seed {study.search.seed})"))
        for col in ("path", "range"):
            space.add_column(col)
        for path, domain in study.search.space.items():
            space.add_row(
                Text(path),
                Text(f"{domain.kind} {list(domain.choices) if domain.kind == 'choice' else [domain.low, domain.high]}"),
            )
        out.print(space)


@app.command()
@user_errors
def status(
    study: Annotated[str | None, typer.Argument(help="Study name (default: all studies).")] = None,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
    stale_after: StaleOpt = None,
):
    """Trials per status, per study; then each failed or diverged trial with its class and first error line."""
    from .store import STATUSES
    from .store.ledger import STALE_AFTER_S

    ws = _workspace(workspace, db)
    ledger = _reader(ws)
    counts = ledger.status_counts(study, STALE_AFTER_S if stale_after is None else stale_after)
    if not counts:
        out.print("no studies in the ledger yet; run: studyrunner submit FILE")
        return
    table = Table()
    table.add_column("study")
    columns = (*STATUSES, "stale")
    for s in (*columns, "total"):
        table.add_column(s, justify="right")
    styles = {
        "succeeded": "green",
        "failed": "red",
        "running": "cyan",
        "pending": "yellow",
        "diverged": "magenta",
        "cancelled": "dim",
        "stale": "bold red",
    }
    for name, c in sorted(counts.items()):
        cells = [f"[{styles[s]}]{c[s]}[/]" if c[s] else "0" for s in columns]
        table.add_row(Text(name), *cells, str(sum(c.values())))
    out.print(table)
    _print_failures(ledger, sorted(counts))
    stale = {name: c["stale"] for name, c in counts.items() if c["stale"]}
    for name, n in sorted(stale.items()):
        out.print(f"{n} trials of {name} are stale (their submit died): {ws.hint('resume', name)}", markup=False)


def _print_failures(ledger, studies: list[str], limit: int = 50) -> None:
    rows = [t for name in studies for t in ledger.trials(name, statuses=("failed", "diverged"))]
    if not rows:
        return
    table = Table(title="failed and diverged trials")
    for col in ("trial", "status", "class", "attempts", "first error line"):
        table.add_column(col, overflow="fold")
    for t in rows[:limit]:
        first = ((t.error or "").strip().splitlines() or [""])[0]
        table.add_row(Text(t.trial_key), t.status, t.failure_class or "", str(t.attempts), Text(first[:200]))
    out.print(table)
    if len(rows) > limit:
        out.print(f"... and {len(rows) - limit} more (studyrunner results STUDY --where ...)", markup=False)


class Format(StrEnum):
    table = "table"
    csv = "csv"
    parquet = "parquet"
    json = "json"


@app.command()
@user_errors
def results(
    study: Annotated[
        list[str] | None,
        typer.Argument(help="Study names [default: every study in the ledger].", show_default=False),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            help="Keep the trials this holds for, e.g. 'loops >= 4 and eval_accuracy > 0.6' (the grammar of a "
            "study's failure: rule; names are columns: a metric, seed, model.params.loops or a unique leaf).",
        ),
    ] = None,
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout (required for parquet).")
    ] = None,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
):
    """One row per trial: identity, status, flattened config and final metrics (several studies: one after
    the other, columns joined)."""
    from .results import filter_where, studies_frame

    if format is Format.parquet and out_path is None:
        raise StudyrunnerError("--format parquet writes a binary file: add --out PATH.parquet")
    if out_path is not None:
        _check_out_path(out_path)
    df = studies_frame(_reader(_workspace(workspace, db)), study or [])
    if where is not None:
        df = filter_where(df, where, option="--where")
    try:
        if format is Format.parquet:
            df.to_parquet(out_path, index=False)
        elif format is Format.table:
            _print_results_table(df, out_path)
        else:
            text = (
                df.to_csv(index=False)
                if format is Format.csv
                else df.to_json(orient="records", indent=2, date_format="iso")
            )
            if out_path:
                out_path.write_text(text)
            else:
                sys.stdout.write(text)
    except OSError as exc:
        raise StudyrunnerError(f"--out: cannot write {str(out_path)!r}: {exc.strerror or exc}") from None
    if out_path:
        err.print(f"wrote {len(df)} rows to {out_path}", markup=False, highlight=False)


def _check_out_path(path: Path) -> None:
    """Before any work: --out names a file we can create, not a folder or a path in a missing folder."""
    if path.is_dir():
        raise StudyrunnerError(f"--out: {str(path)!r} is a folder; give a file name inside it")
    if not path.parent.is_dir():
        raise StudyrunnerError(f"--out: folder {str(path.parent)!r} does not exist; create it or choose another path")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise StudyrunnerError(f"--out: {str(path)!r} is not writable; choose another path")


def _cell_text(v) -> str:
    import pandas as pd

    if v is None or (not isinstance(v, list | tuple) and pd.isna(v)):
        return ""
    if isinstance(v, float):
        return f"{int(v):,}" if v.is_integer() and abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def _print_results_table(df, out_path: Path | None = None) -> None:
    varied = [c for c in df.columns if "." in c and df[c].astype(str).nunique() > 1]
    metrics = [
        m
        for m in ("eval_accuracy", "eval_exact_match", "eval_loss", "train_loss", "params", "step_time_ms")
        if m in df.columns
    ]
    ids = ["study", "cell", "seed", "status"] if df.study.nunique() > 1 else ["cell", "seed", "status"]
    table = Table()
    for col in [*ids, *varied, *metrics]:
        table.add_column(col.rsplit(".", 1)[-1] if col in varied else col)
    for _, row in df.iterrows():
        table.add_row(*(Text(_cell_text(row[col])) for col in [*ids, *varied, *metrics]))
    failures = [
        Text.assemble((row.trial_key, "red"), ": ", str(row.error).splitlines()[0] if row.error else "?")
        for _, row in df[df.status == "failed"].iterrows()
    ]
    if out_path is None:
        console = out
    else:  # plain text in the file: no colours, and as wide as the table needs
        console = Console(file=open(out_path, "w", encoding="utf-8"), width=100_000, color_system=None)  # noqa: SIM115
    try:
        console.print(table)
        for line in failures:
            console.print(line, highlight=False, soft_wrap=True)
    finally:
        if out_path is not None:
            console.file.close()


class AnalysisFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


class FitInterval(StrEnum):
    cr2 = "cr2"
    bootstrap = "bootstrap"


StudyArg = Annotated[
    str, typer.Argument(help="Study name (as last submitted) or study file (its claims and rule).", show_default=False)
]
StorageOpt = Annotated[str | None, typer.Option(help="Folder or URI of the curves [env STUDYRUNNER_STORAGE].")]


@app.command()
@user_errors
def analyze(
    study: StudyArg,
    format: Annotated[
        AnalysisFormat, typer.Option("--format", "-f", help="table, json (everything) or csv (cells).")
    ] = AnalysisFormat.table,
    metric: Annotated[str | None, typer.Option(help="Metric to analyse [default: the study's metric].")] = None,
    by: Annotated[
        str | None, typer.Option(help="Fit the scaling law per value of this field (e.g. memory_slots).")
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            help="Time to solve: first step the metric reaches this [default: the study file's "
            "analysis.solve_threshold, else chance + 10% of the way to 1, else 90% of the best cell mean]."
        ),
    ] = None,
    logistic_top: Annotated[
        float | None,
        typer.Option(
            "--logistic-top",
            help="Fix the logistic fit's ceiling [default: analysis.logistic_top, else fitted within "
            "[largest mean at one D, 1 or 100]].",
        ),
    ] = None,
    ci: Annotated[
        FitInterval,
        typer.Option(
            "--ci",
            help="Interval of fit parameters, bands and %Gap: cr2 (t from the CR2 sandwich clustered by seed, "
            "Bell-McCaffrey df; holds its level at 2-5 seeds) or bootstrap (percentiles of seed resamples).",
        ),
    ] = FitInterval.cr2,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
    storage: StorageOpt = None,
):
    """Seed statistics per cell, scaling fits against effective depth, paired comparisons, claims."""
    from .analysis.present import print_analysis, write_json
    from .analysis.summary import analyze as run_analysis

    loaded = _load_study(study, db, workspace, storage)
    result = run_analysis(loaded, metric=metric, by=by, threshold=threshold, logistic_top=logistic_top, ci=ci.value)
    if format is AnalysisFormat.json:
        write_json(result.to_dict())
    elif format is AnalysisFormat.csv:
        sys.stdout.write(result.cells.to_csv(index=False))
    else:
        print_analysis(result, out)


@app.command()
@user_errors
def verify(
    study: StudyArg,
    format: Annotated[
        AnalysisFormat, typer.Option("--format", "-f", help="table, json or csv.")
    ] = AnalysisFormat.table,
    holm: Annotated[
        bool,
        typer.Option(
            "--holm",
            help="Holm-adjust the claims' p-values (family-wise error over the study's claims); the adjusted p "
            "and verdict show beside the raw ones, and the exit code follows the adjusted verdicts.",
        ),
    ] = False,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
    storage: StorageOpt = None,
):
    """Check the study's claims: supported, contradicted, inconclusive, or pending while trials they select
    are unfinished (exit 1 if a claim is contradicted or invalid; pending claims never fail)."""
    from .analysis import claims as analysis_claims
    from .analysis.present import verdicts_table, write_json

    loaded = _load_study(study, db, workspace, storage)
    if not loaded.claims:
        if loaded.spec_error:
            raise StudyrunnerError(loaded.spec_error)
        raise StudyrunnerError(f"study {loaded.name!r} declares no claims; add a `claims:` list to its study file")
    verdicts = analysis_claims.verify(loaded, holm=holm)
    table = analysis_claims.verdict_table(verdicts, holm=holm)
    if format is AnalysisFormat.json:
        write_json(json.loads(table.to_json(orient="records")))
    elif format is AnalysisFormat.csv:
        sys.stdout.write(table.to_csv(index=False))
    else:
        if loaded.missing:
            err.print(f"{loaded.missing} trials have not finished; claims that select them are pending", markup=False)
        out.print(verdicts_table(verdicts, holm=holm))
    final = [v.verdict_holm if holm else v.verdict for v in verdicts]
    if any(f in (analysis_claims.CONTRADICTED, analysis_claims.INVALID) for f in final):
        raise typer.Exit(1)


@app.command()
@user_errors
def report(
    study: StudyArg,
    out_dir: Annotated[
        str | None, typer.Option("--out", "-o", help="Folder for the report [default: WORKSPACE/reports].")
    ] = None,
    ui_url: Annotated[
        str | None, typer.Option("--ui-url", help="MLflow UI address for run links [default: http://127.0.0.1:5000].")
    ] = None,
    mlflow: Annotated[bool, typer.Option(help="Also log the report and tables to the study's MLflow run.")] = True,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
    storage: StorageOpt = None,
    tracking_uri: TrackingOpt = None,
):
    """Write one self-contained HTML report (plots inline, no network) with the cell, fit and claim tables."""
    from .analysis.mlflow_ui import log_study_run
    from .analysis.report import write_report

    ws = _workspace(workspace, db, tracking_uri, storage)
    loaded = _load_study(study, db, workspace, storage, ws)  # first: a missing ledger creates nothing
    folder = _report_folder(out_dir, ws)
    ui_base = ui_url or (ws.tracking_uri if ws.tracking_uri.startswith(("http://", "https://")) else None)
    written = write_report(loaded, folder, ui=ui_base)
    err.print(f"wrote {written[0]}", markup=False, highlight=False)
    if mlflow and loaded.experiment_id:
        try:
            run_id = log_study_run(ws.tracking_uri, loaded.name, loaded.experiment_id, written)
        except Exception as exc:  # noqa: BLE001 - the report is written; MLflow (read-only, down) is optional
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _warn([f"could not log the report to MLflow at {ws.tracking_uri} ({first}); --no-mlflow skips it"])
            return
        err.print(f"logged to MLflow run {run_id} (experiment {loaded.experiment_id})", markup=False, highlight=False)


def _report_folder(out: str | None, ws) -> Path:
    """Where `report` writes, checked before any work: a folder it can write (made if missing)."""
    if out is not None and not out.strip():
        raise StudyrunnerError("--out: an empty path names no folder; give one, or leave --out out")
    folder = Path(out).expanduser() if out is not None else ws.root / "reports"
    option = "--out" if out is not None else "the workspace's reports/ folder (--out)"
    if folder.exists() and not folder.is_dir():
        raise StudyrunnerError(f"{option}: {str(folder)!r} is a file; give a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".studyrunner-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StudyrunnerError(
            f"{option}: cannot write to {str(folder)!r} ({exc.strerror or exc}); give a writable folder with --out"
        ) from None
    return folder


def _load_study(study: str, db: str | None, workspace: Path | None, storage: str | None, ws=None):
    """A study for the analysis verbs, read without writing; says which ledger, and what it left out."""
    from .analysis import data as analysis_data

    ws = ws or _workspace(workspace, db, storage=storage)
    _footer.append(f"read from ledger {ws.db_url}")
    loaded = analysis_data.load(study, db=ws.db_url, workspace=ws.root, storage=ws.storage)
    loaded.on_warning = lambda line: _warn([line])
    _warn(loaded.warnings)
    return loaded


@app.command()
@user_errors
def ui(
    study: Annotated[
        str | None, typer.Argument(help="Study whose runs page to print (default: every study in the ledger).")
    ] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 5000,
    host: Annotated[str, typer.Option(help="Interface to bind; 127.0.0.1 keeps it on this machine.")] = "127.0.0.1",
    tracking_uri: TrackingOpt = None,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
):
    """Serve the MLflow UI over the study tracking store until Ctrl-C (stopping `ui` stops the server)."""
    from .analysis.mlflow_ui import runs_url
    from .orchestrate.ui_server import serve

    ws = _workspace(workspace, db=db, tracking_uri=tracking_uri)
    experiments = _experiments(ws.db_url, study)
    if "://" in ws.tracking_uri and ws.tracking_uri.split("://")[0] in ("http", "https"):
        raise StudyrunnerError(f"the tracking store is already a server ({ws.tracking_uri}); open it directly")
    if ws.tracking_uri.startswith("sqlite:///") and not Path(ws.tracking_uri.removeprefix("sqlite:///")).is_file():
        raise StudyrunnerError(
            f"no MLflow store at {ws.tracking_uri.removeprefix('sqlite:///')!r}: nothing was submitted with this "
            "workspace (check --workspace / --tracking-uri, or run: studyrunner submit FILE)"
        )
    log_path = ws.root / "mlflow-ui.log"
    if not os.access(ws.root, os.W_OK):  # a read-only workspace: the server's log goes elsewhere
        import tempfile

        log_path = Path(tempfile.gettempdir()) / f"studyrunner-mlflow-ui-{os.getuid()}.log"

    def ready(url: str) -> None:
        err.print(
            f"MLflow UI for {ws.tracking_uri}\n  -> {url}   (Ctrl-C stops it; server log: {log_path})", markup=False
        )
        for name, experiment_id in experiments:  # the runs table, not MLflow's GenAI overview
            err.print(f"  {name}: {runs_url(url, experiment_id)}", markup=False, highlight=False)

    raise typer.Exit(serve(ws.tracking_uri, host, port, log_path, ready))


def _experiments(db_url: str, study: str | None) -> list[tuple[str, str]]:
    """(study, MLflow experiment id) to print runs links for; the named study must exist."""
    from .store import Ledger

    try:
        ledger = Ledger(db_url, create=False, read_only=True)
    except StudyrunnerError:
        if study is not None:
            raise
        return []  # a tracking store without a ledger beside it: serve it anyway
    rows = [ledger.get_study(study)] if study is not None else ledger.studies()
    return [(r.name, r.mlflow_experiment_id) for r in rows if r.mlflow_experiment_id]


db_app = typer.Typer(
    help="The results ledger's schema: show its revision, upgrade an older ledger.", no_args_is_help=True
)
app.add_typer(db_app, name="db")


def _db_engine(workspace: Path | None, db: str | None, *, read_only: bool):
    from .store.ledger import database_errors, open_engine

    url = _workspace(workspace, db).db_url
    engine, _mode = open_engine(url, read_only=read_only)
    return url, engine, database_errors(url)


@db_app.command("current")
@user_errors
def db_current(db: DbOpt = None, workspace: WorkspaceOpt = None):
    """Print the ledger's schema revision and the one this version of studyrunner needs."""
    from .store import schema as ledger_schema

    url, engine, errors = _db_engine(workspace, db, read_only=True)
    with errors:
        revision = ledger_schema.current(engine, url)
    if revision is None:
        raise StudyrunnerError(f"{url!r} holds no studyrunner ledger (an empty database; `submit` creates one)")
    newest = ledger_schema.head()
    state = "current" if revision == newest else f"older: run {_db_hint(workspace, db, 'upgrade')}"
    out.print(f"{url}: revision {revision} (this studyrunner: {newest}; {state})", markup=False)


@db_app.command("upgrade")
@user_errors
def db_upgrade(db: DbOpt = None, workspace: WorkspaceOpt = None):
    """Upgrade an existing ledger to the schema this studyrunner needs (keeps every row)."""
    from .store import schema as ledger_schema

    url, engine, errors = _db_engine(workspace, db, read_only=False)
    with errors:
        if ledger_schema.current(engine, url) is None:
            raise StudyrunnerError(
                f"{url!r} holds no studyrunner ledger: nothing to upgrade (`studyrunner submit` creates a new one)"
            )
        before, after = ledger_schema.upgrade(engine, url)
    message = "already at" if before == after else f"upgraded from {before} to"
    err.print(f"{url}: {message} revision {after}", markup=False)


def _db_hint(workspace: Path | None, db: str | None, verb: str) -> str:
    flags = tuple((k, str(v)) for k, v in (("--workspace", workspace), ("--db", db)) if v)
    from .workspace import hint

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

    from .orchestrate.mlflow_sync import sync_mlflow as sync
    from .orchestrate.tracking import Tracker
    from .store import CurveStore, Ledger

    ws = _workspace(workspace, db, tracking_uri, storage)
    ledger = Ledger(ws.db_url, create=False)
    ledger.get_study(study)  # an unknown study fails before MLflow is touched
    tracker = Tracker(ws.tracking_uri)
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
    _warn(report.problems)
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
    from .spec.jsonschema import study_json_schema

    sys.stdout.write(json.dumps(study_json_schema(), indent=2) + "\n")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
