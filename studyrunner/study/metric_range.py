"""The range a metric cannot leave, where the project knows it (the claims' distribution-free gate,
analysis/bounded.py, and what `validate` says a claim against a number can reach)."""

from __future__ import annotations

import re

# Accuracies and exact-match rates lie in [0, 1] by construction, at any budget, loop count or schedule summary
# (`_budget_4`, `_loops_8`, `_min`, `_spread`); correlations (`_rho`, in [-1, 1]) do not.
_UNIT = re.compile(r"(^|_)(accuracy|exact_match)(_|$)")
_NOT_UNIT = re.compile(r"_rho$")


def known_range(metric: str) -> tuple[float, float] | None:
    """(lo, hi) the metric cannot leave, where the project knows it; None otherwise (the t-test alone decides)."""
    if _UNIT.search(metric) and not _NOT_UNIT.search(metric):
        return (0.0, 1.0)
    return None
