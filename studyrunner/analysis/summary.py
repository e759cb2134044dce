"""Everything `studyrunner analyze` reports, computed once: `analyze(data) -> Analysis`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import claims as claims_mod
from . import depth, sequential, solve
from . import fits as fits_mod
from . import stats as stats_mod
from .claims import power, validity
from .data import StudyData
from .search_history import best_points


@dataclass
class Analysis:
    data: StudyData
    metric: str
    cells: pd.DataFrame
    fits: list[fits_mod.Fit] = field(default_factory=list)  # metric vs trained D, best BIC first
    loops_fits: list[fits_mod.Fit] = field(default_factory=list)  # metric vs test-time D (eval.loops)
    groups: pd.DataFrame = field(default_factory=pd.DataFrame)  # per-group log-linear fits + slope ratios
    group_by: str | None = None
    gap: pd.DataFrame = field(default_factory=pd.DataFrame)
    paired: pd.DataFrame = field(default_factory=pd.DataFrame)
    time_to_solve: pd.DataFrame = field(default_factory=pd.DataFrame)  # per trial
    time_to_solve_cells: pd.DataFrame = field(default_factory=pd.DataFrame)
    failure_depth: dict = field(default_factory=dict)
    # looped vs stacked cells at equal effective depth (and vs their baselines): looped − other
    equal_depth: pd.DataFrame = field(default_factory=pd.DataFrame)
    # log-linear fit of the metric against D per family of cells (looped lines, stacked cells)
    families: pd.DataFrame = field(default_factory=pd.DataFrame)
    threshold: float = math.nan  # time to solve: the threshold, and where it came from
    threshold_source: str = ""
    chance: float = math.nan  # the metric's chance level (per-token accuracy of a known task)
    chance_source: str = ""
    logistic_top: float | None = None  # the logistic's fixed ceiling (None: fitted)
    verdicts: list[claims_mod.Verdict] = field(default_factory=list)
    # per claim (same order as verdicts): the threats to its validity the data show (analysis/claims/validity.py)
    threats: list[list] = field(default_factory=list)

    @property
    def fit_table(self) -> pd.DataFrame:
        table = fits_mod.fit_table(self.fits)
        if len(self.loops_fits):
            loops = fits_mod.fit_table(self.loops_fits).assign(depth="eval.loops (test-time)")
            table = pd.concat([table.assign(depth="trained"), loops], ignore_index=True)
        return table

    @property
    def claims_table(self) -> pd.DataFrame:
        table = claims_mod.verdict_table(self.verdicts)
        if self.threats:
            table["threats"] = [",".join(dict.fromkeys(str(t.threat) for t in found)) for found in self.threats]
        return table

    def header(self) -> str:
        d = self.data
        done = len(d.done)
        text = (
            f"{d.name}: {done} trials finished in {d.trials.cell_hash.nunique()} cells; metric {self.metric} ({d.mode})"
        )
        if d.missing:
            text += f"; {d.missing} trials missing (not run yet or still running): statistics cover finished seeds only"
        if d.failure_rule is not None:
            text += f"; failure rule: {d.failure_rule.text}"
        return text

    @property
    def search(self) -> pd.DataFrame:
        """A search study's suggestions in order, with the value Optuna was told and the best so far."""
        return self.data.search

    def to_dict(self) -> dict:
        def records(df: pd.DataFrame) -> list[dict]:
            return json.loads(df.to_json(orient="records")) if len(df) else []

        return {
            "study": self.data.name,
            "metric": self.metric,
            "mode": self.data.mode,
            "trials_finished": len(self.data.done),
            "trials_missing": self.data.missing,
            "failure_rule": self.data.failure_rule.text if self.data.failure_rule else None,
            "cells": records(self.cells),
            "fits": records(self.fit_table),
            "fit_groups": records(self.groups),
            "group_by": self.group_by,
            "percent_gap": records(self.gap),
            "paired": records(self.paired),
            "time_to_solve": records(self.time_to_solve_cells),
            "solve_threshold": _finite(self.threshold),
            "solve_threshold_source": self.threshold_source,
            "chance": _finite(self.chance),
            "chance_source": self.chance_source,
            "logistic_top": self.logistic_top,
            "equal_depth": records(self.equal_depth),
            "families": records(self.families),
            "failure_vs_depth": self.failure_depth,
            "claims": records(self.claims_table),
            "search": records(self.search),
            "search_best": records(best_points(self.search)),
        }


def _finite(value: float) -> float | None:
    return value if value is not None and np.isfinite(value) else None


# %Gap table columns and their headings, shared by the terminal and the HTML report.
GAP_COLUMNS = {
    "cell": "looped cell",
    "looped": "looped",
    "iso_param": "iso-param",
    "iso_flop": "iso-FLOP",
    "gap_pct": "%Gap",
    "gap_lo": "lo",
    "gap_hi": "hi",
    "ci": "interval",
}


# Fit table columns (terminal); the report adds the remaining intervals.
FIT_COLUMNS = {
    "depth": "D from", "form": "form", "n": "n", "alpha": "α", "alpha_lo": "α lo", "alpha_hi": "α hi",
    "beta": "β", "c": "c", "k": "k", "m": "m", "top": "top", "E": "E", "A": "A", "gamma": "γ",
    "r2": "R²", "rmse": "RMSE", "aic": "AIC", "bic": "BIC", "extrapolation_error": "extrap. err",
    "ci": "interval", "flags": "flags",
}  # fmt: skip
FAMILY_COLUMNS = {
    "family": "family", "cells": "cells", "n": "n", "alpha": "α", "alpha_lo": "α lo", "alpha_hi": "α hi",
    "beta": "β", "r2": "R²", "ratio": "α/α_stacked", "ratio_lo": "lo", "ratio_hi": "hi",
    "gap_pct": "mean %Gap", "gap_cells": "cells with baselines", "ci": "interval", "flags": "flags",
}  # fmt: skip
EQUAL_DEPTH_COLUMNS = {
    "D": "D", "looped": "looped", "other": "other", "kind": "comparison", "other_D": "other D",
    "looped_mean": "looped mean", "other_mean": "other mean", "diff": "looped − other", "lo": "lo", "hi": "hi",
    "method": "interval", "p_looped_better": "P(looped better)",
}  # fmt: skip


