"""The `studyrunner` command: a thin layer over the Python API (nothing imports this module)."""

from __future__ import annotations

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
        try:
            return fn(*args, **kwargs)
        except StudyrunnerError as exc:
            say_error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - the boundary itself
            if os.environ.get("STUDYRUNNER_DEBUG"):
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            say_error(f"{type(exc).__name__}: {first} (unexpected; STUDYRUNNER_DEBUG=1 shows the traceback)")
            raise typer.Exit(1) from None

    return wrapper


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

    return Workspace.resolve(workspace, db=db, tracking_uri=tracking_uri, storage=storage)


@app.command()
@user_errors
def submit(
    file: StudyFile,
    address: Annotated[
        str | None, typer.Option(help="Ray cluster address [env RAY_ADDRESS; default: start a local Ray].")
    ] = None,
    max_concurrent: Annotated[int | None, typer.Option(min=1, help="At most this many trials at once.")] = None,
    max_failures: Annotated[int, typer.Option(min=0, help="Retries per trial (Ray Tune FailureConfig).")] = 0,
    db: DbOpt = None,
    tracking_uri: TrackingOpt = None,
    storage: Annotated[
        str | None, typer.Option(help="Folder or URI for curves and Ray results [env STUDYRUNNER_STORAGE].")
    ] = None,
    workspace: WorkspaceOpt = None,
    progress: Annotated[bool, typer.Option(help="Live progress display.")] = True,
):
    """Compile a study and run every trial that has not yet succeeded."""
    from .orchestrate import submit as run
    from .spec import load_and_compile

    compiled = load_and_compile(file)
    _warn(compiled.warnings)
    ws = _workspace(workspace, db, tracking_uri, storage)
    try:
        result = run(
            compiled,
            ws,
            address=address,
            max_concurrent=max_concurrent,
            max_failures=max_failures,
            console=err,
            show_progress=progress,
        )
    except KeyboardInterrupt:  # before Ray Tune took over (starting Ray, opening MLflow): nothing ran
        err.print(f"interrupted before any trial started; resume with: studyrunner submit {file}", markup=False)
        raise typer.Exit(130) from None
    if result.ran or result.interrupted:
        err.print(
            f"{escape(result.study)}: ran {result.ran} trials in {result.wall_time_s:.0f} s: "
            f"[green]{len(result.succeeded)} succeeded[/], [red]{len(result.failed)} failed[/]"
            + (f", {len(result.interrupted)} interrupted (pending)" if result.interrupted else "")
        )
    else:
        err.print(f"{escape(result.study)}: nothing to run; every trial already succeeded")
    _print_summary(ws, compiled.study)
    err.print(f"ledger: {ws.db_url}\nMLflow: {ws.tracking_uri}  (studyrunner ui)", markup=False, highlight=False)
    if result.interrupted:
        err.print(f"resume with: studyrunner submit {file}  (runs only what has not succeeded)", markup=False)
        raise typer.Exit(130)
    if result.failed:
        err.print(f"see errors: studyrunner results {result.study} --format table", markup=False)
        raise typer.Exit(1)


def _print_summary(ws, study) -> None:
    from .results import cell_summary, trials_frame
    from .store import Ledger

    metric = study.metric
    summary = cell_summary(trials_frame(Ledger(ws.db_url), study.name), metric.name, metric.mode)
    if summary.empty:
        _warn([f"no trial reported {metric.name!r}; see `studyrunner results {study.name}`"])
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
    out.print(f"{file}: ok ({len(compiled.cells)} cells, {len(compiled.trials)} trials)", markup=False, highlight=False)


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
    table = Table(
        title=Text(
            f"{study.name}: {len(compiled.cells)} cells x {len(study.seeds)} seeds = {len(compiled.trials)} trials"
        )
    )
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


@app.command()
@user_errors
def status(
    study: Annotated[str | None, typer.Argument(help="Study name (default: all studies).")] = None,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
):
    """Trials per status, per study."""
    from .store import STATUSES, Ledger

    ledger = Ledger(_workspace(workspace, db).db_url, create=False)
    counts = ledger.status_counts(study)
    if not counts:
        out.print("no studies in the ledger yet; run: studyrunner submit FILE")
        return
    table = Table()
    table.add_column("study")
    for s in (*STATUSES, "total"):
        table.add_column(s, justify="right")
    styles = {"succeeded": "green", "failed": "red", "running": "cyan", "pending": "yellow"}
    for name, c in sorted(counts.items()):
        cells = [f"[{styles[s]}]{c[s]}[/]" if c[s] else "0" for s in STATUSES]
        table.add_row(Text(name), *cells, str(sum(c.values())))
    out.print(table)


class Format(StrEnum):
    table = "table"
    csv = "csv"
    parquet = "parquet"
    json = "json"


