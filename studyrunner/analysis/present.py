"""Terminal output of `analyze` and `verify` (rich tables; user text is printed literally, never as markup)."""

from __future__ import annotations

import json
import sys

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .claims import Verdict, VerdictKind
from .search_history import best_points
from .summary import (
    EQUAL_DEPTH_COLUMNS,
    FAMILY_COLUMNS,
    FIT_COLUMNS,
    GAP_COLUMNS,
    Analysis,
    fmt,
    interval,
    seeds_needed_text,
    verdict_interval,
)

STYLES = {
    VerdictKind.SUPPORTED: "green",
    VerdictKind.CONTRADICTED: "red",
    VerdictKind.INCONCLUSIVE: "yellow",
    VerdictKind.INVALID: "magenta",
    VerdictKind.PENDING: "cyan",
}


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=Text(title), title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(Text(col), justify="left" if i == 0 else "right")
    return table


def cells_table(a: Analysis) -> Table:
    table = _table(
        f"{a.metric} ({a.data.mode}) by cell, over seeds",
        [
            "cell",
            "D",
            "n",
            "mean",
            "sd",
            "95% t",
            "95% BCa (10+ seeds)",
            "median",
            "IQM [95% Yuen]",
            "failed",
            "fail rate [Wilson]",
            "mean|success",
            "bimodal",
            "missing",
        ],  # fmt: skip
    )
    for r in a.cells.itertuples():
        _add_row(
            table,
            Text(r.cell + (f" ({r.baseline})" if r.baseline else "")),
            fmt(r.depth, 3),
            str(r.n),
            fmt(r.mean),
            fmt(r.sd, 3),
            interval(r.t_lo, r.t_hi),
            interval(r.bca_lo, r.bca_hi),
            fmt(r.median),
            f"{fmt(r.iqm)} {interval(r.iqm_lo, r.iqm_hi)}" if r.n > 1 else fmt(r.iqm),
            Text(f"{r.failures}/{r.seeds_done}", style="red" if r.failures else ""),
            f"{fmt(r.failure_rate, 2)} {interval(r.failure_lo, r.failure_hi, 2)}" if r.seeds_done else "",
            fmt(r.mean_success),
            Text("bimodal", style="magenta") if r.bimodal else "",
            str(r.missing) if r.missing else "",
        )
    return table


def _add_row(table: Table, *cells) -> None:
    """Every cell as Text: numbers and intervals such as [0.3, 0.5] are never read as markup."""
    table.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in cells))


def frame_table(title: str, df: pd.DataFrame, columns: dict[str, str]) -> Table:
    cols = [c for c in columns if c in df.columns]
    table = _table(title, [columns[c] for c in cols])
    for _, row in df.iterrows():
        table.add_row(*(Text(fmt(row[c])) for c in cols))
    return table


def verdicts_table(verdicts: list[Verdict], holm: bool = False) -> Table:
    """The claims table; `holm`: the Holm-adjusted p and verdict beside the raw ones."""
    columns = ["claim", "verdict", "lhs", "rhs", "lhs − rhs", "interval (kind, level)", "p (one-sided)"]
    columns += ["p (Holm)", "verdict (Holm)"] if holm else []
    table = _table("claims", [*columns, "test", "detail"])
    for v in verdicts:
        adjusted = [fmt(v.p_holm), Text(v.verdict_holm, style=STYLES.get(v.verdict_holm, ""))] if holm else []
        _add_row(
            table,
            Text(v.claim),
            Text(v.shown_verdict, style=STYLES.get(v.verdict, "")),
            fmt(v.lhs),
            fmt(v.rhs),
            fmt(v.lhs - v.rhs if v.scale else v.estimate),
            " ".join(filter(None, [verdict_interval(v), f"({v.interval_label})" if v.interval_label else ""])),
            fmt(v.p),
            *adjusted,
            Text(v.test),
            Text(v.detail),
        )
    return table


def print_verdicts(verdicts: list[Verdict], console: Console, holm: bool = False) -> None:
    """The claims table, then for each inconclusive claim the seeds its test needs (`power.fill`)."""
    console.print(verdicts_table(verdicts, holm=holm))
    for i, v in enumerate(verdicts):
        text = seeds_needed_text(v)
        if text:
            console.print(Text(f"claim {i + 1} ({v.claim}): {text}"), soft_wrap=True)


