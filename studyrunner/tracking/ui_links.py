"""The MLflow UI as the place to monitor a study: URLs into it, and the study-level run.

MLflow 3.x opens an experiment on its GenAI "Overview" unless told the experiment is for model training.
Two switches do it: the experiment tag `mlflow.experimentKind = custom_model_development` (set by
`tracking.tracker` when a study's experiment is created or reused) and, because MLflow 3.17's UI takes
the kind from its GenAI / model-training toggle, the `workflowType=machine_learning` query parameter in the
runs URL this module builds.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from ..urls import mask_text, mask_url, without_password
from .http import bound_http_retries

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # MLflow's value for "machine learning / model training"
DEFAULT_UI = "http://127.0.0.1:5000"  # `studyrunner ui`'s default address
STUDY_RUN_KIND = "study"


def ui_base(tracking_uri_or_base_url: str | None) -> str:
    """An http(s) tracking URI is its own UI; any other store (SQLite, PostgreSQL) is served by
    `studyrunner ui`, on DEFAULT_UI unless given another address. A server's password is left out: the link
    goes into reports and MLflow, and the browser asks for it."""
    if tracking_uri_or_base_url and tracking_uri_or_base_url.startswith(("http://", "https://")):
        return without_password(tracking_uri_or_base_url.rstrip("/"))
    return DEFAULT_UI


def runs_url(tracking_uri_or_base_url: str | None, experiment_id: str) -> str:
    """The study's runs table in the MLflow UI (model-training view), e.g.
    http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning"""
    base = ui_base(tracking_uri_or_base_url)
    return f"{base}/#/experiments/{quote(str(experiment_id))}/runs?workflowType=machine_learning"


def run_url(tracking_uri_or_base_url: str | None, experiment_id: str, run_id: str) -> str:
    """One run's page in the MLflow UI."""
    base = ui_base(tracking_uri_or_base_url)
    return f"{base}/#/experiments/{quote(str(experiment_id))}/runs/{quote(str(run_id))}?workflowType=machine_learning"


def mark_training_experiment(client, experiment_id: str) -> None:
    """Tag an experiment as model training, so MLflow's UI opens its runs rather than GenAI pages."""
    client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


def study_run(client, experiment_id: str, study: str) -> str:
    """The study-level run of a study's experiment (tag kind=study, one per study: the report's artifacts and a
    sequential study's looks), created on first use; returns its run id."""
    found = client.search_runs([experiment_id], filter_string=f"tags.kind = '{STUDY_RUN_KIND}'", max_results=1)
    if found:
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=f"{study}: study", tags={"kind": STUDY_RUN_KIND, "study": study})
    return run.info.run_id


def log_study_run(tracking_uri: str, study: str, experiment_id: str | None, files: list[Path]) -> str:
    """Log `files` (the report, fit and claim tables) as artifacts of the study-level run (tag
    kind=study, one per study, created on first use); returns its run id."""
    from mlflow import MlflowClient

    from ..errors import StudyrunnerError

    if not experiment_id:
        raise StudyrunnerError(f"study {study!r} has no MLflow experiment yet (submit it first)")
    store = Path(tracking_uri.removeprefix("sqlite:///")) if tracking_uri.startswith("sqlite:///") else None
    if store is not None and not (os.access(store, os.W_OK) and os.access(store.parent, os.W_OK)):
        raise StudyrunnerError(f"the MLflow store {str(store)!r} cannot be written (a read-only location)")
    # A dead server fails the call in seconds, not minutes of retries; no "View run at: URL" lines (with a password)
    bound_http_retries(tracking_uri)
    try:
        client = MlflowClient(tracking_uri)
        mark_training_experiment(client, experiment_id)
        run_id = study_run(client, experiment_id, study)
        for path in files:
            client.log_artifact(run_id, str(path), artifact_path="analysis")
        client.set_terminated(run_id, "FINISHED")
    except StudyrunnerError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow raises many types for store problems
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = mask_url(tracking_uri)
        raise StudyrunnerError(
            f"cannot log the report to MLflow at {where!r}: {mask_text(first, tracking_uri)}"
        ) from None
    return run_id
