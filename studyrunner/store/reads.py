"""Reading the ledger: studies, cells, trials and their attempts, and trials per status. Any number of
readers (`status`, `results`, analysis) may read while a study runs."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import and_, func, or_, select

from ..errors import StudyrunnerError
from ..urls import mask_url
from .db import AttemptRow, CellRow, StudyRow, TrialRow
from .leases import STALE_AFTER_S, Leases
from .status import STATUSES, TrialStatus


class Reads(Leases):
    """The ledger's queries (part of the `Ledger`). Built on `Leases`: a trial is `stale` when the submission
    holding it is dead, which only the leases can say."""

    def studies(self) -> list[StudyRow]:
        with self.session() as s:
            return list(s.scalars(select(StudyRow).order_by(StudyRow.created_at)))

    def get_study(self, name: str) -> StudyRow:
        with self.session() as s:
            row = s.get(StudyRow, name)
        if row is None:
            known = ", ".join(r.name for r in self.studies()) or "none yet"
            raise StudyrunnerError(f"no study named {name!r} in {mask_url(self.url)}; known studies: {known}")
        return row

    def cells(self, study: str) -> list[CellRow]:
        with self.session() as s:
            return list(s.scalars(select(CellRow).where(CellRow.study == study)))

    def trials(
        self, study: str, keys: list[str] | None = None, statuses: tuple[str, ...] | None = None
    ) -> list[TrialRow]:
        """The study's trials (those of `keys`, those in `statuses`: filtered in SQL, so listing the few
        failed trials of a 100,000-trial study does not load the other 99,000)."""
        q = select(TrialRow).where(TrialRow.study == study).order_by(TrialRow.created_at, TrialRow.trial_key)
        if keys is not None:
            q = q.where(TrialRow.trial_key.in_(keys))
        if statuses is not None:
            q = q.where(TrialRow.status.in_(statuses))
        with self.session() as s:
            return list(s.scalars(q))

    def attempts(self, trial_key: str) -> list[AttemptRow]:
        with self.session() as s:
            q = select(AttemptRow).where(AttemptRow.trial_key == trial_key).order_by(AttemptRow.number)
            return list(s.scalars(q))

    def provenance(self, study: str) -> dict[str, dict[str, Any]]:
        """trial_key -> provenance of its latest attempt that reported one (code and runtime versions)."""
        q = (
            select(AttemptRow.trial_key, AttemptRow.number, AttemptRow.provenance)
            .join(TrialRow, TrialRow.trial_key == AttemptRow.trial_key)
            .where(TrialRow.study == study, AttemptRow.provenance.is_not(None))
            .order_by(AttemptRow.trial_key, AttemptRow.number)
        )
        with self.session() as s:
            return {key: prov for key, _n, prov in s.execute(q)}  # later attempts overwrite earlier

    def stale_keys(self, study: str | None = None, stale_after: float = STALE_AFTER_S) -> set[str]:
        """Unfinished trials nobody is running: held by a dead submission, or `running` with no holder
        (left by a driver from before leases existed). `resume` runs them; `status` shows them."""
        with self.session() as s:
            return set(s.scalars(select(TrialRow.trial_key).where(self._stale(study, stale_after))))

    def _stale(self, study: str | None, stale_after: float):
        dead = [r.id for r in self.dead_submissions(study, stale_after)]
        running = TrialRow.status == TrialStatus.RUNNING
        where = and_(
            TrialRow.status.in_((TrialStatus.PENDING, TrialStatus.RUNNING)),
            or_(TrialRow.owner.in_(dead), and_(running, TrialRow.owner.is_(None))),
        )
        return where if study is None else and_(where, TrialRow.study == study)

    def status_counts(self, study: str | None = None, stale_after: float = STALE_AFTER_S) -> dict[str, Counter]:
        """Trials per status per study; `stale` counts unfinished trials whose holder is gone."""
        q = select(TrialRow.study, TrialRow.status, func.count()).group_by(TrialRow.study, TrialRow.status)
        if study is not None:
            self.get_study(study)
            q = q.where(TrialRow.study == study)
        stale = (
            select(TrialRow.study, TrialRow.status, func.count())
            .where(self._stale(study, stale_after))
            .group_by(TrialRow.study, TrialRow.status)
        )
        out: dict[str, Counter] = {}
        with self.session() as s:
            for name, status, n in s.execute(q):
                out.setdefault(name, Counter({k: 0 for k in (*STATUSES, "stale")}))[status] = n
            for name, status, n in s.execute(stale):
                out[name][status] -= n
                out[name]["stale"] += n
        return out

    def trials_by_key(self, keys: list[str]) -> list[TrialRow]:
        with self.session() as s:
            return [
                r
                for i in range(0, len(keys), 500)
                for r in s.scalars(select(TrialRow).where(TrialRow.trial_key.in_(keys[i : i + 500])))
            ]
