"""What a claim's evidence is: the trials each side selects, one value per seed, the seeds counted, and
whether a t-test describes those seeds at all.

The seed is the unit of replication (the same seed is the same initialisation and data stream in every
cell), so a side spanning several cells is reduced to one value per seed (`by_seed`) before any test of
means, IQMs or medians. The checks at the end choose between a t-test and an exact one: seeds the failure
rule splits or a bimodal cell (`why_irregular`), values tied at a bound (`tied`), no spread (`no_spread`),
and a metric that does not depend on the seed at all (`deterministic`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...errors import StudyrunnerError
from ...study.claims_grammar import Quantity
from ..data import StudyData
from ..stats import BIMODAL_GAP, VERIFY_SEPARATION, bimodality, iqm, metric_scale
from .verdict import InvalidClaim

BIMODAL_FROM = 5  # seeds a cell needs before `why_irregular` reads it as bimodal (the sign-flip's p reaches 1/32)


def side_rows(data: StudyData, q: Quantity) -> pd.DataFrame:
    """The finished trials side `q` selects; InvalidClaim where it selects none or none reported its metric."""
    try:
        rows = data.select(q.selector)
    except StudyrunnerError as exc:
        raise InvalidClaim(str(exc)) from None
    if rows.empty:
        what = ", ".join(f"{k}={v}" for k, v in q.selector) or "the study"
        raise InvalidClaim(f"no finished trial matches [{what}]")
    if q.metric and q.kind != "slope" and q.metric not in rows:
        raise InvalidClaim(f"no trial reported {q.metric!r}")
    return rows


def values_by_cell(rows: pd.DataFrame, metric: str) -> list[np.ndarray]:
    return [g[metric].dropna().to_numpy(float) for _, g in rows.groupby("cell_hash", sort=False)]


def by_seed(rows: pd.DataFrame, metric: str) -> pd.Series:
    """One value per seed: the seed's value, or over a side of several cells the mean of the seed's cells
    (the same seed is the same initialisation and data stream in every cell, so the seed, not the trial,
    is the unit of replication). Seeds without a finite value are left out."""
    values = pd.to_numeric(rows[metric], errors="coerce").astype(float)
    ok = np.isfinite(values.to_numpy())
    return values[ok].groupby(rows.loc[ok, "seed"].to_numpy()).mean().sort_index()


def statistic(kind: str, values) -> float:
    values = np.asarray(values, dtype=float)
    if not len(values):
        return math.nan
    return float(STATISTICS[kind](values))


STATISTICS = {"mean": np.mean, "median": np.median, "iqm": iqm}


def count_unfinished(data: StudyData, q: Quantity) -> int:
    """Trials `q` selects that have not finished (pending or running)."""
    try:
        rows = data.select(q.selector, frame=data.trials)
    except StudyrunnerError as exc:
        raise InvalidClaim(str(exc)) from None
    return int((~rows.index.isin(data.done.index)).sum())


def _metric_values(data: StudyData, q: Quantity) -> pd.Series:
    rows = data.select(q.selector)
    if q.metric is None or q.metric not in rows:
        return pd.Series(dtype=float)
    return pd.to_numeric(rows[q.metric], errors="coerce").astype(float)


def seeds_used(data: StudyData, q: Quantity) -> int:
    """How many seeds a side's evidence rests on: finished trials for a failure rate, else the distinct
    seeds with a finite value of the metric."""
    if q.kind == "failure_rate":
        return len(data.select(q.selector))
    values = _metric_values(data, q)
    return int(data.select(q.selector).loc[np.isfinite(values).to_numpy(), "seed"].nunique())


def seeds_dropped(data: StudyData, q: Quantity) -> int:
    values = _metric_values(data, q)
    return int((~np.isfinite(values)).sum())


def why_irregular(data: StudyData, parts: list[tuple[pd.DataFrame, str]]) -> str:
    """Why no t-test describes the seeds a claim rests on ("" when one does): the trials of its cells are
    split by failure (status or the `failure:` rule: some failed, some did not), or a cell's seeds are
    bimodal (`stats.bimodality`: two clusters far apart for their spread), judged only in cells of
    BIMODAL_FROM (5) seeds or more. Below 5 the switch cannot help and does harm: at 3 seeds it fired on normal
    seeds (two of three close by chance look like a cluster) and swapped the paired t for a sign-flip test whose
    smallest p is 0.125 (0.0625 at 4), which cannot decide anything at 0.05 (benchmarks/bimodality.py). What
    holds the level on bimodal seeds below 5 is elsewhere: comparisons of cells hold it with the t-test (no
    effect: both cells' seeds come from one mixture), a mean against a number needs the distribution-free gate
    (`bounded`), and a `failure:` rule (the split, at any count) sends seeds to the exact tests. The split is
    read off all the claim's trials together, which the randomisation tests leave unchanged, so those tests
    stay exact given that they were chosen. Ties at a bound are `tied`'s."""
    rows = pd.concat([r for r, _ in parts])
    failed = rows.failed.astype(bool)
    if failed.any() and not failed.all():
        return f"the failure rule splits these seeds ({int(failed.sum())} of {len(rows)} trials failed)"
    for r, metric in parts:
        if metric is None or metric not in r:
            continue
        scale = metric_scale(data, metric) or 0.0
        for _, cell in r.groupby("cell_hash", sort=False):
            if cell[metric].notna().sum() < BIMODAL_FROM:
                continue
            if bimodality(cell[metric], scale, BIMODAL_GAP * scale, VERIFY_SEPARATION)[0]:
                return f"cell {cell.cell.iloc[0]} is bimodal (its seeds form two clusters)"
    return ""


def deterministic(parts: list[tuple[pd.DataFrame, str]]) -> bool:
    """Every cell of the claim has 2+ seeds and they all give the same value, not 0 or 1: the metric does
    not depend on the seed (a cache size, a parameter count), so the difference is exact, not estimated.
    Seeds tied at 0 or 1 are a share at its floor or ceiling (accuracies), not a fact: `tied`'s."""
    for rows, metric in parts:
        if metric is None or metric not in rows:
            return False
        for _, cell in rows.groupby("cell_hash", sort=False):
            x = pd.to_numeric(cell[metric], errors="coerce").to_numpy(float)
            if len(x) < 2 or not np.all(np.isfinite(x)) or np.ptp(x) != 0 or x[0] in (0.0, 1.0):
                return False
    return True


def tied(*values) -> str:
    """Two or more of the test's values (one per seed and side, pooled) tie at the largest or the smallest,
    as accuracies at a ceiling of 1 do: a t-test on such values degenerates (a zero spread gives p = 0), so
    a randomisation test decides (`why_irregular`'s reasons come first)."""
    pooled = np.concatenate([np.asarray(v, dtype=float) for v in values]) if values else np.empty(0)
    pooled = pooled[np.isfinite(pooled)]
    for end in (pooled.max(), pooled.min()) if len(pooled) > 1 else ():
        ties = int((pooled == end).sum())
        if ties >= 2:
            return f"{ties} values tie at {end:g} (a bound, such as an accuracy of 1)"
    return ""


def no_spread(se: float, *values) -> bool:
    """The t-test's standard error is zero, or float noise next to the values' scale."""
    scale = max([float(np.max(np.abs(v))) for v in values if len(v)] + [1e-300])
    return bool(np.isfinite(se) and se <= 1e-12 * scale)