@app.command()
@user_errors
def results(
    study: Annotated[str, typer.Argument(help="Study name.", show_default=False)],
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout (required for parquet).")
    ] = None,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
):
    """One row per trial: identity, status, flattened config and final metrics."""
    from .results import trials_frame
    from .store import Ledger

    if format is Format.parquet and out_path is None:
        raise StudyrunnerError("--format parquet writes a binary file: add --out PATH.parquet")
    if out_path is not None:
        _check_out_path(out_path)
    df = trials_frame(Ledger(_workspace(workspace, db).db_url, create=False), study)
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
    table = Table()
    for col in ["cell", "seed", "status", *varied, *metrics]:
        table.add_column(col.rsplit(".", 1)[-1] if col in varied else col)
    for _, row in df.iterrows():
        table.add_row(*(Text(_cell_text(row[col])) for col in ["cell", "seed", "status", *varied, *metrics]))
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
        float | None, typer.Option(help="Time to solve: first step the metric reaches this [default: 90% of best].")
    ] = None,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
    storage: StorageOpt = None,
):
    """Seed statistics per cell, scaling fits against effective depth, paired comparisons, claims."""
    from .analysis import data as analysis_data
    from .analysis.present import print_analysis, write_json
    from .analysis.summary import analyze as run_analysis

    loaded = analysis_data.load(study, db=db, workspace=workspace, storage=storage)
    result = run_analysis(loaded, metric=metric, by=by, threshold=threshold)
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
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
    storage: StorageOpt = None,
):
    """Check the study's claims: supported, contradicted or inconclusive (exit 1 if one is contradicted)."""
    from .analysis import claims as analysis_claims
    from .analysis import data as analysis_data
    from .analysis.present import verdicts_table, write_json

    loaded = analysis_data.load(study, db=db, workspace=workspace, storage=storage)
    if not loaded.claims:
        raise StudyrunnerError(f"study {loaded.name!r} declares no claims; add a `claims:` list to its study file")
    verdicts = analysis_claims.verify(loaded)
    table = analysis_claims.verdict_table(verdicts)
    if format is AnalysisFormat.json:
        write_json(json.loads(table.to_json(orient="records")))
    elif format is AnalysisFormat.csv:
        sys.stdout.write(table.to_csv(index=False))
    else:
        if loaded.missing:
            err.print(f"{loaded.missing} trials have not finished; verdicts use finished seeds", markup=False)
        out.print(verdicts_table(verdicts))
    if any(v.verdict in (analysis_claims.CONTRADICTED, analysis_claims.INVALID) for v in verdicts):
        raise typer.Exit(1)


@app.command()
@user_errors
def report(
    study: StudyArg,
    out_dir: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder for the report [default: WORKSPACE/reports].")
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
    from .analysis import data as analysis_data
    from .analysis.mlflow_ui import log_study_run
    from .analysis.report import write_report

    ws = _workspace(workspace, db, tracking_uri, storage)
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise StudyrunnerError(f"--out: {str(out_dir)!r} is a file; give a folder")
    loaded = analysis_data.load(study, db=db, workspace=workspace, storage=storage)
    ui_base = ui_url or (ws.tracking_uri if ws.tracking_uri.startswith(("http://", "https://")) else None)
    written = write_report(loaded, out_dir or ws.root / "reports", ui=ui_base)
    err.print(f"wrote {written[0]}", markup=False, highlight=False)
    if mlflow and loaded.experiment_id:
        run_id = log_study_run(ws.tracking_uri, loaded.name, loaded.experiment_id, written)
        err.print(f"logged to MLflow run {run_id} (experiment {loaded.experiment_id})", markup=False, highlight=False)


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
        ledger = Ledger(db_url, create=False)
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


def _db_engine(workspace: Path | None, db: str | None):
    from .store.db import make_engine

    ws = _workspace(workspace, db)
    path = ws.db_url.removeprefix("sqlite:///") if ws.db_url.startswith("sqlite:///") else None
    if path is not None and not Path(path).is_file():
        raise StudyrunnerError(f"no results ledger at {path!r} (check --db / --workspace / STUDYRUNNER_HOME)")
    return ws.db_url, make_engine(ws.db_url)


@db_app.command("current")
@user_errors
def db_current(db: DbOpt = None, workspace: WorkspaceOpt = None):
    """Print the ledger's schema revision and the one this version of studyrunner needs."""
    from .store import schema as ledger_schema

    url, engine = _db_engine(workspace, db)
    out.print(
        f"{url}: revision {ledger_schema.current(engine)} (this studyrunner: {ledger_schema.head()})", markup=False
    )


@db_app.command("upgrade")
@user_errors
def db_upgrade(db: DbOpt = None, workspace: WorkspaceOpt = None):
    """Upgrade an existing ledger to the schema this studyrunner needs (keeps every row)."""
    from .store import schema as ledger_schema

    url, engine = _db_engine(workspace, db)
    before, after = ledger_schema.upgrade(engine)
    message = "already at" if before == after else f"upgraded from {before} to"
    err.print(f"{url}: {message} revision {after}", markup=False)


@app.command()
def schema():
    """Print the JSON Schema of study files (for editor autocompletion)."""
    from .spec.jsonschema import study_json_schema

    sys.stdout.write(json.dumps(study_json_schema(), indent=2) + "\n")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
