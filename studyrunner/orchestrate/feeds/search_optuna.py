"""Optuna's side of a search (search.py runs it): the space's distributions and the check that an edited space
can continue, the seeded sampler, one grid cell's Optuna study with Ray Tune's `OptunaSearch` on it, and an
emptied Optuna study rebuilt from the ledger.

An edit of the space that Optuna cannot continue (a path's kind, a choice's values, a range's log scale) is refused
before anything is written (`refuse_changed_space`).

Reproducible suggestions: suggestion n is drawn by a fresh sampler seeded from (`search.seed`, n), so a search
continued after a crash suggests what the uninterrupted one would have, given the same earlier values (with
`max_concurrent: 1`, where each suggestion follows the previous one's value, and CPU trials, which are
deterministic).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from ...errors import StudyrunnerError
from ...study.compiled import Cell
from .search_storage import ABANDONED, optuna_location, search_name

# ----------------------------------------------------------------------------------------- the space


def optuna_distribution(domain):
    """The Optuna distribution of a study file's range."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if domain.kind == "choice":
        return CategoricalDistribution(list(domain.choices))
    if domain.kind == "int":
        return IntDistribution(int(domain.low), int(domain.high))
    return FloatDistribution(float(domain.low), float(domain.high), log=domain.kind == "loguniform")


def described(distribution) -> str:
    """An Optuna distribution as a study file writes its range."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(distribution, CategoricalDistribution):
        return f"{{choice: {list(distribution.choices)}}}"
    kind = "int" if isinstance(distribution, IntDistribution) else "loguniform" if distribution.log else "uniform"
    return f"{{{kind}: [{distribution.low}, {distribution.high}]}}"


def refuse_changed_space(study, searches: Iterable[CellSearch]) -> None:
    """Refuse, before anything is written, a space Optuna cannot continue: a searched path whose kind
    changed (int to choice, uniform to loguniform) or whose choices changed since its recorded suggestions,
    by Optuna's own rule (`check_distribution_compatibility`). Asked anyway, Optuna fails half way through a
    suggestion, some of its values drawn. A range made wider or narrower continues."""
    from optuna.distributions import check_distribution_compatibility

    for search in searches:
        recorded: dict[str, Any] = {}
        for trial in search.optuna.get_trials(deepcopy=False):
            for path, distribution in trial.distributions.items():
                recorded.setdefault(path, distribution)
        for path, domain in study.search.space.items():
            old, new = recorded.get(path), optuna_distribution(domain)
            if old is None:
                continue
            try:
                check_distribution_compatibility(old, new)
            except ValueError:
                raise StudyrunnerError(
                    f"{study.source}: search.space['{path}'] is {described(new)} but the search's recorded "
                    f"suggestions drew it from {described(old)}, and Optuna cannot continue a search whose path "
                    "changes kind or choices: put the range back, or run the edited file as a new search: "
                    f"studyrunner submit {study.source} --as-new-study NAME"
                ) from None


# ----------------------------------------------------------------------------------------- the sampler


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


# ------------------------------------------------------------------------------- one grid cell's search


class CellSearch:
    """The search of one grid cell: Ray Tune's OptunaSearch on the Optuna study `name`, and the points the
    ledger records for it."""

    def __init__(self, study, base: Cell, storage) -> None:
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        spec = study.search
        self.study, self.base = study, base
        self.name = search_name(study.name, base)
        self.sampler = seeded_sampler(spec.sampler, spec.seed)
        self.tuner_search = OptunaSearch(
            space={path: optuna_distribution(d) for path, d in spec.space.items()},
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
        return self.study.search.n_trials - counted

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


def rebuild(search: CellSearch, points: list, partial: bool, ledger_url: str) -> None:
    """Give an emptied Optuna study the suggestions the ledger records (`points`, its `search_points` rows), in
    order, with their outcomes. `partial`: the Optuna study still holds trials, so the two cannot agree."""
    from optuna.trial import TrialState, create_trial

    space = search.study.search.space
    try:
        if partial or [p.number for p in points] != list(range(len(points))):
            raise ValueError("it holds other trials")
        for p in points:
            params = {k: v for k, v in p.params.items() if k in space}
            ended = {"complete": TrialState.COMPLETE, "failed": TrialState.FAIL, ABANDONED: TrialState.FAIL}
            state = ended.get(p.state, TrialState.RUNNING)
            trial = create_trial(
                params=params,
                distributions={k: optuna_distribution(space[k]) for k in params},
                value=p.value if state is TrialState.COMPLETE else None,
                state=state,
                user_attrs={"cell_hash": p.cell_hash, "seeds": p.seeds or 0},
            )
            search.optuna.add_trial(trial)
    except ValueError as exc:  # a value outside today's range, numbers that cannot agree
        raise StudyrunnerError(
            f"the Optuna study {search.name!r} ({optuna_location(ledger_url)[0]}) lacks suggestions the "
            f"ledger records and cannot be rebuilt from it ({exc}); restore it, or run the search anew: "
            "studyrunner submit FILE --as-new-study NAME"
        ) from None
