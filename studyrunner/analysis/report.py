"""`studyrunner report`: one self-contained HTML file per study (no network: images are inline PNGs).

The template is `dashboards/report.html.j2` (Jinja2, autoescaped, so cell labels and claims print as
written). Plots are matplotlib (Agg backend) figures encoded as base64 data URIs.
"""

from __future__ import annotations

import base64
import io
import math
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import StudyrunnerError
from ..tracking.ui_links import run_url, runs_url
from ..urls import mask_url
from .claims import flat as claims_flat
from .data import StudyData
from .summary import (
    EQUAL_DEPTH_COLUMNS,
    FAMILY_COLUMNS,
    GAP_COLUMNS,
    Analysis,
    analyze,
    fmt,
    interval,
    verdict_detail,
    verdict_interval,
)

TEMPLATE = "report.html.j2"
CURVE_METRICS = ("train_loss", "eval_loss")  # plotted per cell when present, with the study metric
DIAGNOSTIC_PREFIXES = ("ponder_steps_mean", "gate_local_mean", "gate_global_mean", "block_cos_mean")


def template_dir() -> Path:
    """dashboards/ beside the package (an editable install, as setup.sh makes), or $STUDYRUNNER_DASHBOARDS."""
    env = os.environ.get("STUDYRUNNER_DASHBOARDS")
    folder = Path(env) if env else Path(__file__).resolve().parents[2] / "dashboards"
    if not (folder / TEMPLATE).is_file():
        raise StudyrunnerError(
            f"report template {TEMPLATE} not found in {folder}; install studyrunner from its repository "
            "(./setup.sh) or set STUDYRUNNER_DASHBOARDS to the repository's dashboards/ folder"
        )
    return folder


# --- plots ----------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    _plt().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _short(label: str, n: int = 28) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def strip_plot(a: Analysis) -> str | None:
    """Every seed of every cell (failures as red crosses), with the mean and its t-interval."""
    d, metric = a.data, a.metric
    if metric not in d.done or d.done[metric].dropna().empty:
        return None
    plt = _plt()
    cells = a.cells
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(cells) + 2), 3.6))
    rng = np.random.default_rng(0)
    for i, row in enumerate(cells.itertuples()):
        seeds = d.done[d.done.cell_hash == row.cell_hash]
        y = seeds[metric].to_numpy(float)
        jitter = rng.uniform(-0.12, 0.12, len(y))
        ok = ~seeds.failed.to_numpy(bool)
        ax.scatter(i + jitter[ok], y[ok], s=22, color="#1f77b4", alpha=0.8, zorder=3)
        ax.scatter(i + jitter[~ok], y[~ok], s=30, color="#d62728", marker="x", zorder=3)
        if np.isfinite(row.mean):
            ax.hlines(row.mean, i - 0.28, i + 0.28, color="black", lw=1.5, zorder=4)
        if np.isfinite(row.t_lo):
            ax.vlines(i + 0.3, row.t_lo, row.t_hi, color="gray", lw=1)
    lines = []
    if np.isfinite(a.chance):
        ax.axhline(a.chance, color="#7f7f7f", ls=":", lw=1.2, label=f"chance {a.chance:.3g}")
        lines.append(True)
    failure = failure_threshold(a)
    if failure is not None:
        ax.axhline(failure, color="#d62728", ls="--", lw=1, label=f"failure threshold {failure:.3g}")
        lines.append(True)
    if np.isfinite(a.threshold):
        ax.axhline(a.threshold, color="#2ca02c", ls="-.", lw=1, label=f"solve threshold {a.threshold:.3g}")
        lines.append(True)
    if lines:
        ax.legend(fontsize=7, loc="best")
    ax.set_xticks(range(len(cells)), [_short(c) for c in cells.cell], rotation=30, ha="right")
    ax.set_ylabel(metric)
    ax.set_title("every seed per cell (× = failed; bar = mean, grey = 95% t-interval)")
    return _png(fig)


def failure_threshold(a: Analysis) -> float | None:
    """The failure rule's threshold on the plotted metric (`metric < x` / `metric > x`), if it has one."""
    rule = a.data.failure_rule
    if rule is None:
        return None
    m = re.search(rf"(?<![\w.]){re.escape(a.metric)}\s*(<=|>=|<|>)\s*(-?[0-9.eE+-]+)", rule.text)
    try:
        return float(m.group(2)) if m else None
    except ValueError:
        return None


