"""A search study's history (`search:`): the configurations its Optuna searches suggested, in order, each with its
value, and the best so far. Read from the ledger (its `search_points` and trials), not from Optuna.

A configuration's value is the mean of the study's metric over its seeds that finished with a finite value of it
(succeeded and diverged ones; `seed_mean`), computed from the ledger's current trials: a seed `rerun` later, or a
seed added to `seeds:`, counts. Optuna was told the mean once, when the configuration's seeds first finished, and
its trials cannot change after that; `told_state`, `told_value` and `told_seeds` say what it was told (what its
sampler learns from), `state`, `value` and `seeds` what the ledger holds now.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

from ..store import Ledger
from ..store.status import FINISHED, TrialStatus

COLUMNS = [
    "search",
    "number",
    "cell",
    "cell_hash",
    "state",
    "value",
    "seeds",
    "told_state",
    "told_value",
    "told_seeds",
    "best_so_far",
    "best",
]
# a diverged seed keeps its metrics, as everywhere in studyrunner
SCORED = (TrialStatus.SUCCEEDED, TrialStatus.DIVERGED)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def seed_mean(outcomes: Iterable[tuple[str, Any]]) -> tuple[float | None, int]:
    """A configuration's value from its seeds' (status, metric value): the mean over the seeds that succeeded or
    diverged with a finite value, and how many those are; (None, 0) when none did."""
    values = [float(v) for status, v in outcomes if status in SCORED and _finite(v)]
    return (sum(values) / len(values) if values else None), len(values)


def current_outcome(
    state: str, value: float | None, seeds: int | None, outcomes: list[tuple[str, Any]]
) -> tuple[str, float | None, int | None]:
    """A suggestion's (state, value, seeds) from its cell's trials as the ledger has them now (`outcomes`: a
    (status, metric value) per seed): `complete` with the seed mean once every seed finished and one has a value,
    `failed` when none has, `running` while a seed has not finished (the mean of those that have). A suggestion
    without trials (values that make no valid config, one abandoned) keeps its recorded (state, value, seeds)."""
    if not outcomes:
        return state, value, seeds
    mean, n = seed_mean(outcomes)
    if any(status not in FINISHED for status, _ in outcomes):
        return "running", mean, n
    return ("complete" if mean is not None else "failed"), mean, n


def search_frame(
    ledger: Ledger,
    study: str,
    labels: dict[str, str] | None = None,
    mode: str = "max",
    trials: pd.DataFrame | None = None,
    metric: str | None = None,
) -> pd.DataFrame:
    """One row per suggestion: search (the Optuna study), number (its trial number), cell, state (running,
    complete, failed; abandoned: never run), value and seeds (the seed mean of `metric` over `trials`, the
    study's trial frame, as `current_outcome` gives it), told_state, told_value, told_seeds (what Optuna was
    told), each searched path's value, best_so_far (the best complete value up to this suggestion) and best
    (the search's best complete suggestion). Without `trials`, what Optuna was told."""
    by_cell: dict[str, list[tuple[str, Any]]] = {}
    if trials is not None and metric is not None and len(trials):
        values = trials[metric] if metric in trials else pd.Series(None, index=trials.index, dtype=float)
        for cell_hash, status, value in zip(trials.cell_hash, trials.status, values, strict=True):
            by_cell.setdefault(cell_hash, []).append((status, value))
    rows = []
    for p in ledger.search_points(study):
        state, value, seeds = current_outcome(p.state, p.value, p.seeds, by_cell.get(p.cell_hash, []))
        row = {
            "search": p.search,
            "number": p.number,
            "cell": (labels or {}).get(p.cell_hash, "") if p.cell_hash else "(invalid)",
            "cell_hash": p.cell_hash,
            "state": state,
            "value": value,
            "seeds": seeds,
            "told_state": p.state,
            "told_value": p.value,
            "told_seeds": p.seeds,
        }
        rows.append({**row, **{k: v for k, v in p.params.items() if k not in row}})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.DataFrame(rows).sort_values(["search", "number"], kind="stable").reset_index(drop=True)
    value = pd.to_numeric(frame["value"], errors="coerce").where(frame["state"] == "complete")
    by_search = value.groupby(frame["search"])
    running = by_search.cummax() if mode == "max" else by_search.cummin()
    frame.insert(COLUMNS.index("best_so_far"), "best_so_far", running)
    best = by_search.transform("max" if mode == "max" else "min")
    first_best = (value == best) & ~(value == best).groupby(frame["search"]).cumsum().gt(1)
    frame.insert(COLUMNS.index("best"), "best", first_best.fillna(False).astype(bool))
    return frame


def best_points(frame: pd.DataFrame) -> pd.DataFrame:
    """The best suggestion of each search (the first, if several tie)."""
    return frame[frame["best"]].reset_index(drop=True) if len(frame) else frame
