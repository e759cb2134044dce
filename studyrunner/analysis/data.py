"""A study's outcomes, read from the ledger and the curve store, ready for statistics.

`load("quickstart")` reads the study as last submitted (its claims, `failure:` rule and metric come from
the study file stored in the ledger); `load("studies/quickstart.yaml")` reads the file on disk instead, so
claims added since the last submit are used, and trials the file adds but that have not run count as
missing. Nothing here trains or writes.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import SpecError, StudyrunnerError
from ..store import CurveStore, Ledger
from ..store.status import FINISHED, UNSUCCESSFUL, TrialStatus, ended_outcomes
from ..study.claims_grammar import GrammarError, Rule, parse_rule, selector_column, values_equal
from ..study.levels import metric_levels
from ..study.schema import ClaimEntry
from ..tasks.levels import MetricLevels
from ..urls import mask_url
from .search_history import search_frame

# Test-time depth columns: `{metric}_loops_{n}` (eval.loops) and `{metric}_budget_{n}` (eval.budgets), one mechanism.
_LOOPS_COLUMN = re.compile(r"^(?P<metric>.+)_(?:loops|budget)_(?P<n>\d+)$")


@dataclass
class StudyData:
    """One study's trials (a row per trial: config, status, final metrics, `failed`, `depth`)."""

    name: str
    trials: pd.DataFrame
    metric: str = "eval_accuracy"
    mode: str = "max"
    claims: list[ClaimEntry] = field(default_factory=list)  # each a claim text and its min_effect
    failure_rule: Rule | None = None
    missing: int = 0  # trials of the study (file) that have not finished
    experiment_id: str | None = None
    source: str = ""
    curve_store: CurveStore | None = None
    cells_order: list[str] = field(default_factory=list)  # cell_hash in study order
    warnings: list[str] = field(default_factory=list)  # e.g. a cell whose seeds ran different code
    # Told of what the analysis leaves out as it goes (an unreadable curve); default: a Python warning.
    on_warning: Callable[[str], None] | None = None
    # A search study's suggestions in order (analysis/search_history.py); empty for a grid study.
    search: pd.DataFrame = field(default_factory=pd.DataFrame)
    # The study file's `analysis:` options (solve_threshold, logistic_top); empty when it has none.
    analysis: dict[str, Any] = field(default_factory=dict)
    # Why the study file stored in the ledger could not be read (then claims, rule and metric are unknown).
    spec_error: str = ""
    # A sequential study (`seeds: {start, max}`): its design, and the looks the ledger records, each a dict of the
    # look's row with its claims' rows under "claims" (analysis/sequential/ reads them); None / [] otherwise.
    sequential: dict[str, Any] | None = None
    looks: list[dict[str, Any]] = field(default_factory=list)
    # {cell_hash: the cell's resolved config} (the ledger's cells; from_frame: rebuilt from the config columns)
    cell_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A study with `tune:`: {cell_hash: what its tuning chose, study/tuning.py Choice.to_dict()}
    tuning: dict[str, dict[str, Any]] = field(default_factory=dict)

    def levels(self, metric: str, cell_hash: str) -> MetricLevels | None:
        """The levels (range, chance, heuristic floor) the cell's task declares for `metric` (study/levels.py);
        None where it declares none or the cell's config is unknown."""
        config = self.cell_configs.get(cell_hash)
        if config is None or "task" not in config:
            return None
        try:
            return metric_levels(config, metric)
        except Exception:  # noqa: BLE001 - a task this studyrunner no longer builds: no levels
            return None

    # --- derived views ----------------------------------------------------------------------------

    @property
    def done(self) -> pd.DataFrame:
        """Finished trials (succeeded, failed or diverged): the seeds statistics are over."""
        return self.trials[self.trials.status.isin(FINISHED)]

    @property
    def config_columns(self) -> list[str]:
        return [c for c in self.trials.columns if "." in c]

    @property
    def varied_columns(self) -> list[str]:
        """Config columns whose value differs between cells (the study's axes, baselines included); kept
        while the trials frame is the same object of the same shape (a cell's config never changes)."""
        cached = self.__dict__.get("_varied")  # (the frame itself, its shape, the columns)
        if cached is None or cached[0] is not self.trials or cached[1] != self.trials.shape:
            cells = self.trials.drop_duplicates("cell_hash")
            varied = [c for c in self.config_columns if cells[c].astype(str).nunique() > 1]
            cached = (self.trials, self.trials.shape, varied)
            self.__dict__["_varied"] = cached
        return list(cached[2])

    @cached_property
    def curves(self) -> pd.DataFrame:
        if self.curve_store is None:
            return pd.DataFrame(columns=["trial_key", "step"])
        return self.curve_store.read_study(self.name, warn=self._warn)

    def _warn(self, line: str) -> None:
        self.warnings.append(line)
        if self.on_warning is not None:
            self.on_warning(line)
        else:
            warnings.warn(line, stacklevel=3)

    def column_for(self, key: str) -> str:
        """The trial-frame column a selector key names (`study.claims_grammar.selector_column`)."""
        column, leaves = selector_column(key, self.config_columns, self.varied_columns)
        if column is not None:
            return column
        if leaves:
            raise StudyrunnerError(f"{key!r} is ambiguous: write one of {', '.join(leaves)}")
        axes = ", ".join(c.rsplit(".", 1)[-1] for c in self.varied_columns) or "none"
        raise StudyrunnerError(
            f"no config field {key!r} in study {self.name!r} (varied fields: {axes}; also cell, family, task, baseline)"
        )

    def select(self, selector: tuple[tuple[str, Any], ...], frame: pd.DataFrame | None = None) -> pd.DataFrame:
        """Rows of `frame` (default: finished trials) matching every `key=value` of the selector."""
        frame = self.done if frame is None else frame
        mask = pd.Series(True, index=frame.index)
        for key, value in selector:
            column = self.column_for(key)
            mask &= frame[column].map(lambda v, value=value: values_equal(v, value))
        return frame[mask]


