"""The control plane at scale, on synthetic ledgers:

- compile a 100,000-trial study (1000 cells: a 10 x 10 x 10 grid over lr, weight_decay and
  warmup_steps of the quickstart cell, x 100 seeds): `loads` + `compile_study`, target < 5 s;
- `status` on a 100,000-trial ledger (that study, registered with a realistic mix of statuses, a dead
  submission holding some unfinished trials, final metrics on finished ones): `Ledger.status_counts`
  alone, and the `studyrunner status` command in-process (open the ledger, count, print the table and
  the failed trials), target < 0.5 s;
- `results` of a 10,000-trial study (100 of those cells x 100 seeds, all with final metrics) into
  pandas: `results.trials_frame`, target < 2 s.

The ledgers are SQLite files in a temporary folder, filled with bulk inserts (SQLAlchemy core, one
transaction per table chunk). Each timing is repeated; the figures are over repeats.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from .common import figure, timed

SIZES = {  # (cells per grid axis -> cells = n^3, seeds, results cells, repeats)
    "tiny": (4, 10, 8, 1),
    "quick": (10, 100, 100, 3),
    "full": (10, 100, 100, 5),
}

BASE = """\
name: {name}
description: synthetic control-plane benchmark study
task:  {{name: phop, params: {{alphabet: 4, seq_len: 32, hops: 2}}}}
model: {{family: looped, params: {{d_model: 64, n_heads: 4, block_layers: 1, loops: 4}}}}
train: {{steps: 2000, batch_size: 64, lr: 2.0e-3, warmup_steps: 100, weight_decay: 0.1, grad_clip: 1.0}}
eval:  {{every: 500, examples: 2048}}
grid:
  train.lr: [{lrs}]
  train.weight_decay: [{wds}]
  train.warmup_steps: [{warmups}]