GROUP_COLUMNS = {
    "n": "n",
    "alpha": "α",
    "alpha_lo": "α lo",
    "alpha_hi": "α hi",
    "r2": "R²",
    "ref": "ref",
    "ratio": "α/α_ref",
    "ratio_lo": "lo",
    "ratio_hi": "hi",
    "ci": "interval",
    "flags": "flags",
}
PAIRED_COLUMNS = {
    "cell_a": "a",
    "cell_b": "b",
    "differs_in": "differs in",
    "pairs": "seeds",
    "diff_b_minus_a": "b − a",
    "t_lo": "t lo",
    "t_hi": "t hi",
    "p_b_better": "P(b better)",
}
SOLVE_COLUMNS = {
    "cell": "cell",
    "solved": "solved",
    "seeds": "seeds",
    "median_step": "median step (KM)",
    "first_step": "first",
    "last_step": "last",
}


def print_analysis(a: Analysis, console: Console) -> None:
    """What `analyze` prints: the cells, the scaling fits, then every comparison the study has data for."""
    console.print(Text(a.header()), soft_wrap=True)
    if a.chance_source:
        console.print(Text(f"chance level of {a.metric}: {fmt(a.chance, 3)} = {a.chance_source}"), soft_wrap=True)
    console.print(cells_table(a))
    if a.fits:
        title = f"fits of {a.metric} against effective depth D (best BIC first; flagged fits last)"
        console.print(frame_table(title, a.fit_table, FIT_COLUMNS))
    else:
        console.print(Text("no scaling fit: fewer than two distinct effective depths among successful seeds"))
    for title, frame, columns in _comparison_tables(a):
        console.print(frame_table(title, frame, columns))
    if len(a.search):
        console.print(search_table(a))
        for row in best_points(a.search).itertuples():
            console.print(
                Text(
                    f"best of search {row.search}: #{row.number} {row.cell} [{row.cell_hash}], {a.data.metric} "
                    f"{fmt(row.value)} over {row.seeds} seeds"
                ),
                soft_wrap=True,
            )
    if a.verdicts:
        print_verdicts(a.verdicts, console)


def _comparison_tables(a: Analysis):
    """(title, frame, columns) of each comparison table with rows, in the order `analyze` prints them."""
    if len(a.groups):
        yield f"log-linear fit per {a.group_by}", a.groups, {a.group_by: a.group_by, **GROUP_COLUMNS}
    if len(a.families):
        title = f"log-linear fit of {a.metric} against D per family: looped lines vs stacked (loops=1) cells"
        yield title, a.families, FAMILY_COLUMNS
    if len(a.equal_depth):
        title = "looped vs stacked at equal effective depth, and vs baselines (looped − other)"
        yield title, a.equal_depth, EQUAL_DEPTH_COLUMNS
    if len(a.gap):
        yield "%Gap = 100·(looped − iso_param)/(iso_flop − iso_param)", a.gap, GAP_COLUMNS
    if len(a.paired):
        yield "paired comparisons over shared seeds (b − a)", a.paired, PAIRED_COLUMNS
    if len(a.time_to_solve_cells):
        threshold = fmt(a.time_to_solve_cells.threshold.iloc[0])
        title = f"time to solve ({a.metric} reaching {threshold}: {a.threshold_source})"
        yield title, a.time_to_solve_cells, SOLVE_COLUMNS


def search_table(a: Analysis) -> Table:
    """The search's history: each suggestion, its seed mean from the ledger's current trials, what Optuna was
    told (where that differs: a seed rerun or added since), and the best value so far."""
    frame = a.search
    searches = frame.search.nunique()
    table = _table(
        f"search history: {a.data.metric} ({a.data.mode}), seed mean per configuration from the ledger's trials "
        "(told: what Optuna was told, where it differs)",
        (["search"] if searches > 1 else []) + ["#", "cell", "state", "value", "seeds", "told", "best so far", "best"],
    )
    for row in frame.itertuples():
        told = (row.told_state, fmt(row.told_value), fmt(row.told_seeds))
        same = told == (row.state, fmt(row.value), fmt(row.seeds)) or row.told_state in ("running", "abandoned")
        _add_row(
            table,
            *([Text(row.search)] if searches > 1 else []),
            str(row.number),
            Text(row.cell),
            Text(row.state, style="" if row.state == "complete" else "yellow"),
            fmt(row.value),
            fmt(row.seeds) if row.seeds == row.seeds else "",
            "" if same else f"{fmt(row.told_value)} ({row.told_state}, {fmt(row.told_seeds)} seeds)",
            fmt(row.best_so_far),
            Text("best", style="green") if row.best else "",
        )
    return table


def write_json(obj, out=None) -> None:
    (out or sys.stdout).write(json.dumps(obj, indent=2, allow_nan=False, default=str) + "\n")