def effective_depth(row: pd.Series) -> float:
    """D of a trial: the model's effective depth (k·L for looped models), times the measured fraction of
    steps taken for halting families (mean ponder steps), so D is what the run actually used."""
    depth = row.get("effective_depth")
    if depth is None or pd.isna(depth):
        return float("nan")
    fraction = row.get("ponder_steps_fraction")
    if fraction is not None and not pd.isna(fraction):
        return float(depth) * float(fraction)
    return float(depth)


def depth_at_loops(row: pd.Series, loops: int) -> float:
    """D when a trained model is evaluated at `loops` (eval.loops): the looped part scales with loops."""
    depth, trained = row.get("effective_depth"), row.get("model.params.loops")
    if depth is None or pd.isna(depth) or trained is None or pd.isna(trained) or not trained:
        return float("nan")
    fixed = sum(float(row.get(f"model.params.{k}") or 0) for k in ("prefix_layers", "suffix_layers"))
    return fixed + (float(depth) - fixed) * loops / float(trained)


def loops_columns(frame: pd.DataFrame, metric: str) -> dict[int, str]:
    """{n: column} of the `{metric}_loops_{n}` / `{metric}_budget_{n}` columns (test-time depth) in a trial frame."""
    out = {}
    for col in frame.columns:
        m = _LOOPS_COLUMN.match(col)
        if m and m["metric"] == metric:
            out[int(m["n"])] = col
    return dict(sorted(out.items()))