def default_forms(mode: str) -> tuple[str, ...]:
    """Accuracies (max) may saturate: log-linear and logistic; losses (min): log-linear and power law."""
    return ("loglinear", "logistic") if mode == "max" else ("loglinear", "power_floor")


def analyze(
    data: StudyData,
    metric: str | None = None,
    by: str | None = None,
    threshold: float | None = None,
    with_claims: bool = True,
    logistic_top: float | None = None,
    ci: str | None = None,
) -> Analysis:
    """`threshold` (time to solve) and `logistic_top` (fix the logistic's ceiling) default to the study
    file's `analysis:` options (`solve_threshold`, `logistic_top`); `ci` is the fits' interval method
    (`fits.CI_METHODS`; default CR2 t by seed)."""
    metric = metric or data.metric
    out = Analysis(data, metric, stats_mod.cell_stats(data, metric))
    if logistic_top is None:
        logistic_top = data.analysis.get("logistic_top")
    out.logistic_top = logistic_top
    chance = solve.chance_level(data, metric)
    if chance is not None:
        out.chance, out.chance_source = chance
    if data.done.empty:
        return out
    forms = default_forms(data.mode)
    points = fits_mod.scaling_points(data, metric)
    if len(points) and points.depth.nunique() >= 2:
        # measured depths (halting) differ per seed: the bootstrap option resamples seeds within cells
        out.fits = fits_mod.fit_forms(points, forms, strata="cell_hash", top=logistic_top, ci=ci)
        by = by or ("baseline" if (data.trials.baseline != "").any() else None)
        if by is not None:
            column = by if by in points else data.column_for(by)
            groups = points.assign(_group=points[column].astype(str))
            if groups._group.nunique() > 1:
                ref = "iso_flop" if column == "baseline" and (groups._group == "iso_flop").any() else None
                out.groups = fits_mod.fit_groups(groups, "_group", ref=ref, ci=ci).rename(columns={"_group": by})
                out.group_by = by
    loops_points = fits_mod.scaling_points(data, metric, source="loops")
    if len(loops_points) and loops_points.depth.nunique() >= 2:
        out.loops_fits = fits_mod.fit_forms(loops_points, forms, strata="depth", top=logistic_top, ci=ci)
    out.gap = depth.percent_gap(data, metric, ci=ci)
    out.paired = stats_mod.paired_comparisons(data, metric)
    out.equal_depth = depth.equal_depth_comparisons(data, metric)
    out.families = depth.family_fits(data, points, out.gap, ci=ci)
    out.threshold, out.threshold_source = solve.solve_threshold(data, metric, threshold)
    out.time_to_solve = solve.time_to_solve(data, metric, out.threshold, out.threshold_source)
    if len(out.time_to_solve):
        out.time_to_solve_cells = solve.time_to_solve_summary(out.time_to_solve, data.cells_order)
    out.failure_depth = fits_mod.failure_vs_depth(data)
    if with_claims and data.claims:
        out.verdicts = power.fill(data, sequential.verify(data))  # a sequential study's: as its looks decided them
        out.threats = validity.assess_all(data, out.verdicts)
    return out


def fmt(value, digits: int = 4) -> str:
    """A number for tables: NaN as blank, integers plainly, else `digits` significant digits."""
    if value is None:
        return ""
    if isinstance(value, bool | np.bool_):
        return "yes" if value else ""
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}g}"
    return str(value)


def interval(lo, hi, digits: int = 3) -> str:
    if lo is None or hi is None or (isinstance(lo, float) and math.isnan(lo)):
        return ""
    return f"[{fmt(lo, digits)}, {fmt(hi, digits)}]"


def verdict_interval(v: claims_mod.Verdict) -> str:
    """The verdict's interval as shown: on the difference scale, or named (e.g. "odds ratio 3.2 [1.1, inf]")."""
    shown = interval(v.lo, v.hi)
    return f"{v.scale} {fmt(v.estimate, 3)} {shown}" if v.scale and shown else shown


def verdict_detail(v: claims_mod.Verdict) -> str:
    """The detail, with the seeds needed for an inconclusive claim (`power.seeds_needed`) after it."""
    return "; ".join(filter(None, [v.detail, seeds_needed_text(v)]))


def seeds_needed_text(v: claims_mod.Verdict) -> str:
    """E.g. "seeds needed for 80% power: 7 per side at the observed effect +0.02 (closed form: noncentral t,
    paired; an estimate: sd from 3 seeds); 12 at min_effect 0.05"."""
    if not v.seeds_needed:
        return ""
    parts = []
    for key, label in (("observed", "the observed effect"), ("min_effect", "min_effect")):
        need = v.seeds_needed.get(key)
        if not need:
            continue
        count = f"{need['per_side']} per side" if need["per_side"] is not None else "more than 1000 per side"
        how = "; ".join(filter(None, [need["method"], need["note"]]))
        parts.append(f"{count} at {label} {need['effect']:+.3g} ({how})")
    return "seeds needed for 80% power: " + "; ".join(parts) if parts else ""
