"""`studyrunner report`: one self-contained HTML file per study (no network: images are inline PNGs).

The template is `dashboards/report.html.j2` (Jinja2, autoescaped, so cell labels and claims print as
written). Plots are matplotlib (Agg backend) figures encoded as base64 data URIs.
"""

from __future__ import annotations

import base64
import io
import math
import os
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import StudyrunnerError
from .data import StudyData
from .mlflow_ui import run_url, runs_url
from .summary import GAP_COLUMNS, Analysis, analyze, fmt, interval

TEMPLATE = "report.html.j2"
CURVE_METRICS = ("train_loss", "eval_loss")  # plotted per cell when present, with the study metric
DIAGNOSTIC_PREFIXES = ("ponder_steps_mean", "gate_local_mean", "gate_global_mean", "block_cos_mean")
MAX_CURVE_CELLS = 24  # training-curve panels (the rest are listed)


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
    ax.set_xticks(range(len(cells)), [_short(c) for c in cells.cell], rotation=30, ha="right")
    ax.set_ylabel(metric)
    ax.set_title("every seed per cell (× = failed; bar = mean, grey = 95% t-interval)")
    return _png(fig)


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


def fit_plot(fits, points: pd.DataFrame, metric: str, title: str) -> str | None:
    if not fits or points.empty:
        return None
    plt = _plt()
    fig, (ax, res) = plt.subplots(2, 1, figsize=(6.4, 5.0), height_ratios=[3, 1.3], sharex=True)
    ax.scatter(points.depth, points.y, s=16, color="black", alpha=0.7, zorder=3, label="seeds")
    grid = np.exp(np.linspace(np.log(points.depth.min()), np.log(points.depth.max()), 80))
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c"]
    for f, color in zip(fits, colors, strict=False):
        ax.plot(grid, f.predict(grid), color=color, label=f"{f.form} (R²={f.r2:.3f}, BIC={f.bic:.1f})")
        lo, hi = f.band(grid)
        if np.isfinite(lo).any():
            ax.fill_between(grid, lo, hi, color=color, alpha=0.15)
        res.scatter(f.x, f.residuals, s=12, color=color, alpha=0.8)
    res.axhline(0, color="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=7)
    res.set_xlabel("effective depth D (log scale)")
    res.set_ylabel("residual")
    return _png(fig)


def curve_plots(a: Analysis) -> list[dict]:
    """Per cell: training loss, the study metric, and ponder steps / gates where the family logs them."""
    curves = a.data.curves
    if curves.empty:
        return []
    plt = _plt()
    done = a.data.done.set_index("trial_key")
    out = []
    for row in a.cells.head(MAX_CURVE_CELLS).itertuples():
        keys = done.index[done.cell_hash == row.cell_hash]
        cell_curves = curves[curves.trial_key.isin(keys)]
        if cell_curves.empty:
            continue
        diag = [c for c in cell_curves.columns if c in DIAGNOSTIC_PREFIXES and cell_curves[c].notna().any()]
        panels = [m for m in (*CURVE_METRICS, a.metric) if m in cell_curves and cell_curves[m].notna().any()]
        panels = list(dict.fromkeys(panels + diag))
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(3.1 * len(panels), 2.4), squeeze=False)
        for ax, m in zip(axes[0], panels, strict=True):
            for key, c in cell_curves.dropna(subset=[m]).groupby("trial_key"):
                seed = done.loc[key, "seed"]
                failed = bool(done.loc[key, "failed"])
                ax.plot(c.step, c[m], lw=1, color="#d62728" if failed else None, label=f"seed {seed}")
            ax.set_title(m, fontsize=8)
            ax.set_xlabel("step", fontsize=8)
        axes[0][0].legend(fontsize=6)
        out.append({"cell": row.cell, "img": _png(fig)})
    return out


# --- the page -------------------------------------------------------------------------------------


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
                r.baseline,
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


def render(a: Analysis, ui: str | None = None) -> str:
    """The report as one HTML string."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    from .fits import scaling_points

    d = a.data
    env = Environment(loader=FileSystemLoader(template_dir()), autoescape=select_autoescape(["html", "j2"]))
    fit_cols = {
        "form": "form", "n": "n", "alpha": "α", "alpha_lo": "α lo", "alpha_hi": "α hi", "beta": "β",
        "c": "c", "k": "k", "m": "m", "E": "E", "A": "A", "gamma": "γ", "gamma_lo": "γ lo", "gamma_hi": "γ hi",
        "r2": "R²", "rmse": "RMSE", "aic": "AIC", "bic": "BIC", "extrapolation_error": "leave-largest-D-out error",
        "ci": "interval", "depth": "D from",
    }  # fmt: skip
    group_cols = {a.group_by or "": a.group_by or "", "n": "n", "alpha": "α", "alpha_lo": "α lo", "alpha_hi": "α hi",
                  "r2": "R²", "ref": "ref", "ratio": "α / α_ref", "ratio_lo": "lo", "ratio_hi": "hi"}  # fmt: skip
    verdicts = [
        {
            **v.row(),
            "difference": fmt(v.estimate),
            "interval": interval(v.lo, v.hi),
            "lhs": fmt(v.lhs),
            "rhs": fmt(v.rhs),
        }
        for v in a.verdicts
    ]
    context = {
        "study": d.name,
        "header": a.header(),
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "source": d.source,
        "metric": a.metric,
        "mode": d.mode,
        "missing": d.missing,
        "claims": verdicts,
        "cells": _cells_table(a),
        "strip": strip_plot(a),
        "failures": failure_plot(a),
        "profile": profile_plot(a),
        "fit_img": fit_plot(a.fits, scaling_points(d, a.metric), a.metric, f"{a.metric} vs effective depth"),
        "loops_img": fit_plot(
            a.loops_fits, scaling_points(d, a.metric, source="loops"), a.metric, "test-time depth (eval.loops)"
        ),
        "fits": _table(a.fit_table, fit_cols) if len(a.fits) else None,
        "groups": _table(a.groups, group_cols) if len(a.groups) else None,
        "gap": _table(a.gap, GAP_COLUMNS) if len(a.gap) else None,
        "paired": _table(
            a.paired,
            {
                "cell_a": "a",
                "cell_b": "b",
                "differs_in": "differs in",
                "pairs": "shared seeds",
                "diff_b_minus_a": "b − a",
                "t_lo": "t lo",
                "t_hi": "t hi",
                "boot_lo": "BCa lo (10+ pairs)",
                "boot_hi": "BCa hi (10+ pairs)",
                "p_b_better": "P(b better)",
            },
        )  # fmt: skip
        if len(a.paired)
        else None,
        "tts": _table(
            a.time_to_solve_cells,
            {
                "cell": "cell",
                "solved": "solved",
                "seeds": "seeds",
                "median_step": "median step (Kaplan-Meier)",
                "first_step": "first",
                "last_step": "last",
                "threshold": "threshold",
            },
        )  # fmt: skip
        if len(a.time_to_solve_cells)
        else None,
        "failure_depth": a.failure_depth,
        "curves": curve_plots(a),
        "trials": _trials_table(a, ui),
        "runs_url": runs_url(ui, d.experiment_id) if d.experiment_id else None,
    }
    return env.get_template(TEMPLATE).render(**context)


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
                             ("claims", a.claims_table), ("percent_gap", a.gap)):  # fmt: skip
                if len(df):
                    path = out / f"{a.data.name}-{name}.csv"
                    df.to_csv(path, index=False)
                    written.append(path)
    except OSError as exc:
        raise StudyrunnerError(f"--out: cannot write the report into {str(out)!r}: {exc.strerror or exc}") from None
    return written
