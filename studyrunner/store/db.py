"""Ledger tables (SQLAlchemy 2.x). Portable types only: the same schema runs on SQLite and PostgreSQL."""

from __future__ import annotations

import math
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Integer,
    String,
    Text,
    create_engine,
    event,
    exc,
    make_url,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# A trial's statuses and the moves between them: status.py (re-exported here, where orchestrate imports them).
from .status import TrialStatus

# The tables that make a database a ledger (a database holding other tables is never made into one).
LEDGER_TABLES = frozenset({"studies", "cells", "trials"})
# Why an attempt ended without succeeding (attempts.error_class, trials.failure_class).
FAILURE_CLASSES = ("infrastructure", "error", "divergence", "interrupted", "cancelled")


def utcnow() -> datetime:
    return datetime.now(UTC)


def json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinities as null: a diverged trial's loss is NaN, which JSON (and PostgreSQL) refuse."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class StudyRow(Base):
    __tablename__ = "studies"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="")
    spec_text: Mapped[str] = mapped_column(Text)  # the study file as last submitted
    spec_hash: Mapped[str] = mapped_column(String(64))
    mlflow_experiment_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    # revision 0005: the submission running a study that runs from one submit at a time (a search, a sequential study)
    owner: Mapped[str | None] = mapped_column(String(36))


class CellRow(Base):
    __tablename__ = "cells"

    study: Mapped[str] = mapped_column(ForeignKey("studies.name"), primary_key=True)
    cell_hash: Mapped[str] = mapped_column(String(32), primary_key=True)
    label: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]]
    overrides: Mapped[dict[str, Any]]
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))  # the cell's parent run
    # [[kind, looped cell_hash], ...] when this cell is a matched baseline (`baselines:`); revision 0002
    baseline_of: Mapped[list | None] = mapped_column(JSON, nullable=True)


class TrialRow(Base):
    __tablename__ = "trials"
    __table_args__ = (ForeignKeyConstraint(["study", "cell_hash"], ["cells.study", "cells.cell_hash"]),)

    trial_key: Mapped[str] = mapped_column(String(160), primary_key=True)
    study: Mapped[str] = mapped_column(String(64), index=True)
    cell_hash: Mapped[str] = mapped_column(String(32))
    seed: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=TrialStatus.PENDING, index=True)  # TrialStatus
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any] | None]  # final metrics
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))  # one run per trial, across attempts
    # revision 0003: failure class of the last attempt; the lease (which submission holds the trial, and
    # when it last heard of it); whether MLflow lacks something the ledger has (`sync-mlflow` mends it)
    failure_class: Mapped[str | None] = mapped_column(String(32))
    owner: Mapped[str | None] = mapped_column(String(36), index=True)
    heartbeat_at: Mapped[datetime | None]
    mlflow_dirty: Mapped[bool] = mapped_column(Boolean, default=False)


class SubmissionRow(Base):
    """One `submit`/`resume`/`rerun` process: the holder of the leases on the trials it runs."""

    __tablename__ = "submissions"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    study: Mapped[str] = mapped_column(ForeignKey("studies.name"), index=True)
    command: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
    cancel_requested_at: Mapped[datetime | None]
    ray_session_dir: Mapped[str | None] = mapped_column(Text)  # a local Ray it started (cleaned after a crash)