seeds: [{seeds}]
resources: {{cpu: 1, gpu: 0}}
metric: {{name: eval_accuracy, mode: max}}
"""


def study_text(name: str, per_axis: int, seeds: int) -> str:
    return BASE.format(
        name=name,
        lrs=", ".join(f"{1e-4 * (i + 1):.1e}" for i in range(per_axis)),
        wds=", ".join(f"{0.01 * i:.2f}" for i in range(per_axis)),
        warmups=", ".join(str(10 * i) for i in range(per_axis)),
        seeds=", ".join(str(s) for s in range(seeds)),
    )


def compile_text(text: str):
    from studyrunner.study import compile_study, loads

    return compile_study(loads(text))


# ------------------------------------------------------------------------------------ synthetic ledger

METRIC_NAMES = (
    "eval_accuracy", "eval_loss", "eval_exact_match", "train_loss", "params", "effective_depth",
    "step_time_ms", "tokens_per_sec", "train_time_s",
)  # fmt: skip


def _metrics(rng: random.Random) -> dict[str, float]:
    return {name: rng.random() for name in METRIC_NAMES}


def fill_ledger(url: str, compiled, *, mix: bool = True, seed: int = 0) -> dict[str, int]:
    """Register `compiled` in a new ledger at `url` by bulk inserts; returns the status counts written.

    mix: ~90% succeeded, 3% failed, 1% diverged, 2% running, 4% pending; half of the unfinished ones
    held by a dead submission (so `stale`). Without mix, every trial succeeded."""
    from sqlalchemy import insert

    from studyrunner.store import Ledger
    from studyrunner.store.db import CellRow, StudyRow, SubmissionRow, TrialRow, utcnow

    ledger = Ledger(url)
    study = compiled.study
    rng = random.Random(seed)
    now = utcnow()
    dead, live = uuid.uuid4().hex, uuid.uuid4().hex
    counts: dict[str, int] = {}
    trial_rows = []
    for t in compiled.trials:
        status = "succeeded"
        if mix:
            x = rng.random()
            status = (
                "failed" if x < 0.03 else "diverged" if x < 0.04 else "running" if x < 0.06
                else "pending" if x < 0.10 else "succeeded"
            )  # fmt: skip
        counts[status] = counts.get(status, 0) + 1
        finished = status in ("succeeded", "failed", "diverged")
        owner = None if finished else (dead if rng.random() < 0.5 else live)
        trial_rows.append(
            {
                "trial_key": t.trial_key,
                "study": study.name,
                "cell_hash": t.cell_hash,
                "seed": t.seed,
                "status": status,
                "attempts": 1 if status != "pending" else 0,
                "created_at": now,
                "started_at": now - timedelta(seconds=60) if status != "pending" else None,
                "finished_at": now if finished else None,
                "error": "RuntimeError: synthetic failure\nTraceback ..." if status == "failed" else None,
                "metrics": _metrics(rng) if finished else None,
                "mlflow_run_id": uuid.uuid4().hex,
                "failure_class": "error" if status == "failed" else "divergence" if status == "diverged" else None,
                "owner": owner,
                "heartbeat_at": now,
                "mlflow_dirty": False,
            }
        )
    with ledger.engine.begin() as conn:
        conn.execute(
            insert(StudyRow.__table__),
            [{"name": study.name, "description": study.description, "spec_text": study.text, "spec_hash": "x",
              "mlflow_experiment_id": "1", "created_at": now, "updated_at": now}],
        )  # fmt: skip
        conn.execute(
            insert(CellRow.__table__),
            [
                {"study": study.name, "cell_hash": c.cell_hash, "label": c.label, "config": c.config,
                 "overrides": c.overrides, "mlflow_run_id": None, "baseline_of": None}
                for c in compiled.cells
            ],
        )  # fmt: skip
        conn.execute(
            insert(SubmissionRow.__table__),
            [
                {"id": dead, "study": study.name, "command": "submit", "host": "elsewhere", "pid": 1,
                 "started_at": now - timedelta(hours=2), "heartbeat_at": now - timedelta(hours=1)},
                {"id": live, "study": study.name, "command": "submit", "host": socket.gethostname(),
                 "pid": os.getpid(), "started_at": now, "heartbeat_at": now},
            ],
        )  # fmt: skip
    for i in range(0, len(trial_rows), 20_000):
        with ledger.engine.begin() as conn:
            conn.execute(insert(TrialRow.__table__), trial_rows[i : i + 20_000])
    ledger.engine.dispose()
    return counts


# ----------------------------------------------------------------------------------------- timings


def time_status_cli(url: str) -> float:
    """`studyrunner status --db URL`, in this process (no interpreter start-up or imports)."""
    from typer.testing import CliRunner

    from studyrunner.cli import app

    seconds, result = timed(CliRunner().invoke, app, ["status", "--db", url])
    if result.exit_code != 0:
        raise RuntimeError(f"studyrunner status failed: {result.output[-500:]}")
    return seconds


def measure(quick: bool = True, tiny: bool = False) -> dict[str, Any]:
    from studyrunner.results import trials_frame
    from studyrunner.store import Ledger

    per_axis, seeds, result_cells, repeats = SIZES["tiny" if tiny else "quick" if quick else "full"]
    text = study_text("scale", per_axis, seeds)
    compile_s, compiled = [], None
    for _ in range(repeats):
        seconds, compiled = timed(compile_text, text)
        compile_s.append(seconds)
    n_trials = len(compiled.trials)
    small = compile_text(study_text("results", per_axis, seeds))
    small_cells = {c.cell_hash for c in small.cells[:result_cells]}
    small = type(small)(
        small.study, small.cells[:result_cells], [t for t in small.trials if t.cell_hash in small_cells]
    )

    with tempfile.TemporaryDirectory(prefix="sr-bench-cp-") as folder:
        big_url = f"sqlite:///{Path(folder) / 'big.db'}"
        fill_s, counts = timed(fill_ledger, big_url, compiled)
        small_url = f"sqlite:///{Path(folder) / 'small.db'}"
        fill_ledger(small_url, small, mix=False)

        counts_s, cli_s, frame_s = [], [], []
        for _ in range(repeats):
            ledger = Ledger(big_url, create=False)
            seconds, got = timed(ledger.status_counts, "scale")
            counts_s.append(seconds)
            ledger.engine.dispose()
            cli_s.append(time_status_cli(big_url))
            ledger = Ledger(small_url, create=False)
            seconds, frame = timed(trials_frame, ledger, "results")
            frame_s.append(seconds)
            ledger.engine.dispose()
        stale = got["scale"]["stale"]
        assert sum(got["scale"].values()) == n_trials, got
        assert len(frame) == len(small.trials), len(frame)

    return {
        "figures": {
            "compile_study_s": figure(
                compile_s, "s", target="< 5", note=f"loads + compile_study, {len(compiled.cells)} cells x {seeds} seeds"
            ),
            "status_counts_s": figure(counts_s, "s", note=f"Ledger.status_counts on {n_trials:,} trials"),
            "status_command_s": figure(
                cli_s, "s", target="< 0.5", note=f"`studyrunner status` in-process, {n_trials:,}-trial ledger"
            ),
            "results_frame_s": figure(
                frame_s, "s", target="< 2", note=f"results.trials_frame of {len(small.trials):,} trials"
            ),
        },
        "details": {
            "trials": n_trials,
            "cells": len(compiled.cells),
            "ledger_statuses": counts,
            "stale_counted": stale,
            "ledger_fill_s": round(fill_s, 2),
            "results_trials": len(small.trials),
            "results_columns": int(frame.shape[1]),
        },
    }
