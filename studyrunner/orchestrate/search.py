"""Optuna searches through Ray Tune (`search:` in a study file; the block's rules are study/search.py's).

Each grid cell of a search study (the study itself when it has no grid) runs one search: an Optuna study named
`STUDY` (`STUDY.GRIDCELLHASH` with a grid) that Ray Tune's `OptunaSearch` asks for configurations. A
configuration becomes a cell as a grid value would (its resolved config hashed) and runs once per seed in
`seeds:`: each (configuration, seed) is an ordinary ledger trial and Tune trial, so `status`, `results`,
`analyze` and `rerun` work on it. The ledger's `search_points` table records which suggestion (Optuna study,
trial number) each cell came from.

What Optuna is told: once every seed of a configuration has finished, the mean of the study's metric over the
seeds that finished with a finite value of it (succeeded ones, and diverged ones: a diverged seed keeps its
metrics, as everywhere in studyrunner; analysis/search.py, `seed_mean`). Failed seeds (a code error, retries
spent) are left out of the mean; with no seed left the Optuna trial is FAIL, which samplers skip. The point's
ledger row keeps the value and how many seeds it averages. Optuna trials cannot change once told, so a later
`rerun` of a seed, or a seed added to `seeds:`, changes the ledger, not what Optuna was told: the search's
summary and `analyze` give each configuration's value from the ledger's current trials (and show what Optuna
was told beside it).

Where the Optuna study lives: beside the ledger and apart from its tables (Optuna's tables include `studies`
and `trials`, as the ledger's do): the SQLite file `NAME.optuna.db` next to an SQLite ledger `NAME.db`, or
the schema `studyrunner_optuna` in a PostgreSQL ledger's database.

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

Reproducible suggestions: suggestion n is drawn by a fresh sampler seeded from (`search.seed`, n), so a search
continued after a crash suggests what the uninterrupted one would have, given the same earlier values (with
`max_concurrent: 1`, where each suggestion follows the previous one's value, and CPU trials, which are
deterministic).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import inspect, make_url, text

from ..analysis.search import current_outcome, seed_mean
from ..errors import SpecError, StudyrunnerError
from ..store import Ledger
from ..store.db import FINISHED, make_engine
from ..store.ledger import database_errors
from ..study import CompiledStudy, Trial
from ..study.compiled import Cell
from ..study.compiler import search_cell, with_cells
from .feed import TrialFeed

OPTUNA_SCHEMA = "studyrunner_optuna"
TOLD = ("complete", "failed")
ABANDONED = "abandoned"  # Optuna began it, not every searched value was drawn: told FAIL, never run


# ------------------------------------------------------------------------------------ where it lives


def optuna_location(db_url: str) -> tuple[str, dict[str, Any]]:
    """(Optuna storage URL, engine arguments) for the ledger at `db_url`: its own SQLite file beside an SQLite
    ledger, or its own schema in a PostgreSQL ledger's database."""
    url = make_url(db_url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        path = Path(url.database or "")
        beside = path.with_name(f"{path.stem}.optuna{path.suffix or '.db'}")
        return f"sqlite:///{beside}", {}
    if backend == "postgresql":
        return db_url, {"connect_args": {"options": f"-c search_path={OPTUNA_SCHEMA}"}}
    raise StudyrunnerError(
        f"search: a search keeps its Optuna study beside the ledger, on SQLite or PostgreSQL; {backend} ledgers "
        "are not supported (--db / STUDYRUNNER_DB)"
    )


def open_storage(db_url: str):
    """Optuna's RDBStorage for the ledger at `db_url` (tables made on first use; on PostgreSQL in its schema)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created": the console says what matters
    url, engine_kwargs = optuna_location(db_url)
    shown = make_url(url).render_as_string(hide_password=True)
    with database_errors(url, option="the ledger's Optuna storage (--db / STUDYRUNNER_DB)"):
        if engine_kwargs:  # PostgreSQL: the schema first (only where missing: making one needs the right to)
            engine = make_engine(db_url)
            try:
                if OPTUNA_SCHEMA not in inspect(engine).get_schema_names():
                    with engine.begin() as conn:
                        conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{OPTUNA_SCHEMA}"'))
            finally:
                engine.dispose()
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        except (RuntimeError, ValueError) as exc:  # an Optuna schema this Optuna cannot use
            first = str(exc).strip().splitlines()[0]
            raise StudyrunnerError(f"cannot use the Optuna storage {shown!r}: {first}") from None


def search_name(study: str, base: Cell) -> str:
    """The Optuna study of the search in grid cell `base`: the study's name, with the grid cell's hash."""
    return f"{study}.{base.cell_hash}" if base.overrides else study


def with_search_cells(compiled: CompiledStudy, ledger: Ledger) -> CompiledStudy:
    """A search study with the cells its recorded suggestions make under this study file (recompiled from
    their values, so an edit of what they share gives new hashes, which `submit` refuses as for a grid)."""
    if compiled.study.search is None:
        return compiled
    bases = {search_name(compiled.study.name, b): b for b in compiled.bases}
    cells = []
    for point in ledger.search_points(compiled.study.name):
        base = bases.get(point.search)
        if point.cell_hash is None or base is None:  # an invalid suggestion, or a grid cell the file dropped
            continue
        try:
            cells.append(search_cell(compiled.study, base, point.params))
        except SpecError:
            continue  # no longer a valid config under this file: the refusal of changed cells says so
    return with_cells(compiled, cells)


# ------------------------------------------------------------------------------------------ Optuna


def _distribution(domain):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if domain.kind == "choice":
        return CategoricalDistribution(list(domain.choices))
    if domain.kind == "int":
        return IntDistribution(int(domain.low), int(domain.high))
    return FloatDistribution(float(domain.low), float(domain.high), log=domain.kind == "loguniform")


def _described(distribution) -> str:
    """An Optuna distribution as a study file writes its range."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(distribution, CategoricalDistribution):
        return f"{{choice: {list(distribution.choices)}}}"
    kind = "int" if isinstance(distribution, IntDistribution) else "loguniform" if distribution.log else "uniform"
    return f"{{{kind}: [{distribution.low}, {distribution.high}]}}"


def _sampler_class(name: str):
    import optuna

    return {
        "tpe": optuna.samplers.TPESampler,
        "gp": optuna.samplers.GPSampler,
        "cmaes": optuna.samplers.CmaEsSampler,
        "random": optuna.samplers.RandomSampler,
    }[name]


def seeded_sampler(name: str, seed: int):
    """An Optuna sampler whose suggestion n is drawn by a fresh `name` sampler seeded from (seed, n): what it
    suggests depends on the study's history and n, not on how many suggestions this process made before."""
    import numpy as np
    from optuna.samplers import BaseSampler

    make = _sampler_class(name)

    class SeededPerSuggestion(BaseSampler):
        def __init__(self) -> None:
            self._by_number: dict[int, BaseSampler] = {}
            self.last_number: int | None = None  # the trial the latest `ask` made

        def _for(self, trial) -> BaseSampler:
            sampler = self._by_number.get(trial.number)
            if sampler is None:
                drawn = int(np.random.SeedSequence([seed, trial.number]).generate_state(1)[0])
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # ExperimentalWarning on some samplers and Optuna versions
                    sampler = self._by_number[trial.number] = make(seed=drawn)
            return sampler

        def infer_relative_search_space(self, study, trial):
            return self._for(trial).infer_relative_search_space(study, trial)

        def sample_relative(self, study, trial, search_space):
            return self._for(trial).sample_relative(study, trial, search_space)

        def sample_independent(self, study, trial, param_name, param_distribution):
            return self._for(trial).sample_independent(study, trial, param_name, param_distribution)

        def before_trial(self, study, trial) -> None:
            self.last_number = trial.number
            self._for(trial).before_trial(study, trial)

        def after_trial(self, study, trial, state, values) -> None:
            self._for(trial).after_trial(study, trial, state, values)
            self._by_number.pop(trial.number, None)

        def reseed_rng(self) -> None:  # the seed is the study file's
            pass

    return SeededPerSuggestion()


# --------------------------------------------------------------------------------------- one search


@dataclass
class _Point:
    search: _Search
    number: int
    params: dict[str, Any]
    cell: Cell | None
    trials: list[Trial] = field(default_factory=list)
    asked_as: str | None = None  # OptunaSearch's id for it, when this process asked for it

    @property
    def keys(self) -> list[str]:
        return [t.trial_key for t in self.trials]


class _Search:
    """The search of one grid cell: Ray Tune's OptunaSearch on the Optuna study `name`, and the points the
    ledger records for it."""

    def __init__(self, run: SearchRun, base: Cell, storage) -> None:
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        spec, study = run.compiled.study.search, run.compiled.study
        self.run, self.base = run, base
        self.name = search_name(study.name, base)
        self.sampler = seeded_sampler(spec.sampler, spec.seed)
        self.tuner_search = OptunaSearch(
            space={path: _distribution(d) for path, d in spec.space.items()},
            metric=study.metric.name,
            mode=study.metric.mode,
            sampler=self.sampler,
            study_name=self.name,
            storage=storage,
        )
        # The same Optuna study by name, for what OptunaSearch has no call for: telling a trial another
        # process asked for, reading every trial's state.
        self.optuna = optuna.load_study(study_name=self.name, storage=storage, sampler=optuna.samplers.RandomSampler())
        self.storage = storage
        self.points: dict[int, str] = {}  # number -> state, as the ledger has it
        self.asked = 0

    @property
    def budget(self) -> int:
        counted = sum(state != ABANDONED for state in self.points.values())
        return self.run.compiled.study.search.n_trials - counted

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(
            self.storage.get_study_id_from_name(self.name), number
        )

    def running(self, number: int) -> bool:
        from optuna.trial import TrialState

        return self.storage.get_trial(self.trial_id(number)).state is TrialState.RUNNING

    def set_user_attrs(self, number: int, attrs: dict[str, Any]) -> None:
        """Attributes of a running Optuna trial (a finished one cannot change), for optuna-dashboard users."""
        if self.running(number):
            for key, value in attrs.items():
                self.storage.set_trial_user_attr(self.trial_id(number), key, value)


# ------------------------------------------------------------------------------------- the run


class SearchRun(TrialFeed):
    """One submit's share of a study's searches: reconcile the ledger and Optuna, then give Ray Tune its
    trials (`searcher`, feed.py), telling Optuna of each configuration when its seeds have finished."""

    def __init__(self, compiled: CompiledStudy, ledger: Ledger, db_url: str, say: Callable[[str], None]) -> None:
        super().__init__()
        self.ledger, self.say = ledger, say
        self.name = compiled.study.name
        self.compiled = with_search_cells(compiled, ledger)
        self._db_url = db_url
        self._storage = None  # opened by the submit that holds the search, when it first needs it
        self._searches: dict[str, _Search] | None = None
        self.open: dict[tuple[str, int], _Point] = {}  # suggested, not yet told
        self._turn = 0

    @property
    def searches(self) -> dict[str, _Search]:
        if self._searches is None:
            if self._storage is None:
                self._storage = open_storage(self._db_url)
            self._searches = {}
            for base in self.compiled.bases:
                search = _Search(self, base, self._storage)
                self._searches[search.name] = search
        return self._searches

    def refuse_changed_space(self) -> None:
        """Refuse, before anything is written, a space Optuna cannot continue: a searched path whose kind
        changed (int to choice, uniform to loguniform) or whose choices changed since its recorded suggestions,
        by Optuna's own rule (`check_distribution_compatibility`). Asked anyway, Optuna fails half way through a
        suggestion, some of its values drawn. A range made wider or narrower continues."""
        from optuna.distributions import check_distribution_compatibility

        study = self.compiled.study
        for search in self.searches.values():
            recorded: dict[str, Any] = {}
            for trial in search.optuna.get_trials(deepcopy=False):
                for path, distribution in trial.distributions.items():
                    recorded.setdefault(path, distribution)
            for path, domain in study.search.space.items():
                old, new = recorded.get(path), _distribution(domain)
                if old is None:
                    continue
                try:
                    check_distribution_compatibility(old, new)
                except ValueError:
                    raise StudyrunnerError(
                        f"{study.source}: search.space['{path}'] is {_described(new)} but the search's recorded "
                        f"suggestions drew it from {_described(old)}, and Optuna cannot continue a search whose path "
                        "changes kind or choices: put the range back, or run the edited file as a new search: "
                        f"studyrunner submit {study.source} --as-new-study NAME"
                    ) from None

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
                self._rebuild(search, [rows[(search.name, n)] for n in missing], bool(trials))
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

    def _rebuild(self, search: _Search, points: list, partial: bool) -> None:
        """Give an emptied Optuna study the suggestions the ledger records, in order, with their outcomes."""
        from optuna.trial import TrialState, create_trial

        space = self.compiled.study.search.space
        try:
            if partial or [p.number for p in points] != list(range(len(points))):
                raise ValueError("it holds other trials")
            for p in points:
                params = {k: v for k, v in p.params.items() if k in space}
                ended = {"complete": TrialState.COMPLETE, "failed": TrialState.FAIL, ABANDONED: TrialState.FAIL}
                state = ended.get(p.state, TrialState.RUNNING)
                trial = create_trial(
                    params=params,
                    distributions={k: _distribution(space[k]) for k in params},
                    value=p.value if state is TrialState.COMPLETE else None,
                    state=state,
                    user_attrs={"cell_hash": p.cell_hash, "seeds": p.seeds or 0},
                )
                search.optuna.add_trial(trial)
        except ValueError as exc:  # a value outside today's range, numbers that cannot agree
            raise StudyrunnerError(
                f"the Optuna study {search.name!r} ({optuna_location(self.ledger.url)[0]}) lacks suggestions the "
                f"ledger records and cannot be rebuilt from it ({exc}); restore it, or run the search anew: "
                "studyrunner submit FILE --as-new-study NAME"
            ) from None
        self.say(
            f"the Optuna study {search.name} lacked the ledger's {len(points)} suggestions: rebuilt from the ledger"
        )

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

    def _next_search(self) -> _Search | None:
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

    def _ask(self, search: _Search) -> None:
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

    def _record(self, search: _Search, number: int, params: dict[str, Any], asked_as: str | None) -> _Point:
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

    def _abandon(self, search: _Search, number: int, why: str) -> None:
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

    def _cell(self, search: _Search, params: dict[str, Any], strict: bool = False) -> Cell:
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
        value from the ledger's current trials (a later `rerun` or added seed included; analysis/search.py)."""
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