def annotate(trials: pd.DataFrame, rule: Rule | None) -> pd.DataFrame:
    """Add `failed` (status failed/diverged, or the failure rule holds), `depth` (D) and `baseline`."""
    trials = trials.copy()
    metric_cols = [c for c in trials.columns if "." not in c]

    def failed(row: pd.Series) -> bool:
        if row.status in UNSUCCESSFUL:
            return True
        if row.status != TrialStatus.SUCCEEDED or rule is None:
            return False
        metrics = {c: row[c] for c in metric_cols if not _missing(row[c])}
        return rule(metrics)

    trials["failed"] = trials.apply(failed, axis=1).astype(bool) if len(trials) else pd.Series(dtype=bool)
    trials["depth"] = trials.apply(effective_depth, axis=1) if len(trials) else pd.Series(dtype=float)
    # a crashed trial reports no depth: its cell's other seeds (same config) give the nominal one
    if len(trials) and "effective_depth" in trials:
        nominal = trials.groupby("cell_hash")["effective_depth"].transform("median")
        trials["depth"] = trials["depth"].fillna(nominal)
    kinds = trials["baseline_of"].fillna("") if "baseline_of" in trials else pd.Series("", index=trials.index)
    trials["baseline"] = kinds.map(lambda s: ",".join(sorted({p.split(":")[0] for p in s.split(",") if p})))
    return trials


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def load(
    study: str,
    db: str | None = None,
    workspace: str | Path | None = None,
    storage: str | None = None,
    failure: str | None = None,
) -> StudyData:
    """Read a study by name (as last submitted) or by study file. `failure` overrides the file's rule."""
    from ..results import trials_frame
    from ..workspace import Workspace

    ws = Workspace.resolve(workspace, db=db, storage=storage)
    ledger = Ledger(ws.db_url, create=False, read_only=True)
    spec, compiled = None, None
    path = Path(study)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        from ..study import load_and_compile

        compiled = load_and_compile(path)
        spec = compiled.study
        name = spec.name
    else:
        name = study
    row = ledger.get_study(name)
    spec_error = ""
    if spec is None:
        spec, compiled, spec_error = _spec_from_text(row.spec_text, name)
    trials = trials_frame(ledger, name)
    rule_text = failure if failure is not None else getattr(spec, "failure", None)
    try:
        rule = parse_rule(rule_text) if rule_text else None
    except GrammarError as exc:
        raise SpecError(f"failure rule: {exc}") from None
    claims = list(getattr(spec, "claims", []) or [])
    metric = spec.metric.name if spec is not None else "eval_accuracy"
    mode = spec.metric.mode if spec is not None else "max"
    sequential_study = getattr(spec, "sequential", None) is not None
    # a search's trials: those suggested so far; a sequential study's: the waves registered so far
    if compiled is not None and compiled.study.search is None and not sequential_study:
        finished = set(trials.loc[trials.status.isin(FINISHED), "trial_key"])
        wanted = {t.trial_key for t in compiled.trials}
        missing = len(wanted - finished)
        order = [c.cell_hash for c in compiled.cells]
        # a study file may have fewer trials than the ledger holds (cells or seeds dropped): analyse its own
        trials = trials[trials.trial_key.isin(wanted)] if path.is_file() else trials
    else:
        missing = int((~trials.status.isin(FINISHED)).sum())
        order = list(dict.fromkeys(trials.cell_hash))
    order += [h for h in dict.fromkeys(trials.cell_hash) if h not in order]
    labels = dict(zip(trials.cell_hash, trials.cell, strict=True)) if "cell" in trials else {}
    searched = getattr(spec, "search", None) is not None
    search = search_frame(ledger, name, labels, mode, trials, metric) if searched else None
    design = getattr(spec, "sequential", None)
    return StudyData(
        name=name,
        trials=annotate(trials.reset_index(drop=True), rule),
        metric=metric,
        mode=mode,
        claims=claims,
        failure_rule=rule,
        missing=missing,
        experiment_id=row.mlflow_experiment_id,
        source=str(path) if path.is_file() else f"ledger {mask_url(ws.db_url)}",
        curve_store=CurveStore(ws.storage),
        cells_order=order,
        warnings=[
            *filter(None, [ledger.read_note, spec_error]),
            *mixed_code_versions(trials, ledger.provenance(name)),
        ],
        search=search if search is not None else pd.DataFrame(),
        analysis=_analysis_options(spec),
        spec_error=spec_error,
        sequential=design.model_dump() if design is not None else None,
        looks=looks_of(ledger, name) if design is not None else [],
        cell_configs={c.cell_hash: c.config for c in ledger.cells(name)},
        tuning=_tuning(ledger, spec, name),
    )


def _tuning(ledger: Ledger, spec, name: str) -> dict[str, dict[str, Any]]:
    """What a `tune:` section chose for each of the study's cells, from its tuning study's trials."""
    if spec is None or getattr(spec, "tune", None) is None:
        return {}
    from ..study.compiled import CompiledStudy
    from ..study.tuning import choose, group_of, tuned_paths, tuning_of

    try:
        tuning = tuning_of(CompiledStudy(spec, []))
    except Exception:  # noqa: BLE001 - a study file this version no longer compiles: no choices shown
        return {}
    if tuning is None or not any(s.name == tuning.study.name for s in ledger.studies()):
        return {}
    ended = ended_outcomes(ledger.trials(tuning.study.name))
    choices = choose(tuning, tuned_paths(spec), ended) or {}
    out = {}
    for cell in ledger.cells(name):
        choice = choices.get(group_of(cell.config, tuned_paths(spec)))
        if choice is not None:
            out[cell.cell_hash] = choice.to_dict()
    return out


def looks_of(ledger: Ledger, study: str) -> list[dict[str, Any]]:
    """The looks the ledger records for a sequential study: each look's row as a dict, its claims' under "claims"."""
    out = []
    for look, claims in ledger.looks(study):
        row = {c: getattr(look, c) for c in ("number", "seeds", "next_seeds", "step", "design")}
        row["texts"] = list(look.claims)
        row["claims"] = [{c.key: getattr(c_row, c.key) for c in c_row.__table__.columns} for c_row in claims]
        out.append(row)
    return out


