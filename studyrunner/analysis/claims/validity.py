"""Threats to the validity of a claim: what the data show that would make its verdict about the set-up rather
than about what the claim names. Pure functions over a study's trials, curves and cells, as the looks are;
`verify`, the report and `plan` print them beside each verdict, and `verify --strict` fails on them.

- `ceiling`: most seeds of a side within 2% of the metric's span of its perfect score (accuracy 1, loss 0);
- `floor`: most seeds of a side at or below the task's chance level or heuristic floor (+ 2% of the span);
- `unconverged`: a side's metric still moving over the last half of training, by an amount that, carried on
  for as long again, would change the verdict;
- `confound`: the sides' cells differ in a config field the claim's selectors do not name (block type, norm,
  init, steps, lr, ...);
- `unmatched`: a property the claim declares `matched:` (params, flops, steps, lr) differs beyond its tolerance;
- `selection`: a side's metric is the best of several alternatives ranked on the split it is scored on.

**Levels.** A task declares, per metric, its range, its chance level and, where a strategy that does not
compute the answer scores above chance, that heuristic floor (tasks/levels.py, read through
study/levels.py). The span is the range's width, or for a loss (no upper bound) the loss of guessing.

**Convergence.** For every seed of a side, the metric's eval points in the last half of training (at least
two, the last at the final step) are fitted by least squares; the fitted change over that half, `m`, is what
the seed would still gain in as long again. A side moves when its seeds agree that it does (the mean of `m`
over its seeds beyond the two-sided 5% t critical value times its standard error) and by more than 2% of the
span (one seed: more than 4% of the span). The projected difference
shifts the claim's interval by the lhs side's move minus the rhs side's; the threat is raised when the verdict
read from that shifted interval differs from the verdict given (a supported claim whose lower bound would
cross zero, a contradicted one whose upper bound would, an inconclusive one that would be decided). For a
slope, each cell's move shifts the fitted slope by the least-squares slope of the moves against the cells' x
(a fitted slope is linear in the values), and the same test on the shifted interval decides; the moving cells
are named. Perplexity sides (log scale) report every moving cell. The rule's rates on simulated curves that do
and do not converge: docs/analysis/validity.md (benchmarks/validity.py).

**Confounds.** The flattened resolved configs of the cells each side selects are compared field by field;
a field counts as named when a selector key of either side resolves to it (`loops` names
`model.params.loops`; `cell=` names every axis of the study). Evaluation settings other than the number of
examples are left out (they change how a model is measured, not what it learnt). Where the sides also
differ in parameters or FLOPs per token, the ratio is given.

**Matched properties** (`matched: [params, flops, steps, lr]` on a claim): params and FLOPs per token within
10% (relative to the larger), steps and learning rate exactly (`train.steps`, `train.lr`).

**Selection.** The schedule summaries `_min`, `_max` and `_spread` are the best, worst and range of many
trajectories; a trial that ranked them on the split it scored them on (no `selection_heldout` metric: ranked
on the validation half, scored on the test half, train/evaluation.py) inflates the best by the noise of the
ranking.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd

from ...store.status import TrialStatus
from ...study.canonical import flatten_config
from ...study.claims_grammar import Number, Quantity, parse_claim
from ...tasks.levels import MetricLevels
from ..data import StudyData
from .verdict import VerdictKind

LEVEL_TOLERANCE = 0.02  # of the span: "at" a level
MOVE_TOLERANCE = 0.02  # of the span: a side moving less than this has converged
MATCH_TOLERANCE = 0.10  # params and FLOPs per token, relative
SELECTED = re.compile(r"_(min|max|spread)$")
IGNORED_EVAL = ("eval.every", "eval.loops", "eval.budgets", "eval.trajectory", "eval.representations")


class ThreatKind(StrEnum):
    CEILING = "ceiling"
    FLOOR = "floor"
    UNCONVERGED = "unconverged"
    CONFOUND = "confound"
    UNMATCHED = "unmatched"
    SELECTION = "selection"


# Known before any trial runs (from the compiled study): what `plan` shows.
BEFORE_TRAINING = (ThreatKind.CONFOUND, ThreatKind.UNMATCHED, ThreatKind.SELECTION)


@dataclass(frozen=True)
class Threat:
    threat: ThreatKind
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"threat": str(self.threat), "detail": self.detail}


@dataclass
class Side:
    """One quantity of a claim and the finished trials it selects."""

    name: str  # "lhs" or "rhs"
    quantity: Quantity
    rows: pd.DataFrame


# --- the entry points ------------------------------------------------------------------------------------


def assess(data: StudyData, entry, verdict=None) -> list[Threat]:
    """The threats to one claim (a ClaimEntry, a mapping or a text) on the study's finished trials; `verdict`
    (claims.Verdict) where one was given, for the threats that depend on it (unconverged)."""
    text, matched = _entry(entry)
    try:
        claim = parse_claim(text)
    except Exception:  # noqa: BLE001 - an invalid claim: its verdict says so
        return []
    sides = _sides(data, claim)
    if not sides:
        return []
    threats: list[Threat] = []
    for side in sides:
        threats += level_threats(data, side)
        threats += selection_threats(data, side)
    threats += unconverged_threats(data, claim, sides, verdict)
    threats += confound_threats(data, sides, matched)
    return _unique(threats)


def assess_all(data: StudyData, verdicts: list) -> list[list[Threat]]:
    """Per claim of the study, in order, its threats (`verdicts`: the claims' verdicts, same order)."""
    return [assess(data, entry, v) for entry, v in zip(data.claims, verdicts, strict=False)]


def before_training(compiled, facts: dict[str, dict[str, float]] | None = None) -> list[list[Threat]]:
    """Per claim of a compiled study, the threats its cells show before anything runs: confounds, unmatched
    properties and selection. `facts`: {cell_hash: {"params": ..., "flops_per_token": ...}} as `plan` counts
    them (on the meta device), for `matched: [params, flops]`."""
    from ..data import from_frame

    rows = []
    for cell in compiled.cells:
        flat = flatten_config(cell.config)
        rows.append(
            {
                "trial_key": cell.cell_hash,
                "cell_hash": cell.cell_hash,
                "cell": cell.label,
                "seed": 0,
                "status": TrialStatus.SUCCEEDED,
                **flat,
                **(facts or {}).get(cell.cell_hash, {}),
            }
        )
    frame = pd.DataFrame(rows)
    data = from_frame(frame, name=compiled.study.name, claims=list(compiled.study.claims))
    data.cell_configs = {c.cell_hash: c.config for c in compiled.cells}
    out = []
    for entry in data.claims:
        text, matched = _entry(entry)
        try:
            claim = parse_claim(text)
        except Exception:  # noqa: BLE001
            out.append([])
            continue
        sides = _sides(data, claim)
        threats = confound_threats(data, sides, matched) if sides else []
        for side in sides:
            threats += selection_threats(data, side, before=True)
        out.append(_unique(threats))
    return out


def tuned_sides(data: StudyData, entry) -> dict[str, list[dict]]:
    """What a `tune:` section chose for the cells of each side of a claim: {"lhs": [{cell, chosen, ...}], ...}."""
    text, _ = _entry(entry)
    try:
        claim = parse_claim(text)
    except Exception:  # noqa: BLE001
        return {}
    out = {}
    for side in _sides(data, claim):
        out[side.name] = [
            {"cell": _label(side.rows[side.rows.cell_hash == h]), **data.tuning[h]}
            for h in dict.fromkeys(side.rows.cell_hash)
            if h in data.tuning
        ]
    return out


# --- ceiling and floor -----------------------------------------------------------------------------------


def level_threats(data: StudyData, side: Side) -> list[Threat]:
    q = side.quantity
    if q.metric is None or q.metric not in side.rows:
        return []
    at_ceiling, at_floor, cells = [], [], 0
    for cell_hash, group in side.rows.groupby("cell_hash", sort=False):
        levels = data.levels(q.metric, cell_hash)
        values = pd.to_numeric(group[q.metric], errors="coerce").dropna().to_numpy(float)
        if levels is None or not len(values):
            continue
        cells += 1
        value = float(np.median(values))
        scaled, best, low = _on_scale(levels, value), _on_scale(levels, levels.best), levels.uninformative
        tol = LEVEL_TOLERANCE * _span(levels)
        label = _label(group)
        if abs(scaled - best) <= tol:
            at_ceiling.append((label, value, levels))
        if low is not None:
            low = _on_scale(levels, low)
            if scaled <= low + tol if levels.higher_is_better else scaled >= low - tol:
                at_floor.append((label, value, levels))
    threats = []
    slope = q.kind == "slope"
    if at_ceiling and (slope or len(at_ceiling) * 2 > cells):
        label, value, levels = at_ceiling[0]
        more = f" (and {len(at_ceiling) - 1} more cells)" if len(at_ceiling) > 1 else ""
        threats.append(
            Threat(
                ThreatKind.CEILING,
                f"{side.name} {q.metric} [{label}]{more} at {value:.4g}, within "
                f"{LEVEL_TOLERANCE:.0%} of its perfect score {levels.best:g}: a difference cannot show",
            )
        )
    if at_floor and ((not slope and len(at_floor) * 2 > cells) or (slope and len(at_floor) == cells)):
        label, value, levels = at_floor[0]
        more = f" (and {len(at_floor) - 1} more cells)" if len(at_floor) > 1 else ""
        threats.append(
            Threat(ThreatKind.FLOOR, f"{side.name} {q.metric} [{label}]{more} at {value:.4g}: " + _floor_words(levels))
        )
    return threats


def _floor_words(levels: MetricLevels) -> str:
    if levels.floor is not None and levels.uninformative == levels.floor:
        return f"no better than the heuristic floor {levels.floor:.4g} ({levels.floor_strategy})"
    return f"no better than chance ({levels.chance:.4g})"


def _on_scale(levels: MetricLevels, value: float) -> float:
    return math.log(max(value, 1e-300)) if levels.log_scale else value


def _span(levels: MetricLevels) -> float:
    """The width "2% of the span" is taken of: the range's, or for an unbounded metric the distance from its
    perfect score to chance (on the log scale where the metric is read on one)."""
    if math.isfinite(levels.high - levels.low):
        return levels.high - levels.low
    if levels.chance:
        return abs(_on_scale(levels, levels.chance) - _on_scale(levels, levels.best)) or 1.0
    return 1.0


# --- convergence -----------------------------------------------------------------------------------------


def movement(data: StudyData, rows: pd.DataFrame, metric: str, log: bool = False) -> np.ndarray:
    """Per trial of `rows`, the fitted change of `metric` (of its log with `log`) over the last half of its
    training (NaN where its curve has fewer than two points there, or none at the final step)."""
    curves = data.curves
    if curves.empty or metric not in curves:
        return np.full(len(rows), np.nan)
    out = []
    for key, steps in zip(rows.trial_key, _steps(rows), strict=True):
        points = curves.loc[curves.trial_key == key, ["step", metric]].dropna()
        values = points[metric].to_numpy(float)
        out.append(
            _half_change(points.step.to_numpy(float), np.log(np.maximum(values, 1e-300)) if log else values, steps)
        )
    return np.array(out, dtype=float)


def _half_change(steps: np.ndarray, values: np.ndarray, final: float) -> float:
    if not len(steps) or not math.isfinite(final) or final <= 0 or steps.max() < final:
        return math.nan
    keep = steps >= final / 2
    if keep.sum() < 2:
        return math.nan
    slope = np.polyfit(steps[keep], values[keep], 1)[0]
    return float(slope * (final / 2))


def side_move(data: StudyData, side: Side) -> tuple[float, str]:
    """(the side's projected further change, or 0 where it has converged or cannot be judged; a note)."""
    q = side.quantity
    if q.metric is None or q.metric not in side.rows:
        return 0.0, ""
    levels = data.levels(q.metric, side.rows.cell_hash.iloc[0])
    log = levels is not None and levels.log_scale  # perplexity: moves in log units, the loss's
    moves = movement(data, side.rows, q.metric, log)
    ok = np.isfinite(moves)
    if not ok.any():
        return 0.0, ""
    span = _span(levels) if levels is not None else _observed_span(side.rows[q.metric])
    by_seed = pd.Series(moves[ok]).groupby(side.rows.seed.to_numpy()[ok]).mean()
    mean = float(by_seed.mean())
    if len(by_seed) >= 2:
        from scipy.stats import t

        se = float(by_seed.std(ddof=1) / math.sqrt(len(by_seed)))
        critical = float(t.ppf(0.975, len(by_seed) - 1))  # the seeds agree that it moves (two-sided 5%)
        moving = abs(mean) > critical * se and abs(mean) > MOVE_TOLERANCE * span
    else:
        moving = abs(mean) > 2 * MOVE_TOLERANCE * span
    if not moving:
        return 0.0, ""
    return (
        mean,
        f"{side.name} {q.metric} still {'rising' if mean > 0 else 'falling'} by {abs(mean):.3g} over the last half",
    )


def _observed_span(values: pd.Series) -> float:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return float(max(v.abs().max(), 1e-12)) if len(v) else 1.0


def unconverged_threats(data: StudyData, claim, sides: list[Side], verdict) -> list[Threat]:
    if any(_log_scaled(data, s) for s in sides):
        return _slope_unconverged(data, sides)  # each cell that moves (no interval on the moves' scale)
    if any(s.quantity.kind == "slope" for s in sides):
        return _slope_projected(data, claim, sides, verdict)
    moves = {s.name: side_move(data, s) for s in sides}
    notes = [note for _, note in moves.values() if note]
    if not notes or verdict is None or not math.isfinite(getattr(verdict, "lo", math.nan)):
        return []
    shift = moves.get("lhs", (0.0, ""))[0] - moves.get("rhs", (0.0, ""))[0]
    return _if_it_changes(claim, verdict, shift, "; ".join(notes), "interval")


def _if_it_changes(claim, verdict, shift: float, moving: str, what: str) -> list[Threat]:
    """The `unconverged` threat where shifting the verdict's interval by `shift` (the moves carried on as long
    again) reads another verdict; none where it reads the same."""
    now = _reading(verdict.lo, verdict.hi, verdict.null, _claims_greater(claim))
    later = _reading(verdict.lo + shift, verdict.hi + shift, verdict.null, _claims_greater(claim))
    if later == now:
        return []
    detail = (
        f"{moving}: carried on as long again, the {what} [{verdict.lo:.3g}, {verdict.hi:.3g}] would move by "
        f"{shift:+.3g} and read {later}"
    )
    return [Threat(ThreatKind.UNCONVERGED, detail)]


def _log_scaled(data: StudyData, side: Side) -> bool:
    if side.quantity.metric is None:
        return False
    levels = data.levels(side.quantity.metric, side.rows.cell_hash.iloc[0])
    return levels is not None and levels.log_scale


def _slope_projected(data: StudyData, claim, sides: list[Side], verdict) -> list[Threat]:
    """A slope claim: each cell's move over the last half, carried on as long again, moves the fitted slope by
    the slope of the moves against the cells' x (a least-squares slope is linear in the values). A threat only
    where that shift would change what the slope's interval says; every moving cell is named."""
    found = _slope_unconverged(data, sides)
    if not found or verdict is None or not math.isfinite(getattr(verdict, "lo", math.nan)):
        return found
    shifts = {s.name: _slope_of_moves(data, s) for s in sides}
    if any(v is None for v in shifts.values()):
        return found
    shift = shifts.get("lhs", 0.0) - shifts.get("rhs", 0.0)
    return _if_it_changes(claim, verdict, shift, found[0].detail, "slope's interval")


def _slope_of_moves(data: StudyData, side: Side) -> float | None:
    """How far the side's fitted slope moves if each cell moves as it did over the last half (0 for a slope
    side whose cells are still); None where its x cannot be read."""
    q = side.quantity
    if q.kind != "slope":
        return 0.0
    points = []
    for _, group in side.rows.groupby("cell_hash", sort=False):
        move, _ = side_move(data, Side(side.name, q, group))
        if q.x in ("effective_depth", "depth", "D"):
            column = "depth" if "depth" in group else "effective_depth"
        else:
            try:
                column = data.column_for(q.x)
            except Exception:  # noqa: BLE001 - an invalid claim: its verdict says so
                return None
        x = pd.to_numeric(group[column], errors="coerce").mean() if column in group else math.nan
        if not math.isfinite(x) or (q.log_x and x <= 0):
            return None
        points.append((math.log(x) if q.log_x else x, move))
    xs = np.array([p[0] for p in points])
    if len(set(xs.tolist())) < 2:
        return 0.0
    return float(np.polyfit(xs, np.array([p[1] for p in points]), 1)[0])


def _slope_unconverged(data: StudyData, sides: list[Side]) -> list[Threat]:
    notes = []
    for side in sides:
        for _, group in side.rows.groupby("cell_hash", sort=False):
            move, _ = side_move(data, Side(side.name, side.quantity, group))
            if move:
                notes.append(f"[{_label(group)}] still {'rising' if move > 0 else 'falling'} by {abs(move):.3g}")
    if not notes:
        return []
    return [
        Threat(
            ThreatKind.UNCONVERGED,
            "cells still moving over the last half of training: "
            + "; ".join(notes[:4])
            + (f" (and {len(notes) - 4} more)" if len(notes) > 4 else ""),
        )
    ]


def _claims_greater(claim) -> bool:
    op = claim.op if not isinstance(claim.lhs, Number) else {"<": ">", ">": "<", "<=": ">=", ">=": "<="}[claim.op]
    return op in (">", ">=")


def _reading(lo: float, hi: float, null: float, greater: bool) -> VerdictKind:
    """What an interval of lhs − rhs says of a `>` (greater) or `<` claim."""
    if lo > null:
        return VerdictKind.SUPPORTED if greater else VerdictKind.CONTRADICTED
    if hi < null:
        return VerdictKind.CONTRADICTED if greater else VerdictKind.SUPPORTED
    return VerdictKind.INCONCLUSIVE


# --- confounds and matched properties --------------------------------------------------------------------


def confound_threats(data: StudyData, sides: list[Side], matched: list[str]) -> list[Threat]:
    if len(sides) < 2:
        return []
    named = set()
    for side in sides:
        for key, _ in side.quantity.selector:
            column = _column(data, key)
            if column == "cell":
                named |= set(data.varied_columns)
            elif column is not None:
                named.add(column)
    # settings a `tune:` section chose per cell differ by design (each arm at its own best): `tuned` lists them
    named |= {path for choice in data.tuning.values() for path in (choice.get("chosen") or {})}
    a, b = (_cell_fields(data, s.rows) for s in sides)
    differing = []
    for path in sorted(set(a) | set(b)):
        if path in named or path.startswith(IGNORED_EVAL) or path == "seed":
            continue
        if a.get(path, {"—"}) != b.get(path, {"—"}):
            differing.append(f"{path}: {_shown(a.get(path))} vs {_shown(b.get(path))}")
    threats = []
    if differing:
        facts = _fact_ratios(sides)
        threats.append(
            Threat(
                ThreatKind.CONFOUND,
                "the sides also differ in "
                + "; ".join(differing[:8])
                + (f" (and {len(differing) - 8} more)" if len(differing) > 8 else "")
                + (f"; {facts}" if facts else ""),
            )
        )
    threats += unmatched_threats(data, sides, matched)
    return threats


def unmatched_threats(data: StudyData, sides: list[Side], matched: list[str]) -> list[Threat]:
    threats = []
    a, b = sides[0].rows, sides[1].rows
    for prop in matched or []:
        if prop in ("params", "flops"):
            column = "params" if prop == "params" else "flops_per_token"
            va, vb = _mean(a, column), _mean(b, column)
            if not (math.isfinite(va) and math.isfinite(vb)):
                threats.append(Threat(ThreatKind.UNMATCHED, f"{prop}: not recorded for both sides ({column})"))
            elif abs(va - vb) > MATCH_TOLERANCE * max(abs(va), abs(vb)):
                threats.append(
                    Threat(
                        ThreatKind.UNMATCHED,
                        f"{prop}: {_num(va)} vs {_num(vb)} ({va / vb:.2f}x; "
                        f"matched means within {MATCH_TOLERANCE:.0%})",
                    )
                )
        else:
            column = "train.steps" if prop == "steps" else "train.lr"
            va, vb = _values(a, column), _values(b, column)
            if va != vb:
                threats.append(
                    Threat(
                        ThreatKind.UNMATCHED, f"{prop}: {_shown(va)} vs {_shown(vb)} ({column}; matched means equal)"
                    )
                )
    return threats


def _fact_ratios(sides: list[Side]) -> str:
    parts = []
    for column, what in (("params", "parameters"), ("flops_per_token", "FLOPs per token")):
        va, vb = _mean(sides[0].rows, column), _mean(sides[1].rows, column)
        if math.isfinite(va) and math.isfinite(vb) and vb and abs(va - vb) > MATCH_TOLERANCE * max(va, vb):
            parts.append(f"{what} {_num(va)} vs {_num(vb)}")
    return ", ".join(parts)


def _cell_fields(data: StudyData, rows: pd.DataFrame) -> dict[str, set[str]]:
    fields: dict[str, set[str]] = {}
    for cell_hash in dict.fromkeys(rows.cell_hash):
        config = data.cell_configs.get(cell_hash)
        flat = flatten_config(config) if config is not None else _flat_from_rows(rows[rows.cell_hash == cell_hash])
        for path, value in flat.items():
            if value is None:  # unset: as absent (one family's `exit_step: None` is another's missing field)
                continue
            fields.setdefault(path, set()).add(repr(value))
    return fields


def _flat_from_rows(rows: pd.DataFrame) -> dict[str, Any]:
    first = rows.iloc[0]
    return {c: first[c] for c in rows.columns if "." in c and not _missing(first[c])}


# --- selection -------------------------------------------------------------------------------------------


def selection_threats(data: StudyData, side: Side, before: bool = False) -> list[Threat]:
    q = side.quantity
    if q.metric is None or not SELECTED.search(q.metric):
        return []
    if not before and "selection_heldout" in side.rows and (side.rows["selection_heldout"] == 1).all():
        return []  # ranked on the validation half, scored on the test half
    if before:
        return []  # this version ranks on the validation half: nothing known to fear before training
    return [
        Threat(
            ThreatKind.SELECTION,
            f"{side.name} {q.metric} is the best/worst of several trajectories, "
            "ranked on the same eval examples it is scored on (trials from before held-out ranking)",
        )
    ]


# --- helpers ---------------------------------------------------------------------------------------------


def _entry(entry) -> tuple[str, list[str]]:
    if isinstance(entry, str):
        return entry, []
    if isinstance(entry, dict):
        return entry["claim"], list(entry.get("matched") or [])
    return entry.claim, list(getattr(entry, "matched", None) or [])


def _sides(data: StudyData, claim) -> list[Side]:
    sides = []
    for name, q in (("lhs", claim.lhs), ("rhs", claim.rhs)):
        if isinstance(q, Quantity):
            try:
                rows = data.select(q.selector)
            except Exception:  # noqa: BLE001 - an unknown field: the verdict says invalid
                return []
            if rows.empty:
                return []
            sides.append(Side(name, q, rows))
    return sides


def _column(data: StudyData, key: str) -> str | None:
    try:
        return data.column_for(key)
    except Exception:  # noqa: BLE001
        return None


def _steps(rows: pd.DataFrame) -> list[float]:
    if "train.steps" not in rows:
        return [math.nan] * len(rows)
    return [float(s) if not _missing(s) else math.nan for s in rows["train.steps"]]


def _label(group: pd.DataFrame) -> str:
    return str(group.cell.iloc[0]) if "cell" in group else str(group.cell_hash.iloc[0])


def _mean(rows: pd.DataFrame, column: str) -> float:
    if column not in rows:
        return math.nan
    values = pd.to_numeric(rows[column], errors="coerce").dropna()
    return float(values.mean()) if len(values) else math.nan


def _values(rows: pd.DataFrame, column: str) -> set[str]:
    return {repr(v) for v in rows[column]} if column in rows else {"—"}


def _shown(values: set[str] | None) -> str:
    if not values:
        return "(absent)"
    return "/".join(sorted(values)) if len(values) > 1 else next(iter(values))


def _num(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _unique(threats: list[Threat]) -> list[Threat]:
    return list(dict.fromkeys(threats))


__all__ = ["BEFORE_TRAINING", "Threat", "ThreatKind", "assess", "assess_all", "before_training"]
