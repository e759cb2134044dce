"""Time to solve: the first step each seed's curve reaches a threshold, censored when it never does,
summarised per cell by the Kaplan-Meier median; and the threshold's default (a target in the study file,
else the task's chance level plus a margin)."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from scipy import stats

from .data import StudyData
from .stats import _clean


def time_to_solve(
    data: StudyData, metric: str | None = None, threshold: float | None = None, source: str | None = None
) -> pd.DataFrame:
    """Per trial: the first step at which `metric` reaches `threshold` (>= for mode max, <= for min), or
    the last logged step, censored, when it never does. Default threshold: `solve_threshold` (the study
    file's `analysis.solve_threshold`, else chance plus a margin, else 90% of the best cell mean);
    `source`: where a given threshold came from (`solve_threshold`'s second value)."""
    metric = metric or data.metric
    curves = data.curves
    if metric not in curves or curves.empty:
        return pd.DataFrame(columns=["trial_key", "cell", "seed", "step", "solved"])
    if threshold is None or source is None:
        threshold, source = solve_threshold(data, metric, threshold)
    rows = []
    done = data.done.set_index("trial_key")
    for key, curve in curves.dropna(subset=[metric]).groupby("trial_key"):
        if key not in done.index:
            continue
        curve = curve.sort_values("step")
        hit = curve[metric] >= threshold if data.mode == "max" else curve[metric] <= threshold
        solved = bool(hit.any())
        step = int(curve.step[hit].iloc[0]) if solved else int(curve.step.iloc[-1])
        rows.append(
            {
                "trial_key": key,
                "cell_hash": done.loc[key, "cell_hash"],
                "cell": done.loc[key, "cell"],
                "seed": int(done.loc[key, "seed"]),
                "step": step,
                "solved": solved,
                "threshold": threshold,
                "threshold_source": source,
            }
        )
    return pd.DataFrame(rows)


def default_threshold(data: StudyData, metric: str) -> float:
    """The last resort, with no chance level known: 90% of the best cell mean (mode max), 110% of the best
    (lowest) for mode min. It moves with the results."""
    means = data.done.groupby("cell_hash")[metric].mean().dropna() if metric in data.done else pd.Series()
    if means.empty:
        return math.nan
    return float(0.9 * means.max()) if data.mode == "max" else float(1.1 * means.min())


# Chance level of a per-token accuracy, per task: 1 / (the answer symbols) from the task's parameters.
CHANCE_SYMBOLS = {
    "phop": ("alphabet", None),
    "mqar": ("values", None),
    "recall": ("values", None),
    "var_assign": ("values", None),
    "sudoku": ("size", None),
    "igsm": ("modulus", None),
    "addition": (None, 10),  # answer digits
}
SOLVE_MARGIN = 0.1  # default solve threshold: chance + 10% of the way from chance to a perfect score
_ACCURACY = re.compile(r"(^|_)accuracy$")


def chance_level(data: StudyData, metric: str | None = None) -> tuple[float, str] | None:
    """(chance, how it was found) of a per-token accuracy metric (`*_accuracy`) for the study's task:
    1 / the number of answer symbols (phop: alphabet, mqar / recall / var_assign: values, sudoku: size,
    igsm: modulus, addition: 10 digits). On a 0-100 scale when the metric's values exceed 1. None when
    unknown (another metric, another task, or cells whose chance differs)."""
    metric = metric or data.metric
    trials = data.trials
    if not _ACCURACY.search(metric) or "task.name" not in trials or trials.empty:
        return None
    levels = set()
    for _, row in trials.drop_duplicates("cell_hash").iterrows():
        task = str(row["task.name"])
        if task not in CHANCE_SYMBOLS:
            return None
        param, fixed = CHANCE_SYMBOLS[task]
        n = fixed if param is None else row.get(f"task.params.{param}")
        if n is None or pd.isna(n) or float(n) < 2:
            return None
        levels.add((task, param, int(n)))
    if len(levels) != 1:
        return None
    task, param, n = levels.pop()
    chance = 1.0 / n
    values = _clean(data.done[metric]) if metric in data.done else np.empty(0)
    scale = 100.0 if len(values) and values.max() > 1.0 else 1.0
    how = f"1/{n} ({task}{f', {param} {n}' if param else ' digits'})"
    return chance * scale, how


def solve_threshold(data: StudyData, metric: str | None = None, threshold: float | None = None) -> tuple[float, str]:
    """(threshold, where it came from) for time to solve: the given one; the study file's
    `analysis.solve_threshold` (for the study metric); chance + SOLVE_MARGIN of the way to a perfect
    score (mode max, a per-token accuracy of a known task); else 90% of the best cell mean (110% for
    mode min), which moves with the results and is said to."""
    metric = metric or data.metric
    if threshold is not None:
        return float(threshold), "given (--threshold)"
    configured = (data.analysis or {}).get("solve_threshold")
    if configured is not None and metric == data.metric:
        return float(configured), "study file (analysis.solve_threshold)"
    chance = chance_level(data, metric) if data.mode == "max" else None
    if chance is not None:
        level, how = chance
        top = 100.0 if level > 1.0 else 1.0
        pct = f"{100 * SOLVE_MARGIN:g}%"
        return level + SOLVE_MARGIN * (top - level), f"chance {level:.3g} = {how} + {pct} of the way to {top:g}"
    value = default_threshold(data, metric)
    if data.mode == "min":
        return value, "110% of the best cell mean (mode min: no chance level; set analysis.solve_threshold)"
    return value, "90% of the best cell mean (no chance level known; set analysis.solve_threshold)"


def time_to_solve_summary(per_trial: pd.DataFrame, cells_order: list[str] | None = None) -> pd.DataFrame:
    """Per cell: seeds solved of n, and the Kaplan-Meier median step to solve (`scipy.stats.ecdf` on
    censored data; NaN when fewer than half the seeds solve)."""
    rows = []
    order = list(dict.fromkeys(per_trial.cell_hash))
    if cells_order:
        order = [h for h in cells_order if h in set(order)] + [h for h in order if h not in set(cells_order)]
    for cell_hash in order:
        group = per_trial[per_trial.cell_hash == cell_hash]
        solved = group[group.solved].step.to_numpy(float)
        censored = group[~group.solved].step.to_numpy(float)
        median = math.nan
        if len(solved):
            sample = stats.CensoredData(uncensored=solved, right=censored)
            sf = stats.ecdf(sample).sf
            below = sf.quantiles[sf.probabilities <= 0.5]
            median = float(below[0]) if len(below) else math.nan
        rows.append(
            {
                "cell": group.cell.iloc[0],
                "cell_hash": cell_hash,
                "solved": int(group.solved.sum()),
                "seeds": len(group),
                "median_step": median,
                "first_step": float(solved.min()) if len(solved) else math.nan,
                "last_step": float(solved.max()) if len(solved) else math.nan,
                "threshold": float(group.threshold.iloc[0]),
                "threshold_source": group.threshold_source.iloc[0] if "threshold_source" in group else "",
            }
        )
    return pd.DataFrame(rows)
