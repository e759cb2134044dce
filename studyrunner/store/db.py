"""Ledger tables (SQLAlchemy 2.x). Portable types only: the same schema runs on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Engine,
    ForeignKey,
    ForeignKeyConstraint,
    Integer,
    String,
    Text,
    create_engine,
    event,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

STATUSES = ("pending", "running", "succeeded", "failed")


def utcnow() -> datetime:
    return datetime.now(UTC)


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
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any] | None]  # final metrics
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # WAL lets `status` read while `submit` writes
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    return engine
