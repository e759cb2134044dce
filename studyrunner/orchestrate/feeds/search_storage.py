"""Where a search's Optuna study lives, and the cells the ledger's record of a search makes (search.py runs it).

The Optuna study lives beside the ledger and apart from its tables (Optuna's tables include `studies` and
`trials`, as the ledger's do): the SQLite file `NAME.optuna.db` next to an SQLite ledger `NAME.db`, or the schema
`studyrunner_optuna` in a PostgreSQL ledger's database. The ledger's `search_points` rows say which suggestion
(Optuna study, trial number) each cell came from, and in which state (`TOLD`, `ABANDONED`, or still running).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect, make_url, text

from ...errors import SpecError, StudyrunnerError
from ...store import Ledger
from ...store.db import make_engine
from ...store.ledger import database_errors
from ...study import CompiledStudy
from ...study.compiled import Cell
from ...study.compiler import search_cell, with_cells

OPTUNA_SCHEMA = "studyrunner_optuna"
TOLD = ("complete", "failed")  # the ledger states of a point whose outcome Optuna was told
ABANDONED = "abandoned"  # Optuna began it, not every searched value was drawn: told FAIL, never run


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


# ------------------------------------------------------------------------------- what the ledger records


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
