"""Scaling fits in effective depth D: `scaling` fits a curve to a study's points and ranks the forms, `forms`
holds the curves a fit can take and their least-squares solve, `intervals` the parameter and curve intervals of
a fit's `ci` method, and `robust` the CR2 sandwich with Bell-McCaffrey degrees of freedom those intervals (and a
slope claim's test, `analysis.claims.slope`) rest on. One group because a fit, its form and its interval are
computed together and only make sense together; nothing here reads verdicts.
"""

from .forms import FORMS, LINEAR, LOGLINEAR, POWER_FLOOR, Form, get_form
from .intervals import N_BOOT, NONLINEAR_BOOT
from .scaling import (
    CI_METHODS,
    DEFAULT_CI,
    Fit,
    failure_vs_depth,
    fit,
    fit_forms,
    fit_groups,
    fit_table,
    scaling_points,
)

__all__ = [
    "CI_METHODS", "DEFAULT_CI", "FORMS", "LINEAR", "LOGLINEAR", "NONLINEAR_BOOT", "N_BOOT", "POWER_FLOOR", "Fit",
    "Form", "failure_vs_depth", "fit", "fit_forms", "fit_groups", "fit_table", "get_form", "scaling_points",
]  # fmt: skip
