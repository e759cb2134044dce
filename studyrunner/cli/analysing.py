"""`analyze`, `verify`, `report` and `ui`: the verbs that read a study's results and say what they show."""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ..errors import StudyrunnerError
from ..urls import mask_url
from .common import DbOpt, TrackingOpt, WorkspaceOpt, app, err, footer, open_workspace, out, user_errors, warn


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
CurvesStorageOpt = Annotated[str | None, typer.Option(help="Folder or URI of the curves [env STUDYRUNNER_STORAGE].")]


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
    storage: CurvesStorageOpt = None,
):
    """Seed statistics per cell, scaling fits against effective depth, paired comparisons, claims."""
    from ..analysis.present import print_analysis, write_json
    from ..analysis.summary import analyze as run_analysis

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
            "and verdict show beside the raw ones, and the exit code follows the adjusted verdicts. On a sequential "
            "study it adjusts the repeated p-values after the fact: valid, but nearly powerless (two claims, an "
            "effect a fixed 8-seed test finds 80% of the time: 0.23 of studies reach p <= 0.025, against 0.655 for "
            "that fixed test at that level); declare `multiplicity: holm` in the study file instead, so the looks "
            "themselves share alpha (docs/analysis/sequential.md).",
        ),
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Also exit 1 when a decided (supported or contradicted) claim carries a threat to its validity "
            "(ceiling, floor, unconverged, confound, unmatched, selection).",
        ),
    ] = False,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
    storage: CurvesStorageOpt = None,
):
    """Check the study's claims: supported, contradicted, inconclusive, or pending while trials they select
    are unfinished (exit 1 if a claim is contradicted or invalid; pending claims never fail), each with the
    threats to its validity the data show (analysis/claims/validity.py)."""
    from ..analysis import claims as analysis_claims
    from ..analysis import sequential
    from ..analysis.claims import VerdictKind, power, validity
    from ..analysis.present import print_verdicts, write_json

    loaded = _load_study(study, db, workspace, storage)
    if not loaded.claims:
        if loaded.spec_error:
            raise StudyrunnerError(loaded.spec_error)
        raise StudyrunnerError(f"study {loaded.name!r} declares no claims; add a `claims:` list to its study file")
    verdicts = power.fill(loaded, sequential.verify(loaded, holm=holm))
    threats = validity.assess_all(loaded, verdicts)
    table = analysis_claims.verdict_table(verdicts, holm=holm)
    table["threats"] = [",".join(dict.fromkeys(str(t.threat) for t in found)) for found in threats]
    if format is AnalysisFormat.json:
        rows = json.loads(table.to_json(orient="records"))
        for row, found, entry in zip(rows, threats, loaded.claims, strict=True):
            row["validity"] = [t.to_dict() for t in found]
            if loaded.tuning:
                row["tuned"] = validity.tuned_sides(loaded, entry)
        write_json(rows)
    elif format is AnalysisFormat.csv:
        sys.stdout.write(analysis_claims.flat(table).to_csv(index=False))
    else:
        if loaded.missing:
            err.print(f"{loaded.missing} trials have not finished; claims that select them are pending", markup=False)
        print_verdicts(verdicts, out, holm=holm)
        _print_threats(threats)
        _print_tuning(loaded)
    final = [v.verdict_holm if holm else v.verdict for v in verdicts]
    if any(f in (VerdictKind.CONTRADICTED, VerdictKind.INVALID) for f in final):
        raise typer.Exit(1)
    decided = (VerdictKind.SUPPORTED, VerdictKind.CONTRADICTED)
    if strict and any(f in decided and found for f, found in zip(final, threats, strict=True)):
        err.print("--strict: a decided claim carries a threat to its validity (see above)", markup=False)
        raise typer.Exit(1)


def _print_tuning(loaded) -> None:
    """A `tune:` study: what each cell runs with, chosen on the validation split (study/tuning.py)."""
    from rich.text import Text

    if not loaded.tuning:
        return
    labels = dict(zip(loaded.trials.cell_hash, loaded.trials.cell, strict=False)) if "cell" in loaded.trials else {}
    out.print(f"chosen per cell on the validation split (`tune:`; its trials: study {loaded.name}--tune):")
    for cell_hash, choice in loaded.tuning.items():
        chosen = ", ".join(f"{p} {v}" for p, v in choice["chosen"].items()) or "nothing (every point failed)"
        scores = "; ".join(
            f"{', '.join(str(v) for v in s['values'].values())}: "
            + ("failed" if s["score"] is None else f"{s['score']:.4g}")
            for s in choice["scores"]
        )
        line = f"  {labels.get(cell_hash, cell_hash)}: {chosen} ({choice['metric']}: {scores})"
        out.print(Text(line), soft_wrap=True)


def _print_threats(threats) -> None:
    """Each claim's threats to validity, one line each, under the claims table."""
    from rich.text import Text

    if not any(threats):
        out.print("threats to validity: none found")
        return
    out.print("threats to validity (analysis/claims/validity.py; docs/analysis/validity.md):")
    for i, found in enumerate(threats, 1):
        for t in found:
            out.print(Text.assemble(f"  claim {i}: ", (str(t.threat), "yellow"), f": {t.detail}"), soft_wrap=True)


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
    storage: CurvesStorageOpt = None,
    tracking_uri: TrackingOpt = None,
):
    """Write one self-contained HTML report (plots inline, no network) with the cell, fit and claim tables."""
    from ..analysis.report import write_report
    from ..tracking.ui_links import log_study_run

    ws = open_workspace(workspace, db, tracking_uri, storage)
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
            where = mask_url(ws.tracking_uri)
            warn([f"could not log the report to MLflow at {where} ({first}); --no-mlflow skips it"])
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
    from ..analysis import data as analysis_data

    ws = ws or open_workspace(workspace, db, storage=storage)
    footer.append(f"read from ledger {mask_url(ws.db_url)}")
    loaded = analysis_data.load(study, db=ws.db_url, workspace=ws.root, storage=ws.storage)
    loaded.on_warning = lambda line: warn([line])
    warn(loaded.warnings)
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
    from ..tracking.ui_links import runs_url
    from ..tracking.ui_server import serve

    ws = open_workspace(workspace, db=db, tracking_uri=tracking_uri)
    experiments = _experiments(ws.db_url, study)
    if "://" in ws.tracking_uri and ws.tracking_uri.split("://")[0] in ("http", "https"):
        raise StudyrunnerError(
            f"the tracking store is already a server ({mask_url(ws.tracking_uri)}); open it directly"
        )
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
            f"MLflow UI for {mask_url(ws.tracking_uri)}\n  -> {url}   (Ctrl-C stops it; server log: {log_path})",
            markup=False,
        )
        for name, experiment_id in experiments:  # the runs table, not MLflow's GenAI overview
            err.print(f"  {name}: {runs_url(url, experiment_id)}", markup=False, highlight=False)

    raise typer.Exit(serve(ws.tracking_uri, host, port, log_path, ready))


def _experiments(db_url: str, study: str | None) -> list[tuple[str, str]]:
    """(study, MLflow experiment id) to print runs links for; the named study must exist."""
    from ..store import Ledger

    try:
        ledger = Ledger(db_url, create=False, read_only=True)
    except StudyrunnerError:
        if study is not None:
            raise
        return []  # a tracking store without a ledger beside it: serve it anyway
    rows = [ledger.get_study(study)] if study is not None else ledger.studies()
    return [(r.name, r.mlflow_experiment_id) for r in rows if r.mlflow_experiment_id]
