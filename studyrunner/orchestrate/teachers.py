"""Conversion teachers: a cell's `model.params.teacher` (a trial key) resolved to what its trial needs.

A `melt` cell may name a finished `looplm` trial of any study in the ledger as its teacher (seed 001's
LoopLM -> MELT conversion). The trial itself (`train/`) cannot read the ledger or know the storage, so
the orchestrator resolves the key here, before anything runs, to the teacher trial's resolved config,
seed and checkpoint location, and sends those in the trial's payload; `run_trial` loads the teacher's
final checkpoint from there (train/checkpoint.py `final_weights`).

A teacher that is not in the ledger, has not succeeded, is not a `looplm`, has lost its final
checkpoint or does not fit the student (widths, layers, loops, vocabulary) is an error at submit, in one
line naming the study file, the field and the key.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import StudyrunnerError
from ..models import build_model
from ..store import Ledger, TrialStatus
from ..tasks import build_task
from ..train.checkpoint import checkpoint_name, open_storage
from ..workspace import Workspace

TEACHER_FAMILIES = ("looplm",)


def teacher_key(config: dict[str, Any]) -> str | None:
    return config["model"]["params"].get("teacher")


def resolve_teachers(compiled, ledger: Ledger, workspace: Workspace) -> dict[str, dict[str, Any]]:
    """{teacher trial key: {"trial_key", "config", "seed", "checkpoint"}} for every teacher a cell names."""
    from ..workspace import checkpoint_location

    source = compiled.study.source
    wanted = sorted({k for c in compiled.cells if (k := teacher_key(c.config)) is not None})
    if not wanted:
        return {}
    rows = {r.trial_key: r for r in ledger.trials_by_key(wanted)}
    resolved: dict[str, dict[str, Any]] = {}
    for key in wanted:

        def fail(problem: str, key: str = key) -> StudyrunnerError:
            return StudyrunnerError(f"{source}: model.params.teacher: trial {key!r} {problem}")

        row = rows.get(key)
        if row is None:
            raise fail("is not in the ledger; submit the looplm study that trains it first (same --db)")
        if row.status != TrialStatus.SUCCEEDED:
            raise fail(_unfinished(row, ledger, workspace))
        config = next(c.config for c in ledger.cells(row.study) if c.cell_hash == row.cell_hash)
        if config["model"]["family"] not in TEACHER_FAMILIES:
            raise fail(f"is a {config['model']['family']!r} trial; a teacher must be one of {TEACHER_FAMILIES}")
        location = checkpoint_location(workspace.storage, row.study, key)
        final = checkpoint_name(int(config["train"]["steps"]))
        if final not in open_storage(location).names():
            raise fail(f"has no final checkpoint ({final}) in {location}; rerun it with --fresh")
        resolved[key] = {"trial_key": key, "config": config, "seed": row.seed, "checkpoint": location}
    for cell in compiled.cells:
        if (key := teacher_key(cell.config)) is not None:
            problem = fit_problem(cell.config, resolved[key]["config"])
            if problem:
                raise StudyrunnerError(f"{source}: model.params.teacher: cell '{cell.label}': trial {key!r} {problem}")
    return resolved


def _unfinished(row, ledger: Ledger, workspace: Workspace) -> str:
    """Why an unfinished teacher cannot teach yet, and what finishes it."""
    if row.trial_key in ledger.stale_keys(row.study):
        return (
            f"is stale: the submit that ran it (study {row.study!r}) stopped without finishing it (killed, or "
            f"its machine went down); finish it with: {workspace.hint('resume', row.study)}, then submit again"
        )
    if row.status == TrialStatus.RUNNING:
        return f"is still running (study {row.study!r}); submit again once it has succeeded"
    return f"is {row.status}, not succeeded: a teacher must have finished training"


def fit_problem(student: dict[str, Any], teacher: dict[str, Any]) -> str | None:
    """Why the teacher's weights cannot start the student (built on the meta device), or None."""
    facts = {}
    for name, cfg in (("student", student), ("teacher", teacher)):
        facts[name] = build_task(cfg["task"]["name"], cfg["task"]["params"], seed=0).facts
    if facts["student"].vocab_size != facts["teacher"].vocab_size:
        return f"has vocabulary {facts['teacher'].vocab_size}, this cell's task {facts['student'].vocab_size}"
    with torch.device("meta"):
        model = build_model(student["model"]["family"], student["model"]["params"], facts["student"])
        other = build_model(teacher["model"]["family"], teacher["model"]["params"], facts["teacher"])
    try:
        model.convert_from(other)
    except (ValueError, RuntimeError) as exc:
        return f"does not fit: {' '.join(str(exc).split())[:300]}"
    return None
