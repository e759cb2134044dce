"""A search study's history (`search:`): the configurations its Optuna searches suggested, in order, with what
Optuna was told of each, and the best so far. Read from the ledger's `search_points` table, not from Optuna."""

from __future__ import annotations

import pandas as pd

from ..store import Ledger

COLUMNS = ["search", "number", "cell", "cell_hash", "state", "value", "seeds", "best_so_far", "best"]


def search_frame(ledger: Ledger, study: str, labels: dict[str, str] | None = None, mode: str = "max") -> pd.DataFrame:
    """One row per suggestion: search (the Optuna study), number (its trial number), cell, state (running,
    complete, failed), value (the seed mean Optuna was told), seeds, each searched path's value, best_so_far
    (the best value up to this suggestion) and best (the search's best suggestion)."""
    rows = []
    for p in ledger.search_points(study):
        row = {
            "search": p.search,
            "number": p.number,
            "cell": (labels or {}).get(p.cell_hash, "") if p.cell_hash else "(invalid)",
            "cell_hash": p.cell_hash,
            "state": p.state,
            "value": p.value,
            "seeds": p.seeds,
        }
        rows.append({**row, **{k: v for k, v in p.params.items() if k not in row}})
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.DataFrame(rows).sort_values(["search", "number"], kind="stable").reset_index(drop=True)
    value = pd.to_numeric(frame["value"], errors="coerce")
    running = value.groupby(frame["search"]).cummax() if mode == "max" else value.groupby(frame["search"]).cummin()
    frame.insert(COLUMNS.index("best_so_far"), "best_so_far", running)
    best = value.groupby(frame["search"]).transform("max" if mode == "max" else "min")
    first_best = (value == best) & ~(value == best).groupby(frame["search"]).cumsum().gt(1)
    frame.insert(COLUMNS.index("best"), "best", first_best.fillna(False).astype(bool))
    return frame


def best_points(frame: pd.DataFrame) -> pd.DataFrame:
    """The best suggestion of each search (the first, if several tie)."""
    return frame[frame["best"]].reset_index(drop=True) if len(frame) else frame
