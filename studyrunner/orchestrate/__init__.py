"""Run compiled studies on Ray Tune; record them in the ledger, MLflow and Parquet."""

from .runner import RunOptions, SubmitResult, cancel, ensure_ray, rerun, resume, submit
from .selection import RerunSelection

__all__ = ["RerunSelection", "RunOptions", "SubmitResult", "cancel", "ensure_ray", "rerun", "resume", "submit"]
