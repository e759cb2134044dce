"""The ledger: the source of truth for what has run. Keyed by `trial_key`, so writes are idempotent.

One writer (the submitting driver) updates it; any number of readers (`status`, `results`,
analysis) may read it while a study runs.

`Ledger` is one object made of parts, each in a module named for what it holds:

    opening.py        LedgerDatabase: opening the database (modes, one-line errors), its sessions
    registration.py   Registering: a study's row, cells and trials; which trials a submit runs
    leases.py         Leases: submissions, their leases on trials and studies, heartbeats, release
    attempts.py       Attempts: a trial's attempts and outcome, its MLflow run and sync flag
    search_points.py  SearchPoints: what a search suggested and what Optuna was told
    looks.py          Looks: a sequential study's looks and the waves they add
    reads.py          Reads: the queries (studies, cells, trials, attempts, status counts)

The names other modules import from here (`STALE_AFTER_S`, `probe`, ...) are re-exported below.
"""

from __future__ import annotations

from .attempts import Attempts
from .leases import STALE_AFTER_S, Leases, submission_process_alive
from .look_rows import Looks
from .opening import LedgerDatabase, database_errors, open_engine, probe
from .reads import Reads
from .registration import Registering, Registration
from .search_points import SearchPoints
from .status import SUBMIT_RUNS

__all__ = [
    "STALE_AFTER_S",
    "SUBMIT_RUNS",
    "Ledger",
    "LedgerDatabase",
    "Registration",
    "database_errors",
    "open_engine",
    "probe",
    "submission_process_alive",
]


class Ledger(Registering, Reads, Leases, Attempts, SearchPoints, Looks):
    """Open the ledger at `url` (`Ledger(url, create=True, read_only=False)`; LedgerDatabase, opening.py, says
    what each mode opens and refuses). Its verbs come from the parts listed in this module's docstring."""
