"""The analysis layer: seed statistics, scaling fits, declared claims and the study report.

It reads the ledger and the Parquet curves (through `studyrunner.store`) and never trains.

>>> from studyrunner import analysis
>>> data = analysis.load("quickstart")              # or a study file: analysis.load("studies/quickstart.yaml")
>>> analysis.cell_stats(data)                        # one row per cell: n, mean, sd, CIs, IQM, failures, ...
>>> fits = analysis.fit_forms(analysis.scaling_points(data))   # log-linear / logistic / power-law fits in D
>>> [v.verdict for v in analysis.verify(data)]      # the study's declared claims
>>> analysis.write_report(data, "out/")              # one self-contained HTML file

Submodules load on first use, so `import studyrunner.analysis` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "StudyData": "data",
    "load": "data",
    "from_frame": "data",
    "cell_stats": "stats",
    "describe": "stats",
    "wilson": "stats",
    "bimodality": "stats",
    "paired_comparisons": "stats",
    "paired_difference": "stats",
    "time_to_solve": "solve",
    "time_to_solve_summary": "solve",
    "performance_profile": "stats",
    "equal_depth_comparisons": "depth",
    "solve_threshold": "solve",
    "chance_level": "solve",
    "seed_difference": "stats",
    "family_fits": "depth",
    "Fit": "fits",
    "fit": "fits",
    "fit_forms": "fits",
    "fit_groups": "fits",
    "fit_table": "fits",
    "scaling_points": "fits",
    "percent_gap": "depth",
    "Verdict": "claims",
    "evaluate": "claims",
    "verify": "claims",
    "verdict_table": "claims",
    "adjust_holm": "claims",
    "analyze": "summary",
    "Analysis": "summary",
    "write_report": "report",
    "runs_url": "studyrunner.tracking.ui_links",  # an absolute module: MLflow links live in tracking/
    "run_url": "studyrunner.tracking.ui_links",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        where = _EXPORTS[name]
        module = where if where.startswith("studyrunner.") else f".{where}"
        return getattr(importlib.import_module(module, __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