class AttemptRow(Base):
    """One try of a trial: a Ray Tune run of it, or a retry after an infrastructure failure."""

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_key: Mapped[str] = mapped_column(ForeignKey("trials.trial_key"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # 1, 2, ... per trial
    submission: Mapped[str | None] = mapped_column(String(36))
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
    host: Mapped[str | None] = mapped_column(String(255))
    ray_trial_id: Mapped[str | None] = mapped_column(String(64))
    resumed_from_step: Mapped[int | None] = mapped_column(Integer)
    error_class: Mapped[str | None] = mapped_column(String(32))
    message: Mapped[str | None] = mapped_column(Text)  # how it started (a resume from step N), then how it ended
    traceback_artifact: Mapped[str | None] = mapped_column(Text)  # MLflow artifact path of the traceback
    provenance: Mapped[dict[str, Any] | None]  # code and runtime: git sha, versions, host, device


class TrialMetricRow(Base):
    """Final metrics in long format (trial x name -> value): plain SQL, the same on SQLite and PostgreSQL."""

    __tablename__ = "trial_metrics"

    trial_key: Mapped[str] = mapped_column(ForeignKey("trials.trial_key"), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    study: Mapped[str] = mapped_column(String(64), index=True)
    value: Mapped[float | None] = mapped_column(Float)


class CellParamRow(Base):
    """Resolved cell configs in long format (cell x dotted parameter path -> value)."""

    __tablename__ = "cell_params"
    __table_args__ = (ForeignKeyConstraint(["study", "cell_hash"], ["cells.study", "cells.cell_hash"]),)

    study: Mapped[str] = mapped_column(String(64), primary_key=True)
    cell_hash: Mapped[str] = mapped_column(String(32), primary_key=True)
    path: Mapped[str] = mapped_column(String(300), primary_key=True)
    value: Mapped[str] = mapped_column(Text)  # JSON text of the value
    value_num: Mapped[float | None] = mapped_column(Float)  # the value when it is a number (bools as 0/1)


class SearchPointRow(Base):
    """One configuration a search suggested (`search:`; revision 0004): an Optuna trial, by its study's name
    and trial number, and the cell it made. The Optuna study itself lives apart from these tables (its own
    SQLite file or PostgreSQL schema: orchestrate/feeds/search_storage.py); this row is the ledger's account of it."""

    __tablename__ = "search_points"
    __table_args__ = (ForeignKeyConstraint(["study", "cell_hash"], ["cells.study", "cells.cell_hash"]),)

    study: Mapped[str] = mapped_column(ForeignKey("studies.name"), primary_key=True)
    search: Mapped[str] = mapped_column(String(200), primary_key=True)  # the Optuna study's name
    number: Mapped[int] = mapped_column(Integer, primary_key=True)  # the Optuna trial's number
    base_hash: Mapped[str] = mapped_column(String(32))  # the grid cell the search runs in
    cell_hash: Mapped[str | None] = mapped_column(String(32))  # None: the values made no valid config
    params: Mapped[dict[str, Any]]  # path -> suggested value
    state: Mapped[str] = mapped_column(String(16), default="running")  # running | complete | failed
    value: Mapped[float | None] = mapped_column(Float)  # what Optuna was told: the seed mean of the metric
    seeds: Mapped[int | None] = mapped_column(Integer)  # how many seeds that mean is over
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    told_at: Mapped[datetime | None]


class LookRow(Base):
    """One look of a sequential study (`seeds: {start, max}`; revision 0006): the seeds per cell its data held and
    those after the wave it added (equal: it added none, the study's last look), in the same transaction as that
    wave's trials, so a resumed study replays it rather than deciding again."""

    __tablename__ = "looks"

    study: Mapped[str] = mapped_column(ForeignKey("studies.name"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)  # 1, 2, ...
    seeds: Mapped[dict[str, Any]]  # cell_hash -> seeds 0 .. n-1 the look's data held
    next_seeds: Mapped[dict[str, Any]]  # cell_hash -> seeds after the wave it added
    step: Mapped[int] = mapped_column(Integer)  # seeds the wave added per cell
    design: Mapped[dict[str, Any]]  # start, max, step, spending, alpha as the look used them; claim_entries
    claims: Mapped[list] = mapped_column(JSON)  # the claims' texts, in the study file's order
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class LookClaimRow(Base):
    """One claim at one look: its test's statistic and p, the information fraction, the boundary and the
    decision (analysis/sequential/looks.py ClaimLook)."""

    __tablename__ = "look_claims"
    __table_args__ = (ForeignKeyConstraint(["study", "look"], ["looks.study", "looks.number"]),)

    study: Mapped[str] = mapped_column(String(64), primary_key=True)
    look: Mapped[int] = mapped_column(Integer, primary_key=True)
    claim: Mapped[int] = mapped_column(Integer, primary_key=True)  # index in the study file's claims
    text: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(
        String(16)
    )  # sampling | supported | contradicted | futile | inconclusive | invalid
    analysed: Mapped[bool] = mapped_column(Boolean)  # False: carried from an earlier look
    decided_at: Mapped[int | None] = mapped_column(Integer)
    seeds: Mapped[int] = mapped_column(Integer)  # per side, the fewest, its test used
    fraction: Mapped[float | None] = mapped_column(Float)  # information fraction
    nominal: Mapped[float | None] = mapped_column(Float)  # one-sided level of this look
    boundary: Mapped[float | None] = mapped_column(Float)  # normal scale
    z: Mapped[float | None] = mapped_column(Float)
    p_claimed: Mapped[float | None] = mapped_column(Float)
    p_opposite: Mapped[float | None] = mapped_column(Float)
    p_sequential: Mapped[float | None] = mapped_column(Float)  # repeated p-value, once decided or ended
    estimate: Mapped[float | None] = mapped_column(Float)
    lo: Mapped[float | None] = mapped_column(Float)
    hi: Mapped[float | None] = mapped_column(Float)
    needed: Mapped[int | None] = mapped_column(Integer)  # seeds per side for 80% power (futility)
    test: Mapped[str] = mapped_column(Text)
    detail: Mapped[str] = mapped_column(Text)
    cells: Mapped[list] = mapped_column(JSON)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            # WAL lets `status` read while `submit` writes. It is a property of the file, so it is set only on a
            # ledger or an empty file about to be one: another application's database is refused as it was.
            tables = {row[0] for row in cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables or LEDGER_TABLES <= tables:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    else:
        # A blackholed database host would otherwise hang the command for minutes.
        connect_args = {"connect_timeout": 10} if url.startswith("postgresql") else {}
        engine = create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    return engine


def sqlite_reader(url: str) -> tuple[Engine, str]:
    """A read-only engine on the SQLite file of `url`, for the read verbs: nothing is written to the file
    or beside it. Returns (engine, mode): "read-only" (`mode=ro`), or, where even that cannot open it (a
    WAL database on a read-only mount, where SQLite cannot create the `-shm` file it reads through),
    "immutable" (`immutable=1`): a snapshot of the main file that does not read the write-ahead log."""
    path = Path(make_url(url).database or "").resolve()
    for mode, query in (("read-only", "mode=ro"), ("immutable", "mode=ro&immutable=1")):
        target = f"file:{quote(str(path))}?{query}"
        engine = create_engine("sqlite://", creator=lambda t=target: sqlite3.connect(t, uri=True, timeout=30))
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT count(*) FROM sqlite_master")
        except exc.OperationalError:
            engine.dispose()
            if mode == "immutable":
                raise
            continue
        return engine, mode
    raise AssertionError("unreachable")
