"""What a search (`search:`, orchestrate/feeds/search.py) records: each configuration Optuna suggested, the cell
it made, and what Optuna was told of it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from .db import SearchPointRow, utcnow
from .opening import LedgerDatabase


class SearchPoints(LedgerDatabase):
    """A search's points (part of the `Ledger`)."""

    def add_search_point(
        self,
        study: str,
        search: str,
        number: int,
        base_hash: str,
        params: dict[str, Any],
        cell_hash: str | None,
        *,
        state: str = "running",
        error: str | None = None,
    ) -> None:
        """Record a configuration a search suggested (Optuna trial `number` of Optuna study `search`) and the
        cell it made; a point already recorded is left as it is."""
        with self.session() as s, s.begin():
            if s.get(SearchPointRow, (study, search, number)) is None:
                s.add(
                    SearchPointRow(
                        study=study,
                        search=search,
                        number=number,
                        base_hash=base_hash,
                        cell_hash=cell_hash,
                        params=params,
                        state=state,
                        error=error,
                    )
                )

    def tell_search_point(
        self, study: str, search: str, number: int, state: str, value: float | None, seeds: int | None
    ) -> None:
        """What Optuna was told of a point: `complete` with the value (over `seeds` seeds), or `failed`."""
        with self.session() as s, s.begin():
            row = s.get(SearchPointRow, (study, search, number))
            row.state, row.value, row.seeds, row.told_at = state, value, seeds, utcnow()

    def search_points(self, study: str) -> list[SearchPointRow]:
        q = select(SearchPointRow).where(SearchPointRow.study == study)
        with self.session() as s:
            return list(s.scalars(q.order_by(SearchPointRow.search, SearchPointRow.number)))
