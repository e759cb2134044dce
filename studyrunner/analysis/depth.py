"""Looped vs stacked: what a looped-transformer study compares at equal effective depth.

Cells at the same D differ in two axes (1⊗4 vs 4⊗1, 2⊗2 vs 4⊗1), so the one-axis paired comparisons of
`stats` skip them; here they are paired (looped − other over shared seeds), looped lines and stacked
cells are fitted as separate families, and seed 002's %Gap puts a looped cell between its iso-param and
iso-FLOP baselines.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from . import fits
from .data import StudyData
from .stats import CONFIDENCE, SEED, probability_of_improvement, seed_difference

LOOPS = "model.params.loops"
BLOCK_LAYERS = "model.params.block_layers"


def gap_interval(looped: pd.Series, other: pd.Series, mode: str = "max", confidence: float = CONFIDENCE) -> dict:
    """looped − other (Series indexed by seed) by `stats.seed_difference` (paired t over 2+ shared seeds,
    else Welch), with the probability that looped is the better one."""
    looped, other = looped.dropna(), other.dropna()
    sign = 1 if mode == "max" else -1
    p_better = probability_of_improvement(sign * looped, sign * other)
    res = seed_difference(looped, other, confidence)
    if res is None:
        diff = float(looped.mean() - other.mean()) if len(looped) and len(other) else math.nan
        method = f"Welch t ({len(looped)} vs {len(other)} seeds)"  # too few seeds a side: no interval
        return {"diff": diff, "lo": math.nan, "hi": math.nan, "method": method, "p_looped_better": p_better}
    return {**{k: res[k] for k in ("diff", "lo", "hi", "method")}, "p_looped_better": p_better}


def cell_frame(data: StudyData) -> pd.DataFrame:
    """One row per finished cell: its config, `D` (nominal effective depth: the median over its seeds of
    the model's k·L, before any halting fraction), loops and block_layers (NaN without them)."""
    done = data.done
    if done.empty:
        return pd.DataFrame()
    cells = done.drop_duplicates("cell_hash").set_index("cell_hash")
    source = "effective_depth" if "effective_depth" in done else "depth"
    cells["D"] = done.groupby("cell_hash")[source].median().reindex(cells.index)
    cells["D"] = cells["D"].fillna(done.groupby("cell_hash")["depth"].median().reindex(cells.index))
    for col in (LOOPS, BLOCK_LAYERS):
        cells[col] = pd.to_numeric(cells[col], errors="coerce") if col in cells else math.nan
    order = [h for h in data.cells_order if h in cells.index]
    return cells.loc[order + [h for h in cells.index if h not in order]]


def equal_depth_comparisons(data: StudyData, metric: str | None = None) -> pd.DataFrame:
    """Looped vs stacked at equal effective depth: every looped cell (loops > 1) against each unlooped
    cell (loops = 1) of the same D whose other axes match (1⊗4 vs 4⊗1, 2⊗2 vs 4⊗1), and against its
    iso-param / iso-FLOP baselines (`baseline_of`). `diff` = looped − other in metric units, with a
    paired t-interval over shared seeds (Welch when fewer than two are shared)."""
    metric = metric or data.metric
    cells = cell_frame(data)
    if cells.empty or metric not in data.done or cells[LOOPS].isna().all():
        return pd.DataFrame()
    done = data.done
    other_axes = [c for c in data.varied_columns if c not in (LOOPS, BLOCK_LAYERS)]
    looped = cells[cells[LOOPS] > 1]
    stacked = cells[cells[LOOPS] == 1]

    def values(h):
        return done[done.cell_hash == h].set_index("seed")[metric]

    rows = []
    for h1, a in looped.iterrows():
        kinds: dict[str, list[str]] = {}  # other cell -> how it relates to the looped one
        for h2, b in stacked.iterrows():
            same_depth = np.isfinite(a.D) and np.isfinite(b.D) and math.isclose(a.D, b.D, rel_tol=1e-6)
            if same_depth and all(str(a[c]) == str(b[c]) for c in other_axes if not str(b.baseline)):
                kind = "stacked, same D"
                if np.isfinite(a[BLOCK_LAYERS]) and np.isfinite(b[BLOCK_LAYERS]):
                    kind = f"{int(a[BLOCK_LAYERS])}⊗{int(a[LOOPS])} vs {int(b[BLOCK_LAYERS])}⊗1"
                kinds.setdefault(h2, []).append(kind)
        for h2, b in cells.iterrows():
            for part in str(b.get("baseline_of") or "").split(","):
                kind, _, target = part.partition(":")
                if target == h1:
                    kinds.setdefault(h2, []).append(kind.replace("_", "-"))
        for h2, labels in kinds.items():
            b = cells.loc[h2]
            res = gap_interval(values(h1), values(h2), data.mode)
            rows.append(
                {
                    "D": float(a.D),
                    "looped": a.cell,
                    "other": b.cell,
                    "other_D": float(b.D),
                    "kind": ", ".join(dict.fromkeys(labels)),
                    "looped_mean": float(values(h1).mean()),
                    "other_mean": float(values(h2).mean()),
                    "diff": res["diff"],
                    "lo": res["lo"],
                    "hi": res["hi"],
                    "method": res["method"],
                    "p_looped_better": res["p_looped_better"],
                }
            )
    return pd.DataFrame(rows)


def depth_family(cells: pd.DataFrame) -> pd.Series:
    """Per cell (cell_frame rows): "looped" for the looped lines (loops > 1, plus the loops = 1 cell a
    line starts from: a block_layers value whose loops vary), "stacked" for every loops = 1 cell
    (iso-param / iso-FLOP baselines included), "looped,stacked" for a cell on both; "" without loops."""

    def family(row) -> str:
        if not np.isfinite(row[LOOPS]):
            return ""
        same_block = cells[cells[BLOCK_LAYERS] == row[BLOCK_LAYERS]]
        kinds = []
        if row[LOOPS] > 1 or (same_block[LOOPS] > 1).any():
            kinds.append("looped")
        if row[LOOPS] == 1:
            kinds.append("stacked")
        return ",".join(kinds)

    return cells.apply(family, axis=1) if len(cells) else pd.Series(dtype=str)


def percent_gap(
    data: StudyData, metric: str | None = None, ci: str | None = None, n_boot: int = fits.N_BOOT
) -> pd.DataFrame:
    """Seed 002's %Gap for every looped cell with iso-param and iso-FLOP baselines:
    100 · (looped − iso_param) / (iso_flop − iso_param), on cell means. Interval: the delta method with
    Welch-Satterthwaite degrees of freedom (every cell needs 2+ seeds), or with `ci="bootstrap"` the
    percentiles of independent resamples of each cell's seeds (at 2 seeds a cell these hardly vary)."""
    metric = metric or data.metric
    done = data.done
    if metric not in done or "baseline_of" not in done:
        return pd.DataFrame()
    by_kind: dict[str, dict[str, str]] = {}
    for _, row in done.drop_duplicates("cell_hash").iterrows():
        for part in str(row.baseline_of or "").split(","):
            if ":" in part:
                kind, looped = part.split(":", 1)
                by_kind.setdefault(looped, {})[kind] = row.cell_hash
    rows = []
    for looped, kinds in by_kind.items():
        if "iso_param" not in kinds or "iso_flop" not in kinds:
            continue
        vals = [
            done.loc[done.cell_hash == h, metric].dropna().to_numpy(float)
            for h in (looped, *[kinds[k] for k in ("iso_param", "iso_flop")])
        ]
        if any(not len(v) for v in vals):
            continue
        loop, param, flop = (v.mean() for v in vals)
        gap = 100 * (loop - param) / (flop - param) if flop != param else math.nan
        if (ci or fits.DEFAULT_CI) == "bootstrap":
            lo, hi = _gap_bootstrap(vals, n_boot)
            method = "bootstrap"
        else:
            lo, hi = _gap_delta(vals)
            method = "delta, Welch df"
        label = done.loc[done.cell_hash == looped, "cell"]
        rows.append(
            {
                "cell": label.iloc[0] if len(label) else looped,
                "looped": loop,
                "iso_param": param,
                "iso_flop": flop,
                "gap_pct": gap,
                "gap_lo": float(lo),
                "gap_hi": float(hi),
                "ci": method,
            }
        )
    return pd.DataFrame(rows)


def _gap_delta(vals: list[np.ndarray]) -> tuple[float, float]:
    if any(len(v) < 2 for v in vals):
        return math.nan, math.nan
    loop, param, flop = (v.mean() for v in vals)
    span = flop - param
    if span == 0:
        return math.nan, math.nan
    grad = 100 * np.array([1 / span, (loop - flop) / span**2, -(loop - param) / span**2])
    parts = np.array([g**2 * v.var(ddof=1) / len(v) for g, v in zip(grad, vals, strict=True)])
    if parts.sum() == 0:
        gap = 100 * (loop - param) / span
        return gap, gap
    df = parts.sum() ** 2 / sum(p**2 / (len(v) - 1) for p, v in zip(parts, vals, strict=True))
    gap, half = 100 * (loop - param) / span, stats.t.ppf(0.5 + CONFIDENCE / 2, df) * math.sqrt(parts.sum())
    return gap - half, gap + half


def _gap_bootstrap(vals: list[np.ndarray], n_boot: int) -> tuple[float, float]:
    rng = np.random.default_rng(SEED)
    draws = []
    if n_boot and any(len(v) > 1 for v in vals):
        for _ in range(n_boot):
            lp, pp, fp = (v[rng.integers(0, len(v), len(v))].mean() for v in vals)
            if fp != pp:
                draws.append(100 * (lp - pp) / (fp - pp))
    return tuple(np.quantile(draws, [0.025, 0.975])) if draws else (math.nan, math.nan)


def family_fits(data: StudyData, points: pd.DataFrame, gap: pd.DataFrame, ci: str | None = None) -> pd.DataFrame:
    """Log-linear fits of the metric against D per family of cells: the looped lines (loops > 1 and the
    loops = 1 cells they start from) and the stacked cells (loops = 1), as separate lines, with the slope
    ratio α_looped / α_stacked; the looped row carries the mean %Gap of its cells with baselines."""
    cells = cell_frame(data)
    if cells.empty or points.empty or cells[LOOPS].isna().all():
        return pd.DataFrame()
    family = depth_family(cells)
    parts = []
    for kind in ("stacked", "looped"):
        members = family.index[family.str.split(",").map(lambda kinds, kind=kind: kind in kinds)]
        part = points[points.cell_hash.isin(members)]
        if part.depth.nunique() >= 2:
            parts.append(part.assign(family=kind))
    if len(parts) < 1:
        return pd.DataFrame()
    table = fits.fit_groups(pd.concat(parts, ignore_index=True), "family", ref="stacked", ci=ci)
    if table.empty:
        return table
    table["cells"] = [
        int(family.str.split(",").map(lambda kinds, kind=kind: kind in kinds).sum()) for kind in table.family
    ]
    table["gap_pct"] = [
        float(gap.gap_pct.mean()) if kind == "looped" and len(gap) else math.nan for kind in table.family
    ]
    table["gap_cells"] = [len(gap) if kind == "looped" else 0 for kind in table.family]
    return table
