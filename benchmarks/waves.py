"""The cost of a sequential study's waves (measurement `waves`): the gap from a wave's last trial to the
next wave's first, and the per-trial fixed cost, on a local Ray with 2 CPU slots.

    python -m benchmarks all --only waves [--quick]

A sequential study (`seeds: {start: 2, max: 8, step: 1}`) of two cells of the platform benchmark's looped cell
(loops 2 and 4; ~1.5 s of training per trial on an idle core, calibrated here) with one claim a cell,
`eval_accuracy[loops=K] > 0`: its one-sample t-test cannot cross the O'Brien-Fleming boundary at 2 seeds (one
degree of freedom, nominal level 9e-5) and crosses it at 3 or 4, so the study runs 2 or 3 waves of 2 trials, each
after a look, in one Tune run. From the ledger (the driver's clock):

- wave gap: the next wave's first attempt start minus the previous wave's last attempt end (the final report
  recorded): Tune ending the trial, the look (the ledger read, every claim decided, the look and the next wave
  written in one transaction), the lease, and Tune starting the next trial on the reused worker;
- look: the look's row time minus its wave's last attempt end;
- fixed cost per trial: (submit wall x slots - sum of train_time_s) / trials, as the `platform` measurement.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from .common import figure, load_average, timed
from .utilisation import SLOTS, calibrate_ms_per_step, cell

SIZES = {"tiny": (0.3, 1), "quick": (1.5, 1), "full": (1.5, 3)}  # seconds of training per trial, studies


def study_text(steps: int, name: str) -> str:
    t = cell(steps)["train"]
    return f"""\
name: {name}
description: wave gap benchmark (benchmarks/waves.py)
task:  {{name: phop, params: {{alphabet: 4, seq_len: 32, hops: 2}}}}
model: {{family: looped, params: {{d_model: 64, n_heads: 4, block_layers: 1, loops: 4}}}}
train: {{steps: {t["steps"]}, batch_size: 64, lr: 2.0e-3, warmup_steps: {t["warmup_steps"]}, weight_decay: 0.1,
         grad_clip: 1.0, log_every: {t["log_every"]}}}
eval:  {{every: {t["steps"]}, examples: 512}}
grid:
  model.params.loops: [2, 4]
seeds: {{start: 2, max: 8, step: 1}}
resources: {{cpu: 1, gpu: 0}}
metric: {{name: eval_accuracy, mode: max}}
claims: ["eval_accuracy[loops=2] > 0", "eval_accuracy[loops=4] > 0"]
"""


def _secs(moment: datetime, began: datetime) -> float:
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    return (moment - began).total_seconds()


def run_study(steps: int, name: str) -> dict[str, Any]:
    import ray
    from rich.console import Console

    from studyrunner.orchestrate import ensure_ray, submit
    from studyrunner.store import Ledger
    from studyrunner.study import compile_study, loads
    from studyrunner.workspace import Workspace

    compiled = compile_study(loads(study_text(steps, name)))
    started_ray = ensure_ray(num_cpus=SLOTS)
    try:
        with tempfile.TemporaryDirectory(prefix="sr-bench-waves-") as folder:
            ws = Workspace.resolve(folder)
            began = datetime.now(UTC)
            wall, result = timed(lambda: submit(compiled, ws, show_progress=False, console=Console(file=io.StringIO())))
            ledger = Ledger(ws.db_url, create=False)
            rows = {r.trial_key: r for r in ledger.trials(name)}
            attempts = {key: ledger.attempts(key) for key in rows}
            looks = [(look.number, look.seeds, look.created_at) for look, _ in ledger.looks(name)]
            ledger.engine.dispose()
    finally:
        if started_ray:
            ray.shutdown()
    # wave w holds the trials of the seeds look w-1 added (wave 1: the first `start` seeds)
    wave_of = {}
    for key, row in rows.items():
        wave_of[key] = 1 + sum(1 for _, seeds, _ in looks if row.seed >= seeds.get(row.cell_hash, 0))
    spans: dict[int, list[tuple[float, float]]] = {}
    for key, tries in attempts.items():
        for a in tries:
            if a.ended_at is not None:
                spans.setdefault(wave_of[key], []).append((_secs(a.started_at, began), _secs(a.ended_at, began)))
    gaps, look_s = [], []
    for number, _, created in looks:
        if number + 1 in spans:
            gaps.append(min(s for s, _ in spans[number + 1]) - max(e for _, e in spans[number]))
        look_s.append(_secs(created, began) - max(e for _, e in spans[number]))
    train = [float((r.metrics or {}).get("train_time_s") or 0.0) for r in rows.values()]
    return {
        "trials": len(rows),
        "succeeded": len(result.succeeded),
        "waves": len(spans),
        "looks": len(looks),
        "submit_wall_s": wall,
        "wave_gaps_s": [round(g, 3) for g in gaps],
        "look_s": [round(s, 3) for s in look_s],
        "train_time_s_per_trial": statistics.fmean(train) if train else 0.0,
        "fixed_cost_per_trial_s": (wall * SLOTS - sum(train)) / max(1, len(rows)),
    }


def measure(quick: bool = True, tiny: bool = False) -> dict[str, Any]:
    seconds, repeats = SIZES["tiny" if tiny else "quick" if quick else "full"]
    ms = calibrate_ms_per_step(10 if tiny else 30)
    steps = max(4, round(1000 * seconds / ms))
    load_before = load_average()
    started = time.perf_counter()
    studies = [run_study(steps, f"waves-bench-{i}") for i in range(repeats)]
    gaps = [g for s in studies for g in s["wave_gaps_s"]]
    looks = [g for s in studies for g in s["look_s"]]
    figures = {
        "wave_gap_s": figure(gaps, "s", target="< 2", note="last trial of a wave recorded -> next wave's first started")
        if gaps
        else {"skipped": "no study ran a second wave"},
        "look_s": figure(looks, "s", note="last trial recorded -> look and next wave written"),
        "waves_fixed_cost_per_trial_s": figure([s["fixed_cost_per_trial_s"] for s in studies], "s"),
    }
    return {
        "figures": figures,
        "details": {
            "steps_per_trial": steps,
            "ms_per_step_calibrated": round(ms, 2),
            "load_average_before": load_before,
            "load_average_after": load_average(),
            "seconds": round(time.perf_counter() - started, 1),
            "studies": studies,
        },
    }
