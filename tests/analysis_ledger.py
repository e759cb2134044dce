"""Synthetic ledgers for the analysis tests: a real study file compiled and registered in a SQLite ledger,
with final metrics and curves written directly through `Ledger` and `CurveStore` (no Ray, no training)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from studyrunner.store import CurveStore, Ledger
from studyrunner.study import compile_study, loads

STUDY = """\
name: {name}
task: {{name: phop, params: {{alphabet: 4, seq_len: 12, hops: 1}}}}
model: {{family: looped, params: {{d_model: 16, n_heads: 2, block_layers: 1, loops: 1}}}}
train: {{steps: 100, batch_size: 16}}
grid:
  model.params.loops: [1, 2, 4, 8]
  model.params.block_layers: [1, 2]
seeds: [0, 1, 2, 3]
metric: {{name: eval_accuracy, mode: max}}
{extra}"""


def study_text(name: str = "synth", extra: str = "") -> str:
    return STUDY.format(name=name, extra=extra)


# (model params, seed) -> final metrics, or None for a crashed trial
Outcome = Callable[[dict, int], dict | None]


def build(
    root: Path,
    outcome: Outcome,
    name: str = "synth",
    extra: str = "",
    curve: Callable[[dict, int], list[dict]] | None = None,
    leave_pending: int = 0,
):
    """Register the study in `root/ledger.db` and record every trial's outcome; the last `leave_pending`
    trials stay pending. Returns (db_url, storage, study file path)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.yaml"
    path.write_text(study_text(name, extra))
    compiled = compile_study(loads(path.read_text(), source=str(path)))
    db = f"sqlite:///{root / 'ledger.db'}"
    ledger = Ledger(db)
    ledger.register(compiled)
    curves = CurveStore(str(root))
    trials = compiled.trials[: len(compiled.trials) - leave_pending]
    for t in trials:
        params = t.config["model"]["params"]
        ledger.mark_running(t.trial_key, f"run-{t.trial_key}")
        metrics = outcome(params, t.seed)
        if curve is not None:
            curves.write(name, t.trial_key, curve(params, t.seed))
        if metrics is None:
            ledger.mark_failed(t.trial_key, "RuntimeError: synthetic crash")
        else:
            depth = float(params["loops"] * params["block_layers"])
            ledger.mark_succeeded(t.trial_key, {"effective_depth": depth, **metrics})
    return db, str(root), path


def loglinear_outcome(alpha: float = 0.1, beta: float = 0.3, noise: float = 0.01) -> Outcome:
    """eval_accuracy = alpha·block_layers·ln(loops) + beta + a small seed-dependent offset and a smaller
    jitter per trial (the slope in ln loops doubles with two block layers; paired differences have some
    spread, as real seeds do: identical differences would leave a t-test nothing to estimate)."""

    def outcome(params: dict, seed: int) -> dict:
        loops, k = params["loops"], params["block_layers"]
        offset = noise * ((seed * 7919) % 11 - 5) / 5 + noise * 0.3 * math.sin(
            seed * 12.9898 + loops * 78.233 + k * 37.719
        )
        return {"eval_accuracy": alpha * k * math.log(loops) + beta + offset, "eval_loss": 2.0 / loops + 0.5}

    return outcome