def failure_plot(a: Analysis) -> str | None:
    cells = a.cells
    if cells.empty or not (cells.failures > 0).any():
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(cells) + 2), 3.0))
    x = np.arange(len(cells))
    rate = cells.failure_rate.to_numpy(float)
    err = np.vstack([rate - cells.failure_lo.to_numpy(float), cells.failure_hi.to_numpy(float) - rate])
    ax.bar(x, rate, color="#d62728", alpha=0.7, yerr=err, capsize=3)
    ax.set_xticks(x, [_short(c) for c in cells.cell], rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("failure rate")
    ax.set_title("failure rate per cell (95% Wilson intervals)")
    return _png(fig)


def profile_plot(a: Analysis) -> str | None:
    from .stats import performance_profile

    prof = performance_profile(a.data, a.metric)
    if prof.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    for col in prof.columns[1:]:
        ax.step(prof.tau, prof[col], where="post", label=_short(col))
    ax.set_xlabel(f"τ ({a.metric})")
    ax.set_ylabel("fraction of seeds " + ("above τ" if a.data.mode == "max" else "below τ"))
    ax.set_title("performance profiles")
    ax.legend(fontsize=7, loc="best")
    return _png(fig)


def _cell_points(a: Analysis, points: pd.DataFrame) -> pd.DataFrame:
    """Per (cell, D): the mean of the points, its 95% t-interval, and the cell's family (looped/stacked)."""
    from .depth import cell_frame, depth_family
    from .stats import t_interval

    cells = cell_frame(a.data)
    family = depth_family(cells) if len(cells) else pd.Series(dtype=str)
    rows = []
    for (h, depth), g in points.groupby(["cell_hash", "depth"], sort=False):
        lo, hi = t_interval(g.y)
        kind = family.get(h, "")
        rows.append(
            {
                "cell_hash": h,
                "depth": float(depth),
                "mean": float(g.y.mean()),
                "lo": lo,
                "hi": hi,
                "family": "looped" if "looped" in kind and "stacked" not in kind else kind or "other",
            }
        )
    return pd.DataFrame(rows)


FAMILY_STYLE = {  # marker, colour, label
    "looped": ("o", "#1f77b4", "looped cells (loops > 1)"),
    "stacked": ("s", "#ff7f0e", "stacked cells (loops = 1)"),
    "looped,stacked": ("D", "#9467bd", "1-loop start of a looped line"),
    "other": ("^", "#555555", "cells"),
}


def fit_plot(fits, points: pd.DataFrame, metric: str, title: str, a: Analysis | None = None) -> str | None:
    """Cell means with 95% t-intervals (looped and stacked cells marked apart), the fitted curves with
    their bands (`Fit.band`), on a log D axis ticked at the design depths; residuals below."""
    if not fits or points.empty:
        return None
    plt = _plt()
    fig, (ax, res) = plt.subplots(2, 1, figsize=(7.0, 5.4), height_ratios=[3, 1.3], sharex=True)
    ax.scatter(points.depth, points.y, s=8, color="#bbbbbb", alpha=0.8, zorder=2, label="seeds")
    cell_points = _cell_points(a, points) if a is not None else pd.DataFrame()
    for kind, group in cell_points.groupby("family", sort=False) if len(cell_points) else []:
        marker, color, label = FAMILY_STYLE.get(kind, FAMILY_STYLE["other"])
        err = np.vstack([group["mean"] - group.lo, group.hi - group["mean"]])
        err = np.where(np.isfinite(err), err, 0.0)
        ax.errorbar(group.depth, group["mean"], yerr=err, fmt=marker, color=color, ms=6, capsize=3, lw=1,
                    zorder=4, label=f"{label}: mean, 95% t")  # fmt: skip
    grid = np.exp(np.linspace(np.log(points.depth.min()), np.log(points.depth.max()), 80))
    colors = ["#2ca02c", "#d62728", "#8c564b"]
    for f, color in zip(fits, colors, strict=False):
        flag = f" [{'; '.join(f.flags)}]" if f.flags else ""
        style = "--" if f.flags else "-"
        ax.plot(grid, f.predict(grid), color=color, ls=style, label=f"{f.form} (R²={f.r2:.3f}, BIC={f.bic:.1f}){flag}")
        lo, hi = f.band(grid)
        if np.isfinite(lo).any():
            ax.fill_between(grid, lo, hi, color=color, alpha=0.15, label=f"{f.form} 95% band ({f.ci_method})")
        res.scatter(f.x, f.residuals, s=12, color=color, alpha=0.8)
    res.axhline(0, color="gray", lw=0.8)
    ax.set_xscale("log")
    ticks = sorted(set(np.round(points.depth.to_numpy(float), 6)))
    if len(ticks) > 12:  # measured depths (halting): a few of them
        ticks = list(np.unique(np.quantile(ticks, np.linspace(0, 1, 8))))
    for axis in (ax, res):
        axis.set_xticks(ticks, [f"{t:g}" for t in ticks])
        axis.minorticks_off()
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=6.5, loc="best")
    res.set_xlabel("effective depth D (log scale, ticks at the design depths)")
    res.set_ylabel("residual")
    return _png(fig)


