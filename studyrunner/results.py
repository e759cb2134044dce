"""Read a study's outcomes as pandas frames: one row per trial, and per-step curves.

>>> from studyrunner import results
>>> df = results.load("quickstart")
>>> df.groupby("cell")["eval_accuracy"].agg(["mean", "std", "count"])
>>> results.load_many(where="loops >= 4 and eval_accuracy > 0.6")  # every study in the ledger
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
import string
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from .errors import UsageError
from .store import CurveStore, Ledger
from .store.status import UNSUCCESSFUL, TrialStatus
from .study import flatten_config
from .study.claims_grammar import KEYWORDS, BoolOp, Compare, GrammarError, Not, Rule, parse_rule, tokenize
from .workspace import Workspace

ID_COLUMNS = [
    "study",
    "trial_key",
    "cell_hash",
    "cell",
    "baseline_of",
    "seed",
    "status",
    "attempts",
    "started_at",
    "finished_at",
    "duration_s",
    "mlflow_run_id",
    "error",
]


def _utc(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; the ledger writes UTC, so say so."""
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _study_rows(ledger: Ledger, study: str) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """One dict per trial of `study`, and its config and metric column names (in first-seen order)."""
    ledger.get_study(study)
    cells = {c.cell_hash: c for c in ledger.cells(study)}
    flat = {h: flatten_config(c.config) for h, c in cells.items()}  # once per cell, not per trial
    rows, config_cols, metric_cols = [], {}, {}
    for t in ledger.trials(study):
        cell = cells[t.cell_hash]
        started, finished = _utc(t.started_at), _utc(t.finished_at)
        duration = (finished - started).total_seconds() if finished and started else None
        config = flat[t.cell_hash]
        metrics = t.metrics or {}
        config_cols.update(dict.fromkeys(config))
        metric_cols.update(dict.fromkeys(metrics))
        rows.append(
            {
                "study": study,
                "trial_key": t.trial_key,
                "cell_hash": t.cell_hash,
                "cell": cell.label,
                "baseline_of": ",".join(f"{kind}:{h}" for kind, h in (cell.baseline_of or [])),
                "seed": t.seed,
                "status": t.status,
                "attempts": t.attempts,
                "started_at": started,
                "finished_at": finished,
                "duration_s": duration,
                "mlflow_run_id": t.mlflow_run_id,
                "error": t.error,
                **config,
                **metrics,
            }
        )
    return rows, list(config_cols), list(metric_cols)


def trials_frame(ledger: Ledger, study: str) -> pd.DataFrame:
    """Identity and status columns, then the flattened resolved config, then final metrics."""
    return studies_frame(ledger, [study])


def studies_frame(ledger: Ledger, studies: Sequence[str] = ()) -> pd.DataFrame:
    """`trials_frame` of several studies, one after the other (no names: every study in the ledger).
    Columns are the union: a config field or metric one study lacks is missing (NaN) in its rows."""
    names = list(dict.fromkeys(studies)) or [s.name for s in ledger.studies()]
    rows, config_cols, metric_cols = [], {}, {}
    for name in names:
        study_rows, config, metrics = _study_rows(ledger, name)
        rows += study_rows
        config_cols.update(dict.fromkeys(config))
        metric_cols.update(dict.fromkeys(metrics))
    return pd.DataFrame(rows, columns=ID_COLUMNS + list(config_cols) + sorted(metric_cols))


def load(study: str, db: str | None = None, workspace: str | None = None) -> pd.DataFrame:
    """One row per trial of `study` from the ledger (default: the workspace's SQLite)."""
    return trials_frame(Ledger(Workspace.resolve(workspace, db=db).db_url, create=False, read_only=True), study)