def from_ledger(ledger: Ledger, spec) -> StudyData:
    """A study's registered trials, read from an open ledger with its study file in hand (a sequential study's
    looks, in the driver): claims, failure rule and metric from `spec`; no curves, no provenance, no looks."""
    from ..results import trials_frame

    trials = trials_frame(ledger, spec.name).reset_index(drop=True)
    rule = parse_rule(spec.failure) if spec.failure else None
    return StudyData(
        name=spec.name,
        trials=annotate(trials, rule),
        metric=spec.metric.name,
        mode=spec.metric.mode,
        claims=list(getattr(spec, "claims", []) or []),
        failure_rule=rule,
        missing=int((~trials.status.isin(FINISHED)).sum()),
        cells_order=list(dict.fromkeys(trials.cell_hash)),
        analysis=_analysis_options(spec),
        # what the looks read a metric's range from (the cells' tasks: analysis.claims.bounded.range_of)
        cell_configs={c.cell_hash: c.config for c in ledger.cells(spec.name)},
    )


def _analysis_options(spec) -> dict[str, Any]:
    section = getattr(spec, "analysis", None)
    return section.model_dump(exclude_none=True) if section is not None else {}


def _code_version(provenance: dict[str, Any]) -> str:
    sha = str(provenance.get("git_sha", "unknown"))[:10]
    dirty = " (dirty)" if str(provenance.get("git_dirty", "")).lower() in ("true", "1", "yes") else ""
    return f"{sha}{dirty} v{provenance.get('studyrunner_version', '?')}"


def mixed_code_versions(trials: pd.DataFrame, provenance: dict[str, dict[str, Any]]) -> list[str]:
    """One line per cell whose finished seeds ran different code (git sha, dirty tree or package
    version): their spread may be the code's, not the seeds'."""
    lines = []
    done = trials[trials.status.isin(FINISHED)]
    for cell_hash, group in done.groupby("cell_hash", sort=False):
        versions: dict[str, int] = {}
        for key in group.trial_key:
            if key in provenance:
                version = _code_version(provenance[key])
                versions[version] = versions.get(version, 0) + 1
        if len(versions) > 1:
            label = group.cell.iloc[0] if "cell" in group else cell_hash
            shown = ", ".join(f"{v} ({n} seeds)" for v, n in sorted(versions.items(), key=lambda kv: -kv[1]))
            lines.append(f"cell {label} [{cell_hash}] mixes code versions: {shown}")
    return lines


def _spec_from_text(text: str, name: str):
    """(spec, compiled, error): the stored study file, parsed and compiled; spec None and the reason when
    today's schema no longer accepts it (claims, rule and metric then come from nowhere: say so)."""
    from ..study import compile_study, loads

    try:
        spec = loads(text, source=f"<study {name} in the ledger>")
    except SpecError as exc:
        first = (str(exc).strip().splitlines() or ["unreadable"])[0]
        return (
            None,
            None,
            (
                f"the study file stored for {name!r} does not load with this studyrunner ({first}); its claims, "
                "failure rule and metric are unknown: pass the study file instead of the name"
            ),
        )
    try:
        return spec, compile_study(spec), ""
    except SpecError:
        return spec, None, ""


def from_frame(
    trials: pd.DataFrame,
    name: str = "study",
    metric: str = "eval_accuracy",
    mode: str = "max",
    failure: str | None = None,
    claims: list | None = None,
    analysis: dict[str, Any] | None = None,
) -> StudyData:
    """A StudyData from a trials frame in `results.trials_frame`'s shape (tests, notebooks); `claims`:
    strings, mappings {claim, min_effect} or ClaimEntry."""
    rule = parse_rule(failure) if failure else None
    trials = annotate(trials.reset_index(drop=True), rule)
    configs = {}
    for cell_hash, group in trials.groupby("cell_hash", sort=False):
        flat = {c: group[c].iloc[0] for c in group.columns if "." in c and not _missing(group[c].iloc[0])}
        configs[cell_hash] = unflatten(flat)
    data = StudyData(
        name,
        trials,
        metric,
        mode,
        [ClaimEntry.model_validate(c) for c in claims or []],
        rule,
        int((~trials.status.isin(FINISHED)).sum()),
        cells_order=list(dict.fromkeys(trials.cell_hash)),
        analysis=dict(analysis or {}),
    )
    data.cell_configs = configs
    return data


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    """{'model.params.loops': 4} -> {'model': {'params': {'loops': 4}}} (flatten_config's inverse)."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                break
        else:
            node[leaf] = value
    return out
