"""How long a call to an MLflow server may take: every command that talks to one (submit, sync-mlflow, report).

MLflow's HTTP client retries a failed request 7 times with exponential backoff and waits 120 s for each
answer: minutes per call against a dead server, while the command waits. One immediate retry and a 5 s
timeout make a refused connection fail at once and a hung server within ~10 s. Against a server MLflow also
prints two "View run ... at: URL" lines on stdout for every run it ends (each trial and cell, once per
attempt): the product links the UI itself. The user's own settings of these variables win.
"""

from __future__ import annotations

import os

from ..urls import has_password

HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


def bound_http_retries(uri: str | None = None) -> None:
    """Apply HTTP_DEFAULTS for this process (MLflow reads them at every request). MLflow's "View run at: URL"
    lines repeat the tracking URI as given: never for one with a password, whatever the user's setting."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    if uri and has_password(uri):
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
