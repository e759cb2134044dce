"""Optuna searches through Ray Tune (`search:` in a study file; the block's rules are study/search_space.py's).

Each grid cell of a search study (the study itself when it has no grid) runs one search: an Optuna study named
`STUDY` (`STUDY.GRIDCELLHASH` with a grid) that Ray Tune's `OptunaSearch` asks for configurations. A
configuration becomes a cell as a grid value would (its resolved config hashed) and runs once per seed in
`seeds:`: each (configuration, seed) is an ordinary ledger trial and Tune trial, so `status`, `results`,
`analyze` and `rerun` work on it. The ledger's `search_points` table records which suggestion (Optuna study,
trial number) each cell came from.

What Optuna is told: once every seed of a configuration has finished, the mean of the study's metric over the
seeds that finished with a finite value of it (succeeded ones, and diverged ones: a diverged seed keeps its
metrics, as everywhere in studyrunner; analysis/search_history.py, `seed_mean`). Failed seeds (a code error, retries
spent) are left out of the mean; with no seed left the Optuna trial is FAIL, which samplers skip. The point's
ledger row keeps the value and how many seeds it averages. Optuna trials cannot change once told, so a later
`rerun` of a seed, or a seed added to `seeds:`, changes the ledger, not what Optuna was told: the search's
summary and `analyze` give each configuration's value from the ledger's current trials (and show what Optuna
was told beside it).

Where the Optuna study lives, and the ledger's record of the suggestions: search_storage.py. Optuna's objects (the
space's distributions, the seeded sampler, one grid cell's Optuna study and Tune's `OptunaSearch` on it):
search_optuna.py. The run that takes a search and runs it: commands/study_run.py.

Continuing a search: the ledger decides what finished. Each submit (or resume) first reconciles the two
stores: a suggestion Optuna holds but the ledger lacks (a driver killed between the two writes) is recorded;
a point whose seeds have all finished but that Optuna was not told of is told now (and an outcome Optuna has
but the ledger lacks is copied); a point with unfinished seeds runs those seeds before anything new is
asked; an Optuna study that was deleted is rebuilt from the ledger's points. `n_trials` counts
configurations, those of earlier submits included: a finished search runs nothing when submitted again,
and a larger `n_trials` asks for the difference.

A search runs from one submit at a time: a submit takes the study's search in the ledger (`claim_owner`, one
conditional UPDATE, so of two submits started at once exactly one runs it; the other says so and exits) and
gives it back when it ends; a holder that died is taken over. An edit of the space that Optuna cannot continue
(a path's kind, a choice's values, a range's log scale) is refused before anything is written. A suggestion
Optuna began but never gave every searched value (a submit that failed or was killed while asking) is told
FAIL and recorded `abandoned`: it never runs with a value missing, and it does not count in `n_trials`.

Reproducible suggestions: suggestion n is drawn by a fresh sampler seeded from (`search.seed`, n)
(search_optuna.py), so a search continued after a crash suggests what the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...analysis.search_history import current_outcome, seed_mean
from ...errors import SpecError, StudyrunnerError
from ...store import Ledger
from ...store.status import FINISHED
from ...study import CompiledStudy, Trial
from ...study.compiled import Cell
from ...study.compiler import search_cell, with_cells
from .feed import TrialFeed
from .search_optuna import CellSearch, rebuild, refuse_changed_space
from .search_storage import ABANDONED, TOLD, open_storage, with_search_cells


@dataclass
class _Point:
    """One suggestion (Optuna trial `number` of `search`) and the trials of the cell its values make."""

    search: CellSearch
    number: int
    params: dict[str, Any]
    cell: Cell | None
    trials: list[Trial] = field(default_factory=list)
    asked_as: str | None = None  # OptunaSearch's id for it, when this process asked for it

    @property
    def keys(self) -> list[str]:
        return [t.trial_key for t in self.trials]


# ------------------------------------------------------------------------------------- the run


class SearchRun(TrialFeed):
    """One submit's share of a study's searches: reconcile the ledger and Optuna, then give Ray Tune its
    trials (`searcher`, feed.py), telling Optuna of each configuration when its seeds have finished. A feed of
    a `StudyRun` (commands/study_run.py)."""

    taken_as = "search"  # Optuna is asked in turn: one submit runs a search at a time
    brings = "new suggestions"
    says_plan = True

    def __init__(self, compiled: CompiledStudy, ledger: Ledger, db_url: str, say: Callable[[str], None]) -> None:
        super().__init__()
        self.ledger, self.say = ledger, say
        self.name = compiled.study.name
        self.compiled = with_search_cells(compiled, ledger)
        self._db_url = db_url
        self._storage = None  # opened by the submit that holds the search, when it first needs it
        self._searches: dict[str, CellSearch] | None = None
        self.open: dict[tuple[str, int], _Point] = {}  # suggested, not yet told
        self._turn = 0

    @property
    def searches(self) -> dict[str, CellSearch]:
        if self._searches is None:
            if self._storage is None:
                self._storage = open_storage(self._db_url)
            self._searches = {}
            for base in self.compiled.bases:
                search = CellSearch(self.compiled.study, base, self._storage)
                self._searches[search.name] = search
        return self._searches

    def check(self, refuse: Callable[[CompiledStudy], None]) -> None:
        """Before the search is taken: refuse an edit that changes cells that ran (the recorded suggestions')."""
        refuse(self.compiled)

    def prepare(self, refuse: Callable[[CompiledStudy], None]) -> None:
        """Once the search is this submit's: refuse a space Optuna cannot continue, then make the ledger and the
        Optuna study agree (`reconcile`)."""
        self.refuse_changed_space()
        self.ledger.register(self.compiled)
        self.reconcile()

    def refuse_changed_space(self) -> None:
        """Refuse, before anything is written, a space Optuna cannot continue (search_optuna.py)."""
        refuse_changed_space(self.compiled.study, self.searches.values())

    # --- before Tune: make the ledger and Optuna agree ------------------------------------------------

    def reconcile(self) -> None:
        """Record suggestions Optuna holds that the ledger lacks; tell Optuna of points whose seeds all finished;
        keep the rest open (their unfinished seeds run first). Updates `compiled` with any cell recorded."""
        from optuna.trial import TrialState

        rows = {(p.search, p.number): p for p in self.ledger.search_points(self.name)}
        for search in self.searches.values():
            trials = {t.number: t for t in search.optuna.get_trials(deepcopy=False)}
            missing = sorted(n for (name, n) in rows if name == search.name and n not in trials)
            if missing:  # the Optuna study was deleted or replaced: the ledger has what it held
                rebuild(search, [rows[(search.name, n)] for n in missing], bool(trials), self.ledger.url)
                self.say(
                    f"the Optuna study {search.name} lacked the ledger's {len(missing)} suggestions: rebuilt from "
                    "the ledger"
                )
                trials = {t.number: t for t in search.optuna.get_trials(deepcopy=False)}
            space = set(self.compiled.study.search.space)
            for number, trial in sorted(trials.items()):
                row = rows.get((search.name, number))
                if row is None:  # asked for, then the driver died (or the submit failed) before the ledger heard
                    undrawn = sorted(space - set(trial.params))
                    if trial.state is TrialState.RUNNING and not undrawn:
                        self._record(search, number, dict(trial.params), asked_as=None)
                    elif undrawn:
                        self._abandon(search, number, f"Optuna began it without {', '.join(undrawn)}")
                    else:
                        self._abandon(search, number, f"Optuna holds it {trial.state.name} unrecorded by the ledger")
                    continue
                search.points[number] = row.state
                if row.state == ABANDONED:
                    self._abandon(search, number, row.error or "abandoned")  # Optuna told FAIL, if it was not
                    continue
                if row.state in TOLD:
                    if trial.state is TrialState.RUNNING:  # the ledger has the outcome, Optuna missed it
                        point = _Point(search, number, dict(row.params), None)
                        self._tell_optuna(point, row.value if row.state == "complete" else None, row.seeds)
                    continue
                if trial.state in (TrialState.COMPLETE, TrialState.FAIL):  # told, then the driver died
                    value = trial.value if trial.state is TrialState.COMPLETE else None
                    self._mark_told(
                        _Point(search, number, dict(row.params), None), value, trial.user_attrs.get("seeds")
                    )
                    continue
                cell = self._cell(search, row.params)
                point = _Point(search, number, dict(row.params), cell, self._trials(cell))
                self.open[(search.name, number)] = point
                self._tell_if_done(point)
        cells = [p.cell for p in self.open.values() if p.cell is not None]
        self.compiled = with_cells(self.compiled, cells)

    def plan(self) -> str:
        spec = self.compiled.study.search
        done = sum(state != ABANDONED for s in self.searches.values() for state in s.points.values())
        told = sum(state in TOLD for s in self.searches.values() for state in s.points.values())
        per = f" in each of {len(self.searches)} grid cells" if len(self.searches) > 1 else ""
        return (
            f"search ({spec.algorithm} {spec.sampler}, seed {spec.seed}): {spec.n_trials} configurations x "
            f"{len(self.compiled.study.seed_values)} seeds{per}; {done} suggested so far ({told} evaluated)"
        )

    def can_ask(self) -> bool:
        return any(s.budget > 0 for s in self.searches.values())

    # --- Ray Tune (feed.py) ----------------------------------------------------------------------------

    def refill(self) -> bool:
        """A new suggestion from the next search with budget and a free slot (its seeds queued)."""
        search = self._next_search()
        if search is None:
            return False
        self._ask(search)
        return True

    def _next_search(self) -> CellSearch | None:
        """The next search (round robin over grid cells) that has budget and a free slot."""
        limit = self.compiled.study.search.max_concurrent
        searches = list(self.searches.values())
        for i in range(len(searches)):
            search = searches[(self._turn + i) % len(searches)]
            busy = sum(p.search is search for p in self.open.values())
            if search.budget > 0 and busy < limit:
                self._turn = (self._turn + i + 1) % len(searches)
                return search
        return None

    def _ask(self, search: CellSearch) -> None:
        """One new suggestion from OptunaSearch: recorded, its seeds queued (or, when they all ran before,
        told at once from the ledger)."""
        asked_as = f"{search.name}#{search.asked}"
        search.asked += 1
        search.sampler.last_number = None
        try:
            params = search.tuner_search.suggest(asked_as)
        except Exception as exc:  # noqa: BLE001 - whatever failed, no suggestion may stay half asked
            number = search.sampler.last_number
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if number is not None:
                self._abandon(search, number, f"asking for it failed ({type(exc).__name__}: {first})")
            raise StudyrunnerError(
                f"search {search.name}: Optuna could not make a suggestion ({type(exc).__name__}: {first}); "
                "what it began is told failed, and submitting again continues the search"
            ) from None
        number = search.sampler.last_number
        point = self._record(search, number, params, asked_as)
        if point.cell is not None:
            self.run_new(point.cell, point.trials)

    def _record(self, search: CellSearch, number: int, params: dict[str, Any], asked_as: str | None) -> _Point:
        """A suggestion into the ledger: its cell and trials (registered as a grid cell's), then its point row;
        a suggestion whose values make no valid config is failed at once."""
        try:
            cell = self._cell(search, params, strict=True)
        except SpecError as exc:
            point = _Point(search, number, params, None, asked_as=asked_as)
            self.ledger.add_search_point(
                self.name, search.name, number, search.base.cell_hash, params, None, state="failed", error=str(exc)
            )
            search.points[number] = "failed"
            self._tell_optuna(point, None, 0)
            self.say(f"{search.name} #{number}: {_shown(params)} is not a valid config ({exc}); told failed")
            return point
        point = _Point(search, number, params, cell, self._trials(cell), asked_as)
        self.ledger.register(with_cells(CompiledStudy(self.compiled.study, [], bases=self.compiled.bases), [cell]))
        self.compiled = with_cells(self.compiled, [cell])
        self.ledger.add_search_point(self.name, search.name, number, search.base.cell_hash, params, cell.cell_hash)
        search.set_user_attrs(number, {"cell_hash": cell.cell_hash, "label": cell.label})
        search.points[number] = "running"
        self.open[(search.name, number)] = point
        self._tell_if_done(point)
        return point

    def _abandon(self, search: CellSearch, number: int, why: str) -> None:
        """A suggestion Optuna began that must never run (not every searched value drawn): told FAIL, and
        recorded `abandoned` (not counted in n_trials, so the search asks for another)."""
        from optuna.trial import TrialState

        trial = search.storage.get_trial(search.trial_id(number))
        if trial.state is TrialState.RUNNING:
            search.optuna.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        known = search.points.get(number) == ABANDONED
        self.ledger.add_search_point(
            self.name, search.name, number, search.base.cell_hash, dict(trial.params), None, state=ABANDONED, error=why
        )
        search.points[number] = ABANDONED
        if not known:
            self.say(f"{search.name} #{number}: {why}; told failed, never run, not counted in n_trials")

    def _cell(self, search: CellSearch, params: dict[str, Any], strict: bool = False) -> Cell:
        try:
            return search_cell(self.compiled.study, search.base, params)
        except SpecError:
            if strict:
                raise
            raise StudyrunnerError(
                f"search {search.name}: recorded values {_shown(params)} no longer make a valid config under "
                f"{self.compiled.study.source}; submit the edited file as a new study (--as-new-study NAME)"
            ) from None

    def _trials(self, cell: Cell | None) -> list[Trial]:
        if cell is None:
            return []
        return with_cells(CompiledStudy(self.compiled.study, []), [cell]).trials

    def finished(self, keys: list[str], error: bool) -> None:
        """A Tune trial ended: tell Optuna of every configuration it was the last unfinished seed of."""
        for point in [p for p in self.open.values() if set(p.keys) & set(keys)]:
            self._tell_if_done(point)

    # --- telling Optuna ------------------------------------------------------------------------------

    def _tell_if_done(self, point: _Point) -> bool:
        """Tell Optuna of `point` when every seed of its cell has finished (the ledger says so)."""
        rows = self.ledger.trials(self.name, point.keys)
        if len(rows) < len(point.keys):
            return False
        if any(r.status not in FINISHED and r.trial_key not in self._errored for r in rows):
            return False
        self._tell(point, rows)
        return True

    def _tell(self, point: _Point, rows=None) -> None:
        rows = rows if rows is not None else self.ledger.trials(self.name, point.keys)
        metric = self.compiled.study.metric.name
        value, seeds = seed_mean(
            (r.status, (r.metrics or {}).get(metric)) for r in rows if r.trial_key not in self._errored
        )
        self._tell_optuna(point, value, seeds)
        self._mark_told(point, value, seeds)
        label = point.cell.label if point.cell else _shown(point.params)
        outcome = f"{metric} {value:.4g} (mean of {seeds} seeds)" if value is not None else "no seed reported it"
        self.say(f"{point.search.name} #{point.number} ({label}): {outcome}")

    def _tell_optuna(self, point: _Point, value: float | None, seeds: int | None) -> None:
        """Tell Optuna the point's value (None: FAIL). Through Ray's OptunaSearch when this process asked for the
        point; directly otherwise, and when OptunaSearch could not (it logs the error and goes on)."""
        from optuna.trial import TrialState

        search = point.search
        if not search.running(point.number):
            return
        search.set_user_attrs(point.number, {"seeds": seeds or 0})
        if point.asked_as is not None:
            result = {self.compiled.study.metric.name: value} if value is not None else None
            search.tuner_search.on_trial_complete(point.asked_as, result, error=value is None)
        if search.running(point.number):
            state = TrialState.COMPLETE if value is not None else TrialState.FAIL
            search.optuna.tell(point.number, value, state=state, skip_if_finished=True)

    def _mark_told(self, point: _Point, value: float | None, seeds: int | None) -> None:
        state = "complete" if value is not None else "failed"
        self.ledger.tell_search_point(self.name, point.search.name, point.number, state, value, seeds)
        point.search.points[point.number] = state
        self.open.pop((point.search.name, point.number), None)

    # --- afterwards ----------------------------------------------------------------------------------

    def summary(self) -> list[str]:
        """A line per search: configurations evaluated, and the best so far with its values, each configuration's
        value from the ledger's current trials (a later `rerun` or added seed included; analysis/search_history.py)."""
        lines = []
        mode = self.compiled.study.metric.mode
        metric = self.compiled.study.metric.name
        by_cell: dict[str, list] = {}
        for r in self.ledger.trials(self.name):
            by_cell.setdefault(r.cell_hash, []).append((r.status, (r.metrics or {}).get(metric)))
        by_search: dict[str, list] = {}
        for p in self.ledger.search_points(self.name):
            if p.state != ABANDONED:
                outcome = current_outcome(p.state, p.value, p.seeds, by_cell.get(p.cell_hash, []))
                by_search.setdefault(p.search, []).append((p, *outcome))
        for name in self.searches:
            points = by_search.get(name, [])
            scored = [(p, value, seeds) for p, state, value, seeds in points if state == "complete"]
            evaluated = sum(state in TOLD for _, state, _, _ in points)
            line = f"search {name}: {len(points)} of {self.compiled.study.search.n_trials} configurations"
            line += f", {evaluated} evaluated"
            if scored:
                best, value, seeds = (max if mode == "max" else min)(scored, key=lambda s: s[1])
                line += (
                    f"; best {metric} {value:.4g} over {seeds} seeds (#{best.number}: {_shown(best.params)}, "
                    f"cell {best.cell_hash})"
                )
            if len(points) - evaluated:
                line += f"; {len(points) - evaluated} not finished (submit again to finish them)"
            lines.append(line)
        return lines


def _shown(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={float(f'{v:.4g}') if isinstance(v, float) else v}" for k, v in params.items())
