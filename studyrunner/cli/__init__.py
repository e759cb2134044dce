"""The `studyrunner` command: a thin layer over the Python API (nothing in the package imports it).

One module per group of verbs, all on one Typer app (`common.app`); importing them registers the verbs in
the order `studyrunner --help` lists them."""

from __future__ import annotations

from .common import app

# The import order is the order `studyrunner --help` lists the verbs in.
# isort: off
from . import running, inspecting, analysing, database  # noqa: F401 - registers the verbs
from . import tasks  # noqa: F401 - registers `tasks` (last in the list)

# isort: on

__all__ = ["app", "main"]


def main() -> None:
    from . import supervise

    supervise.enabled = True  # the commands that train run in a watched child process (supervise.py)
    app()
