"""The study's MLflow side around a run: its experiment and a parent run per cell before (`open_tracking`), and a
short sync of what MLflow and the curves lack after (`mend_tracking`)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.text import Text

from ..errors import StudyrunnerError
from ..store import CurveStore, Ledger
from ..urls import mask_text, mask_url
from ..workspace import Workspace
from .tracker import Tracker


def open_tracking(compiled, to_run, ledger: Ledger, tracker: Tracker, workspace: Workspace):
    """The study's MLflow experiment and a parent run per cell that has trials to run."""
    study = compiled.study
    for attempt in range(4):
        try:
            experiment_id = tracker.experiment(study.name, workspace.artifact_location(study.name), study.description)
            break
        except Exception as exc:  # noqa: BLE001 - MLflow surfaces store errors under many types
            # Two submits on a fresh workspace race to create MLflow's tables (or the experiment): the
            # loser finds them a moment later.
            if attempt == 3:
                first = str(exc).strip().splitlines()[0]
                raise StudyrunnerError(
                    f"cannot use MLflow tracking store {mask_url(workspace.tracking_uri)!r}: "
                    f"{mask_text(first, workspace.tracking_uri)}"
                ) from None
            time.sleep(0.5 * (attempt + 1))
    ledger.set_experiment(study.name, experiment_id)
    # Runs MLflow already holds for these cells and trials, by tag: a ledger that lost their ids (made anew
    # beside an old tracking store, or a driver killed between making a run and naming it) finds them
    # again instead of making second ones.
    by_tag = tracker.runs_by_tag(experiment_id)
    known_parents = {c.cell_hash: c.mlflow_run_id for c in ledger.cells(study.name)}
    parent_runs: dict[str, str] = {}
    for cell in compiled.cells:
        if any(t.cell_hash == cell.cell_hash for t in to_run):
            known = known_parents.get(cell.cell_hash) or by_tag.get(("cell", cell.cell_hash))
            run_id = tracker.cell_run(experiment_id, study, cell, known)
            if run_id != known_parents.get(cell.cell_hash):
                ledger.set_cell_run(study.name, cell.cell_hash, run_id)
            parent_runs[cell.cell_hash] = run_id
    return experiment_id, parent_runs, by_tag


def mend_tracking(ledger: Ledger, tracker: Tracker, workspace: Workspace, study: str, console: Console) -> None:
    """Mend what MLflow and the curves lack of the study's flagged trials (MLflow was down for them, or the
    driver that ran them died half way): a short sync, so no command leaves a disagreement behind."""
    from .sync import sync_mlflow

    try:
        report = sync_mlflow(
            ledger,
            tracker,
            CurveStore(workspace.storage),
            study,
            storage=workspace.storage,
            only_dirty=True,
            artifact_location=workspace.artifact_location(study),
            again=workspace.hint("sync-mlflow", study),
        )
    except StudyrunnerError as exc:
        console.print(Text.assemble(("warning: ", "yellow"), str(exc)), highlight=False)
        return
    if report.changed:
        console.print(
            f"mended {report.trials_synced} trials in MLflow ({report.points_logged} points, "
            f"{report.runs_created} runs created, {report.statuses_set} statuses set) and "
            f"{report.curves_rebuilt} curves from checkpoints",
            markup=False,
            highlight=False,
        )
    for line in report.problems:
        console.print(Text.assemble(("warning: ", "yellow"), line), highlight=False)