def load_many(
    studies: Sequence[str] = (),
    where: str | None = None,
    db: str | None = None,
    workspace: str | None = None,
) -> pd.DataFrame:
    """One row per trial of several studies (none named: every study in the ledger), keeping only the
    trials `where` holds for, e.g. ``load_many(where="loops >= 4 and eval_accuracy > 0.6")``."""
    df = studies_frame(Ledger(Workspace.resolve(workspace, db=db).db_url, create=False, read_only=True), studies)
    return filter_where(df, where) if where else df


def curves(study: str, storage: str | None = None, workspace: str | None = None) -> pd.DataFrame:
    """Every per-step record of `study` (columns: trial_key, step, metrics; NaN where not logged)."""
    return CurveStore(Workspace.resolve(workspace, storage=storage).storage).read_study(study)


def cell_summary(df: pd.DataFrame, metric: str, mode: str = "max") -> pd.DataFrame:
    """Per cell: mean, std and count of `metric` over succeeded seeds, and how many seeds failed (status
    failed or diverged: a diverged seed did not succeed either); best cell first by `mode`."""
    columns = ["cell", "mean", "std", "seeds", "failed"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    succeeded = df.status == TrialStatus.SUCCEEDED
    values = df[metric].where(succeeded) if metric in df.columns else pd.Series(float("nan"), df.index)
    failed = df.status.isin(UNSUCCESSFUL)
    if values.isna().all() and not failed.any():
        return pd.DataFrame(columns=columns)  # nothing reported yet, and nothing failed
    grouped = values.groupby(df["cell"], sort=False)
    stats = grouped.agg(["mean", "std", "count"]).rename(columns={"count": "seeds"})
    # Cells whose seeds all failed stay in the table (mean NaN), with their failure count.
    stats["failed"] = failed.groupby(df["cell"], sort=False).sum().astype(int)
    stats = stats.sort_values("mean", ascending=(mode == "min"), na_position="last")
    return stats.reset_index()[columns]


# --- where: the `failure:` rule grammar as a filter over the frame's columns ----------------------------


def filter_where(df: pd.DataFrame, where: str, option: str = "where") -> pd.DataFrame:
    """The rows of `df` for which `where` holds. `where` has the grammar of a study's `failure:` rule
    (comparisons with numbers, and/or/not, parentheses); its names are columns of `df`: exact
    (`eval_accuracy`, `seed`, `model.params.loops`) or a unique dotted suffix (`loops`, `params.loops`).
    A row lacking a value for any name in `where` does not match, whatever the rule says (`not`
    included): a study without that field or a trial without that metric is not an answer.
    Errors are one-line UsageErrors (exit 2) beginning with `option` (the CLI passes "--where")."""
    rule, written = _parse_where(where, option)
    columns = {name: resolve_column(df, name, option) for name in written}
    rule = Rule(_renamed(rule.expr, columns), rule.text)
    used = list(dict.fromkeys(columns.values()))
    keep = [_holds(rule, dict(zip(used, values, strict=True))) for values in df[used].itertuples(index=False)]
    return df[pd.Series(keep, index=df.index, dtype=bool)]


def resolve_column(df: pd.DataFrame, name: str, option: str = "where") -> str:
    """The column of `df` that `name` means: itself, else the one column ending in `.name`. When several
    do, those holding a number win (a comparison can only ever be true of numbers: `loops` means
    model.params.loops, not a study's list of test-time eval.loops)."""
    if name in df.columns:
        return _numeric_column(df, name, option)
    found = [c for c in df.columns if isinstance(c, str) and c.endswith("." + name)]
    if len(found) > 1:
        numeric = [c for c in found if _holds_numbers(df[c])]
        found = numeric if len(numeric) == 1 else found
    if len(found) == 1:
        return _numeric_column(df, found[0], option)
    if found:
        raise UsageError(f"{option}: {name!r} is ambiguous; write one of: {', '.join(found)}")
    raise UsageError(f"{option}: no column {name!r} in the results{_close_names(df, name)}")


def _close_names(df: pd.DataFrame, name: str) -> str:
    columns = [c for c in df.columns if isinstance(c, str)]
    leaves: dict[str, list[str]] = {}  # `loop` is close to the leaf of model.params.loops
    for c in columns:
        leaves.setdefault(c.rsplit(".", 1)[-1], []).append(c)
    close = difflib.get_close_matches(name, columns, n=5, cutoff=0.6)
    for leaf in difflib.get_close_matches(name, list(leaves), n=5, cutoff=0.6):
        close += leaves[leaf]
    close = list(dict.fromkeys(close))[:5]
    if close:
        return f"; did you mean: {', '.join(close)}"
    return " (list the columns with: studyrunner results --format csv)"


def _numeric_column(df: pd.DataFrame, column: str, option: str) -> str:
    """A rule compares numbers: a column of text or times (status, cell, started_at) would silently
    match nothing."""
    values = df[column].dropna()
    if len(values) and not _holds_numbers(values):
        raise UsageError(f"{option}: {column!r} holds no numbers; compare a metric or a numeric config field or seed")
    return column


def _holds_numbers(values: pd.Series) -> bool:
    return any(_numeric(v) is not None for v in values)


def _numeric(value: Any) -> float | None:
    """A cell of the frame as the rule sees it: a number (bools as 0/1), or None for anything else
    (missing, NaN, text, a list)."""
    if isinstance(value, bool | np.bool_):
        return float(value)
    if isinstance(value, numbers.Real) and not math.isnan(value):
        return float(value)
    return None


def _holds(rule: Rule, row: dict[str, Any]) -> bool:
    values = {name: _numeric(value) for name, value in row.items()}
    return all(v is not None for v in values.values()) and rule(values)


def _parse_where(text: str, option: str) -> tuple[Rule, list[str]]:
    """Parse `text` as a rule; returns it and the names it uses, as written. The rule grammar refuses
    dotted names (a `failure:` rule names metrics), but a query names config paths too: each dotted
    name is swapped for an undotted one of the same length before parsing, so the error positions the
    parser reports still point into the user's text."""
    try:
        tokens = tokenize(text)
    except GrammarError as exc:
        raise _where_error(exc, option, text, {}) from None
    taken = {t.text for t in tokens if t.kind == "name"} | set(KEYWORDS)
    aliases: dict[str, str] = {}  # dotted name -> its stand-in
    chars = list(text)
    for tok in tokens:
        if tok.kind == "name" and "." in tok.text:
            if tok.text not in aliases:
                aliases[tok.text] = _stand_in(tok.text, taken)
                taken.add(aliases[tok.text])
            chars[tok.pos - 1 : tok.pos - 1 + len(tok.text)] = aliases[tok.text]
    back = {alias: name for name, alias in aliases.items()}
    try:
        rule = parse_rule("".join(chars))
    except GrammarError as exc:
        raise _where_error(exc, option, text, back) from None
    rule = Rule(_renamed(rule.expr, back), text)
    return rule, rule.metrics


def _stand_in(dotted: str, taken: set[str]) -> str:
    for fill in "_" + string.ascii_letters + string.digits:
        alias = dotted.replace(".", fill)
        if alias not in taken:
            return alias
    raise AssertionError(f"no stand-in for {dotted!r}")  # 63 fills against the few names of one rule


def _where_error(exc: GrammarError, option: str, text: str, back: dict[str, str]) -> UsageError:
    message = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: back.get(m.group(), m.group()), exc.message)
    return UsageError(f"{option}: position {exc.position}: {message} (in {text!r})")


def _renamed(node: Any, names: dict[str, str]) -> Any:
    """The rule's tree with metric names replaced through `names` (others kept)."""
    if isinstance(node, Compare):
        return Compare(names.get(node.metric, node.metric), node.op, node.value)
    if isinstance(node, Not):
        return Not(_renamed(node.arg, names))
    return BoolOp(node.op, tuple(_renamed(a, names) for a in node.args))
