"""The ledger (SQL) and curve store (Parquet)."""

from .curves import CurveStore
from .db import STATUSES, CellRow, StudyRow, TrialRow
from .ledger import Ledger, Registration

__all__ = ["STATUSES", "CellRow", "CurveStore", "Ledger", "Registration", "StudyRow", "TrialRow"]
