"""Run compiled studies on Ray Tune; record them in the ledger, MLflow and Parquet."""

from .runner import SubmitResult, ensure_ray, submit

__all__ = ["SubmitResult", "ensure_ray", "submit"]
