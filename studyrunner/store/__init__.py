"""The ledger (SQL) and curve store (Parquet)."""

from .curves import CurveStore
from .db import CellRow, StudyRow, TrialRow
from .ledger import Ledger, Registration
from .status import STATUSES, IllegalTransition, TrialStatus

__all__ = [
    "STATUSES",
    "CellRow",
    "CurveStore",
    "IllegalTransition",
    "Ledger",
    "Registration",
    "StudyRow",
    "TrialRow",
    "TrialStatus",
]
