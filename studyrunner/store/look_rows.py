"""What a sequential study (`seeds: {start, max}`, orchestrate/feeds/waves.py) records: each look at its claims,
with the wave of trials the look adds."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from ..errors import StudyrunnerError
from .db import LookClaimRow, LookRow, TrialRow, json_safe
from .opening import LedgerDatabase


class Looks(LedgerDatabase):
    """A sequential study's looks (part of the `Ledger`)."""

    def record_look(
        self, study: str, look: dict[str, Any], claims: list[dict[str, Any]], trials: list[tuple[str, str, int]]
    ) -> None:
        """A look of a sequential study, its claims, and the trials (key, cell_hash, seed) of the wave it adds, in
        one transaction: after a crash the ledger holds the look and its wave, or neither. Raises StudyrunnerError
        when the look is already recorded (another process took it)."""
        try:
            with self.session() as s, s.begin():
                s.add(LookRow(study=study, **look))
                s.flush()
                for row in claims:
                    s.add(LookClaimRow(study=study, look=look["number"], **json_safe(row)))
                for key, cell_hash, seed in trials:
                    s.add(TrialRow(trial_key=key, study=study, cell_hash=cell_hash, seed=seed))
        except IntegrityError:
            raise StudyrunnerError(
                f"look {look['number']} of study {study!r} was recorded by another process meanwhile; submit again "
                "to continue from it"
            ) from None

    def looks(self, study: str) -> list[tuple[LookRow, list[LookClaimRow]]]:
        """The study's looks in order, each with its claims in the study file's order."""
        with self.session() as s:
            looks = list(s.scalars(select(LookRow).where(LookRow.study == study).order_by(LookRow.number)))
            claims = list(
                s.scalars(
                    select(LookClaimRow)
                    .where(LookClaimRow.study == study)
                    .order_by(LookClaimRow.look, LookClaimRow.claim)
                )
            )
        by_look: dict[int, list[LookClaimRow]] = {}
        for row in claims:
            by_look.setdefault(row.look, []).append(row)
        return [(look, by_look.get(look.number, [])) for look in looks]