def curve_plots(a: Analysis) -> list[dict]:
    """One axis per metric (training loss, eval loss, the study metric, ponder steps / gates where logged)
    with every cell overlaid: the mean over its seeds as a line, each seed faint in the same colour."""
    curves = a.data.curves
    if curves.empty:
        return []
    plt = _plt()
    done = a.data.done
    keys = done.set_index("trial_key")
    curves = curves[curves.trial_key.isin(keys.index)]
    diag = [c for c in curves.columns if c in DIAGNOSTIC_PREFIXES and curves[c].notna().any()]
    panels = [m for m in (*CURVE_METRICS, a.metric) if m in curves and curves[m].notna().any()]
    panels = list(dict.fromkeys(panels + diag))
    if not panels:
        return []
    cells = [
        r for r in a.cells.itertuples() if curves.trial_key.isin(done.trial_key[done.cell_hash == r.cell_hash]).any()
    ]
    cmap = plt.get_cmap("tab10" if len(cells) <= 10 else "tab20")
    out = []
    for m in panels:
        fig, ax = plt.subplots(figsize=(7.0, 3.6))
        for i, row in enumerate(cells):
            color = cmap(i % cmap.N)
            cell_curves = curves[curves.trial_key.isin(done.trial_key[done.cell_hash == row.cell_hash])]
            cell_curves = cell_curves.dropna(subset=[m])
            if cell_curves.empty:
                continue
            for key, c in cell_curves.groupby("trial_key"):
                failed = bool(keys.loc[key, "failed"])
                ax.plot(c.step, c[m], lw=0.7, alpha=0.3, color=color, ls=":" if failed else "-")
            mean = cell_curves.groupby("step")[m].mean()
            ax.plot(mean.index, mean.to_numpy(), lw=1.6, color=color, label=_short(row.cell, 36))
        ax.set_title(f"{m}: mean over seeds per cell (faint: each seed; dotted: failed seeds)", fontsize=8)
        ax.set_xlabel("step")
        ax.set_ylabel(m)
        ax.legend(fontsize=6.5, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        out.append({"metric": m, "img": _png(fig)})
    return out


# --- the page -------------------------------------------------------------------------------------


def _wraps(value) -> bool:
    """A long text cell (a cell label, an interval method), wrapped in tables; numbers and intervals are not."""
    return isinstance(value, str) and len(value) > 16 and re.search(r"[A-Za-df-z_]", value) is not None


def _table(df: pd.DataFrame, columns: dict[str, str]) -> dict:
    """{"head": [...], "rows": [[...]]} with numbers formatted; `columns`: source -> header."""
    cols = [c for c in columns if c in df.columns]
    return {
        "head": [columns[c] for c in cols],
        "rows": [[fmt(row[c]) for c in cols] for _, row in df.iterrows()],
    }


def _cells_table(a: Analysis) -> dict:
    c = a.cells
    head = [
        "cell", "baseline", "D", "n", "mean ± sd", "95% t", "95% BCa (10+ seeds)", "median", "IQM [95% Yuen]",
        "min", "max", "failed", "failure rate [Wilson 95%]", "mean | success", "bimodal", "missing",
    ]  # fmt: skip
    rows = []
    for r in c.itertuples():
        rows.append(
            [
                r.cell,
                r.baseline.replace(",", ", "),
                fmt(r.depth, 3),
                str(r.n),
                f"{fmt(r.mean)} ± {fmt(r.sd, 2)}" if r.n else "",
                interval(r.t_lo, r.t_hi),
                interval(r.bca_lo, r.bca_hi),
                fmt(r.median),
                f"{fmt(r.iqm)} {interval(r.iqm_lo, r.iqm_hi)}" if r.n else "",
                fmt(r.min),
                fmt(r.max),
                f"{r.failures}/{r.seeds_done}",
                f"{fmt(r.failure_rate, 2)} {interval(r.failure_lo, r.failure_hi, 2)}" if r.seeds_done else "",
                fmt(r.mean_success),
                "bimodal" if r.bimodal else "",
                str(r.missing) if r.missing else "",
            ]
        )
    return {"head": head, "rows": rows}


def _trials_table(a: Analysis, ui: str | None) -> dict:
    d = a.data
    rows = []
    for r in d.trials.itertuples():
        run = getattr(r, "mlflow_run_id", None)
        link = run_url(ui, d.experiment_id, run) if run and d.experiment_id else None
        value = getattr(r, a.metric, math.nan) if a.metric in d.trials else math.nan
        failed = "failed" if r.failed else ""
        row = {"key": r.trial_key, "cell": r.cell, "seed": r.seed, "status": r.status, "failed": failed}
        rows.append({**row, "value": fmt(value), "run": run or "", "link": link})
    return {"rows": rows}


FIT_TABLE_COLUMNS = {
    "form": "form", "n": "n", "alpha": "α", "alpha_lo": "α lo", "alpha_hi": "α hi", "beta": "β",
    "c": "c", "k": "k", "m": "m", "E": "E", "A": "A", "gamma": "γ", "gamma_lo": "γ lo", "gamma_hi": "γ hi",
    "top": "top", "top_lo": "top lo", "top_hi": "top hi",
    "r2": "R²", "rmse": "RMSE", "aic": "AIC", "bic": "BIC", "extrapolation_error": "leave-largest-D-out error",
    "ci": "interval", "flags": "flags", "depth": "D from",
}  # fmt: skip
GROUP_TABLE_COLUMNS = {
    "n": "n", "alpha": "α", "alpha_lo": "α lo", "alpha_hi": "α hi", "r2": "R²", "ref": "ref",
    "ratio": "α / α_ref", "ratio_lo": "lo", "ratio_hi": "hi", "ci": "interval", "flags": "flags",
}  # fmt: skip
PAIRED_TABLE_COLUMNS = {
    "cell_a": "a", "cell_b": "b", "differs_in": "differs in", "pairs": "shared seeds", "diff_b_minus_a": "b − a",
    "t_lo": "t lo", "t_hi": "t hi", "boot_lo": "BCa lo (10+ pairs)", "boot_hi": "BCa hi (10+ pairs)",
    "p_b_better": "P(b better)",
}  # fmt: skip
SOLVE_TABLE_COLUMNS = {
    "cell": "cell", "solved": "solved", "seeds": "seeds", "median_step": "median step (Kaplan-Meier)",
    "first_step": "first", "last_step": "last", "threshold": "threshold",
}  # fmt: skip


def render(a: Analysis, ui: str | None = None) -> str:
    """The report as one HTML string."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(template_dir()), autoescape=select_autoescape(["html", "j2"]))
    env.tests["wraps"] = _wraps
    d = a.data
    context = {
        "study": d.name,
        "header": a.header(),
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "source": mask_url(d.source),  # "ledger URL": uploaded to MLflow with the report
        "metric": a.metric,
        "mode": d.mode,
        "missing": d.missing,
        "claims": _claim_rows(a),
        "claims_level": _claims_level(a.verdicts),
        "cells": _cells_table(a),
        "threshold": fmt(a.threshold) if np.isfinite(a.threshold) else "",
        "threshold_source": a.threshold_source,
        "chance": fmt(a.chance, 3) if np.isfinite(a.chance) else "",
        "chance_source": a.chance_source,
        "failure_depth": a.failure_depth,
        "trials": _trials_table(a, ui),
        "runs_url": runs_url(ui, d.experiment_id) if d.experiment_id else None,
        **_figures(a),
        **_analysis_tables(a),
    }
    return env.get_template(TEMPLATE).render(**context)


def _claim_rows(a: Analysis) -> list[dict]:
    """Each claim as the report shows it: verdict, both sides, interval, detail and its threats."""
    return [
        {
            **v.row(),
            "difference": fmt(v.lhs - v.rhs if v.scale else v.estimate),
            "verdict": v.shown_verdict,
            "interval": " ".join(
                filter(None, [verdict_interval(v), f"({v.interval_label})" if v.interval_label else ""])
            ),
            "p": fmt(v.p),
            "detail": verdict_detail(v),
            "lhs": fmt(v.lhs),
            "rhs": fmt(v.rhs),
            "threats": [t.to_dict() for t in found],
        }
        for v, found in zip(a.verdicts, a.threats or [[] for _ in a.verdicts], strict=True)
    ]


def _figures(a: Analysis) -> dict:
    from .fits import scaling_points

    d = a.data
    return {
        "strip": strip_plot(a),
        "failures": failure_plot(a),
        "profile": profile_plot(a),
        "fit_img": fit_plot(a.fits, scaling_points(d, a.metric), a.metric, f"{a.metric} vs effective depth", a),
        "loops_img": fit_plot(
            a.loops_fits, scaling_points(d, a.metric, source="loops"), a.metric, "test-time depth (eval.loops)", a
        ),
        "curves": curve_plots(a),
    }


def _analysis_tables(a: Analysis) -> dict:
    """The fit and comparison tables, None where the study has no rows for one."""
    group_columns = {a.group_by or "": a.group_by or "", **GROUP_TABLE_COLUMNS}
    return {
        "families": _table(a.families, FAMILY_COLUMNS) if len(a.families) else None,
        "equal_depth": _table(a.equal_depth, EQUAL_DEPTH_COLUMNS) if len(a.equal_depth) else None,
        "fits": _table(a.fit_table, FIT_TABLE_COLUMNS) if len(a.fits) else None,
        "groups": _table(a.groups, group_columns) if len(a.groups) else None,
        "gap": _table(a.gap, GAP_COLUMNS) if len(a.gap) else None,
        "paired": _table(a.paired, PAIRED_TABLE_COLUMNS) if len(a.paired) else None,
        "tts": _table(a.time_to_solve_cells, SOLVE_TABLE_COLUMNS) if len(a.time_to_solve_cells) else None,
    }


def write_report(
    data: StudyData | Analysis, out_dir: str | Path, ui: str | None = None, tables: bool = True
) -> list[Path]:
    """Write `<study>-report.html` (and, with `tables`, the cell / fit / claim tables as CSV) into
    `out_dir`; returns the paths written, the HTML first."""
    a = data if isinstance(data, Analysis) else analyze(data)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        html = out / f"{a.data.name}-report.html"
        html.write_text(render(a, ui), encoding="utf-8")
        written = [html]
        if tables:
            for name, df in (("cells", a.cells), ("fits", a.fit_table), ("fit_groups", a.groups),
                             ("claims", claims_flat(a.claims_table)), ("percent_gap", a.gap), ("families", a.families),
                             ("equal_depth", a.equal_depth)):  # fmt: skip
                if len(df):
                    path = out / f"{a.data.name}-{name}.csv"
                    df.to_csv(path, index=False)
                    written.append(path)
    except OSError as exc:
        raise StudyrunnerError(f"--out: cannot write the report into {str(out)!r}: {exc.strerror or exc}") from None
    return written


def _claims_level(verdicts) -> str:
    """The claims' interval column's heading: their one label ("fixed 90%") when they share it, else "each
    claim's" (fixed and repeated-confidence intervals side by side; each cell names its own)."""
    labels = {v.interval_label for v in verdicts if v.interval_label}
    return labels.pop() if len(labels) == 1 else ("fixed 90%" if not labels else "each claim's")
