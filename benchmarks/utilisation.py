"""Platform utilisation (measurement `platform`): a real study on a local Ray with 2 CPU slots.

(Not named platform.py: run as a script, `python benchmarks/gpu_trainer.py` puts benchmarks/ first on
sys.path, where a platform.py would shadow the standard library module torch imports.)

A study of N trials (full: 16 of ~10 s of training; quick: 8 of ~4 s; tiny: 2 of a few steps) of the
quickstart's 1x4 cell (looped d 64, p-hop n=32 p=2, batch 64; the step count calibrated on this machine
to give the wanted training time; one final evaluation on 512 held-out examples) is submitted with
`studyrunner.orchestrate.submit` to a local Ray started with 2 CPUs (`resources: {cpu: 1}`: two trials
at a time). Everything a study does runs: ledger, MLflow (SQLite), Parquet curves, checkpoints.

    utilisation = sum of the trials' train_time_s (the trainer's timed steps) / (submit wall x slots)

The Ray is started before the submit, and the submit waits until Ray's idle workers are done preloading the
trainer (orchestrate/cluster/warm_workers.py): a submit to a Ray that has been up a while, as on a cluster. The same
study is then run with cold workers (`STUDYRUNNER_WARM_WORKERS=0`), and, outside the tiny size, `studyrunner
submit` as a user runs it, in a new process that starts and stops its own Ray, warm and cold: its utilisation
counts the command's whole wall time.

The fixed cost per trial = (submit wall x slots - sum train_time_s) / N, split using the ledger's
timestamps (attempts.started_at/ended_at are the driver's clock when Tune started the trial and when
its final report was recorded) into:
- before the first trial: driver start-up (register, MLflow experiment and parent runs, Tune start,
  the worker processes' start and imports);
- inside each attempt, besides training: building the trial, evaluation, checkpoints, reports;
- between attempts on a slot: Tune scheduling the next trial and the driver recording the last;
- after the last trial: recording it and Tune's shutdown.
Pieces timed separately in isolation: `import torch` and the trainable's imports in a fresh process,
`build_trial`, one evaluation, one checkpoint write, and the driver's recording of one whole trial
(Recorder fed a trial's reports: MLflow run, ledger rows, curve writes, cell aggregates).
"""

from __future__ import annotations

import copy
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .common import figure, timed
from .gpu_trainer import QUICKSTART_1X4

SLOTS = 2
SIZES = {  # trials, seconds of training per trial, repeats of the isolated pieces
    "tiny": (2, 0.5, 1),
    "quick": (8, 4.0, 2),
    "full": (16, 10.0, 3),
}
EVAL_EXAMPLES = 512
LOG_EVERY = 20


def cell(steps: int) -> dict[str, Any]:
    cfg = copy.deepcopy(QUICKSTART_1X4)
    cfg["train"].update(steps=steps, warmup_steps=min(10, steps // 2), log_every=min(LOG_EVERY, steps))
    cfg["eval"].update(every=steps, examples=EVAL_EXAMPLES)
    return cfg


def study_text(steps: int, trials: int) -> str:
    cfg = cell(steps)
    t = cfg["train"]
    return f"""\
name: platform-bench
description: platform utilisation benchmark (benchmarks/platform.py)
task:  {{name: phop, params: {{alphabet: 4, seq_len: 32, hops: 2}}}}
model: {{family: looped, params: {{d_model: 64, n_heads: 4, block_layers: 1, loops: 4}}}}
train: {{steps: {t["steps"]}, batch_size: 64, lr: 2.0e-3, warmup_steps: {t["warmup_steps"]}, weight_decay: 0.1,
         grad_clip: 1.0, log_every: {t["log_every"]}}}
eval:  {{every: {t["steps"]}, examples: {EVAL_EXAMPLES}}}
seeds: [{", ".join(str(s) for s in range(trials))}]
resources: {{cpu: 1, gpu: 0}}
metric: {{name: eval_accuracy, mode: max}}
"""


# ------------------------------------------------------------------------------ pieces in isolation


def calibrate_ms_per_step(steps: int = 30) -> float:
    """ms per training step of the cell on one thread, here and now (the trainer's own timing)."""
    import torch

    from studyrunner.train import MemoryReporter, run_trial

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reporter = MemoryReporter()
        cfg = cell(steps)
        cfg["train"]["log_every"] = 10
        run_trial(cfg, 0, reporter)
        windows = [v for _, v in reporter.series("step_time_ms")]
        return statistics.median(windows[1:] or windows)
    finally:
        torch.set_num_threads(threads)


def fresh_import_s(module: str) -> float:
    """Seconds to import `module` in a new Python process (a Ray worker's start, in part)."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    return float(out.stdout.strip().splitlines()[-1])


def trial_pieces(steps: int, repeats: int) -> dict[str, list[float]]:
    """build_trial, one evaluation and one checkpoint write of the cell, on one thread."""
    import torch

    from studyrunner.train.checkpoint import Checkpoints, open_storage
    from studyrunner.train.evaluation import evaluate
    from studyrunner.train.trainer import _capture, build_trial
    from studyrunner.train.trial_progress import Progress

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out: dict[str, list[float]] = {"build_trial_s": [], "evaluation_s": [], "checkpoint_write_s": []}
    try:
        cfg = cell(steps)
        for r in range(repeats):
            seconds, trial = timed(build_trial, cfg, r)
            out["build_trial_s"].append(seconds)
            out["evaluation_s"].append(timed(evaluate, trial.model, trial.task, trial.splits)[0])
            with tempfile.TemporaryDirectory(prefix="sr-bench-ckpt-") as folder:
                store = Checkpoints(open_storage(folder), config=cfg, seed=r)
                progress = Progress(step=1)
                out["checkpoint_write_s"].append(
                    timed(lambda t=trial, p=progress, st=store: st.save(1, _capture(t, p)))[0]
                )
    finally:
        torch.set_num_threads(threads)
    return out


def recording_s(steps: int, repeats: int) -> list[float]:
    """The driver's recording of one whole trial, as `submit` does it: the Recorder fed the reports a
    trial sends (first report with provenance and facts, a record every LOG_EVERY steps, a note after
    each checkpoint, the final report), against a fresh workspace (ledger, MLflow SQLite, curves)."""
    from studyrunner.orchestrate.cluster.recorder import Recorder
    from studyrunner.orchestrate.commands.preflight import open_stores
    from studyrunner.provenance import provenance
    from studyrunner.store import CurveStore
    from studyrunner.study import compile_study, loads
    from studyrunner.tracking.study_runs import open_tracking
    from studyrunner.train.checkpoint import default_every
    from studyrunner.workspace import Workspace

    compiled = compile_study(loads(study_text(steps, repeats + 1)))
    times = []
    with tempfile.TemporaryDirectory(prefix="sr-bench-rec-") as folder:
        ws = Workspace.resolve(folder)
        ledger, tracker = open_stores(ws)
        ledger.register(compiled)
        experiment_id, parents, _by_tag = open_tracking(compiled, compiled.trials, ledger, tracker, ws)
        recorder = Recorder(compiled, ledger, tracker, CurveStore(ws.storage), experiment_id, parents)
        every = default_every(steps)
        metrics = {"train_loss": 1.0, "lr": 1e-3, "step_time_ms": 80.0, "tokens_per_sec": 27000.0}
        final = {**metrics, "eval_loss": 1.0, "eval_accuracy": 0.5, "eval_exact_match": 0.5, "params": 1e5,
                 "effective_depth": 4.0, "train_time_s": 10.0}  # fmt: skip
        for i, t in enumerate(compiled.trials):
            trial = SimpleNamespace(config={"trial": {"trial_key": t.trial_key}}, trial_id=f"bench_{i}")

            def one_trial(trial=trial) -> None:
                recorder.on_trial_start(0, [], trial)
                first = {"step": 0, "metrics": {"params": 1e5, "effective_depth": 4.0}, "final": False,
                         "provenance": provenance(), "resumed_from_step": 0, "facts": {"device": "cpu"}}  # fmt: skip
                recorder.on_trial_result(0, [], trial, first)
                for step in range(1, steps + 1):
                    if step % LOG_EVERY == 0 or step == steps:
                        recorder.on_trial_result(0, [], trial, {"step": step, "metrics": dict(metrics), "final": False})
                    if step % every == 0 or step == steps:
                        note = {"note": f"checkpoint written at step {step}", "step": step, "checkpoint_step": step}
                        recorder.on_trial_result(0, [], trial, note)
                recorder.on_trial_result(
                    0, [], trial, {"final": True, "outcome": "succeeded", "step": steps, "metrics": dict(final)}
                )
                recorder.on_trial_complete(0, [], trial)

            seconds, _ = timed(one_trial)
            if i > 0:  # the first trial also pays MLflow's and SQLAlchemy's first-use costs
                times.append(seconds)
        ledger.engine.dispose()
    return times


# ---------------------------------------------------------------------------------------- the study


def _assign_slots(spans: list[tuple[float, float]], slots: int) -> list[list[tuple[float, float]]]:
    """Attempts (start, end) put on `slots` lanes greedily (each to the lane free longest before it)."""
    lanes: list[list[tuple[float, float]]] = [[] for _ in range(slots)]
    for start, end in sorted(spans):
        free = [lane for lane in lanes if not lane or lane[-1][1] <= start + 0.05]
        lane = min(free or lanes, key=lambda ln: ln[-1][1] if ln else float("-inf"))
        lane.append((start, end))
    return lanes


@contextmanager
def warm_workers(on: bool) -> Iterator[None]:
    """Ray's idle workers preloaded and taken by the trial actors (orchestrate/cluster/warm_workers.py), or not."""
    from studyrunner.orchestrate.cluster.warm_workers import SWITCH

    before = os.environ.get(SWITCH)
    os.environ[SWITCH] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = before


def settle_idle_workers(workers: int = SLOTS, timeout: float = 60.0) -> float:
    """Wait until Ray has `workers` idle workers (`ray::IDLE`) that used no CPU for half a second: started and
    done preloading, as on a Ray that has been up a while. Seconds waited."""
    import psutil

    from studyrunner.orchestrate.cluster.ray_runtime import ray_session_dir
    from studyrunner.orchestrate.submission import _processes_of

    session = ray_session_dir()

    def idle() -> tuple[int, float]:  # of this Ray only: the previous study's may still be going away
        count, cpu = 0, 0.0
        for pid in _processes_of(session) if session else ():
            try:
                proc = psutil.Process(pid)
                if proc.cmdline()[:1] and proc.cmdline()[0].startswith("ray::IDLE"):
                    times = proc.cpu_times()
                    count, cpu = count + 1, cpu + times.user + times.system
            except psutil.Error:
                continue
        return count, cpu

    started = time.perf_counter()
    before = idle()
    while time.perf_counter() - started < timeout:
        time.sleep(0.5)
        now = idle()
        if now[0] >= workers and now == before:
            break
        before = now
    return time.perf_counter() - started


def run_study(steps: int, trials: int, warm: bool = True) -> dict[str, Any]:
    """Submit the study to a local Ray with SLOTS CPUs (warm workers or not); the ledger's view of it."""
    with warm_workers(warm):
        return {"warm_workers": warm, **_run_study(steps, trials)}


def _run_study(steps: int, trials: int) -> dict[str, Any]:
    from rich.console import Console

    from studyrunner.orchestrate import ensure_ray, submit
    from studyrunner.orchestrate.commands.preflight import open_stores
    from studyrunner.store import Ledger
    from studyrunner.study import compile_study, loads
    from studyrunner.workspace import Workspace

    compiled = compile_study(loads(study_text(steps, trials)))
    import ray

    already = ray.is_initialized()
    ray_start_s, started_ray = timed(ensure_ray, num_cpus=SLOTS)
    settle_s = settle_idle_workers()
    cpus = ray.cluster_resources().get("CPU")
    try:
        with tempfile.TemporaryDirectory(prefix="sr-bench-platform-") as folder:
            ws = Workspace.resolve(folder)
            # A workspace that has seen a study (its ledger and MLflow store exist), as most submits find
            # it; creating MLflow's SQLite store (its migrations) is timed here, reported on its own.
            stores_s, (ledger, tracker) = timed(open_stores, ws)
            ledger.engine.dispose()
            began = datetime.now(UTC)
            wall, result = timed(lambda: submit(compiled, ws, show_progress=False, console=Console(file=io.StringIO())))
            ended = datetime.now(UTC)
            ledger = Ledger(ws.db_url, create=False)
            rows = ledger.trials(compiled.study.name)
            attempts = [a for r in rows for a in ledger.attempts(r.trial_key)]
            ledger.engine.dispose()
    finally:
        if started_ray:
            ray.shutdown()

    def secs(moment) -> float:
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
        return (moment - began).total_seconds()

    train = [float((r.metrics or {}).get("train_time_s") or 0.0) for r in rows]
    spans = [(secs(a.started_at), secs(a.ended_at)) for a in attempts if a.ended_at is not None]
    lanes = _assign_slots(spans, SLOTS)
    gaps = [lane[i + 1][0] - lane[i][1] for lane in lanes for i in range(len(lane) - 1)]
    n = len(rows)
    total_train = sum(train)
    in_attempt = sum(e - s for s, e in spans) - total_train
    return {
        "trials": n,
        "succeeded": len(result.succeeded),
        "steps_per_trial": steps,
        "ray_cpus": cpus,
        "ray_already_running": already,
        "ray_start_s": ray_start_s,
        "idle_workers_settled_after_s": settle_s,  # then the submit starts: a Ray that has been up a while
        "new_workspace_stores_s": stores_s,
        "submit_wall_s": wall,
        "submit_fit_wall_s": result.wall_time_s,  # runner's own clock: Ray Tune fit and recording only
        "train_time_s_sum": total_train,
        "train_time_s_per_trial": statistics.fmean(train) if train else 0.0,
        "utilisation": total_train / (wall * SLOTS),
        "fixed_cost_per_trial_s": (wall * SLOTS - total_train) / max(1, n),
        "split_per_trial_s": {
            "before_first_trial": min(s for s, _ in spans) * SLOTS / max(1, n) if spans else None,
            "inside_attempt_not_training": in_attempt / max(1, n),
            "between_attempts": sum(gaps) / max(1, n),
            "after_last_trial": (
                sum((ended - began).total_seconds() - lane[-1][1] for lane in lanes if lane) / max(1, n)
            ),
            "slots_never_used": sum(
                (ended - began).total_seconds() - min(s for s, _ in spans) for lane in lanes if not lane
            )
            / max(1, n)
            if spans
            else None,
        },
        "first_trial_started_after_s": min(s for s, _ in spans) if spans else None,
        # A worker that started before the submit was one of Ray's idle, preloaded ones (warm_workers.py).
        "attempts_on_warm_workers": sum(
            secs(datetime.fromisoformat(a.provenance["process_started_at"])) < 0
            for a in attempts
            if "process_started_at" in (a.provenance or {})
        ),
        "attempts": len(attempts),
        "attempt_spans_s": [round(e - s, 3) for s, e in sorted(spans)],
        "gaps_between_attempts_s": [round(g, 3) for g in gaps],
        "train_time_s": [round(t, 3) for t in train],
    }


def run_cli(steps: int, trials: int, warm: bool) -> dict[str, Any]:
    """`studyrunner submit` of the study as a user runs it: a new process on a new workspace, which starts the
    embedded Ray (all of this machine's cores) and stops it. Utilisation over the command's whole wall time."""
    from studyrunner.orchestrate.cluster.warm_workers import SWITCH
    from studyrunner.store import Ledger

    slots = os.cpu_count() or SLOTS
    with tempfile.TemporaryDirectory(prefix="sr-bench-cli-") as folder:
        study = Path(folder) / "study.yaml"
        study.write_text(study_text(steps, trials))
        command = [sys.executable, "-m", "studyrunner", "submit", str(study), "--workspace", folder, "--no-progress"]
        env = {**os.environ, SWITCH: "1" if warm else "0"}
        wall, _ = timed(subprocess.run, command, env=env, capture_output=True, check=True, timeout=1800)
        ledger = Ledger(f"sqlite:///{folder}/ledger.db", create=False)
        train = [float((r.metrics or {}).get("train_time_s") or 0.0) for r in ledger.trials("platform-bench")]
        ledger.engine.dispose()
    return {"warm_workers": warm, "slots": slots, "command_wall_s": wall, "train_time_s_sum": sum(train),
            "utilisation": sum(train) / (wall * slots)}  # fmt: skip


def measure(quick: bool = True, tiny: bool = False, repeats: int = 1) -> dict[str, Any]:
    n_trials, train_s, piece_repeats = SIZES["tiny" if tiny else "quick" if quick else "full"]
    ms = calibrate_ms_per_step(10 if tiny else 30)
    steps = max(4, round(1000 * train_s / ms))
    studies = [run_study(steps, n_trials) for _ in range(max(1, repeats))]
    cold = [] if tiny else [run_study(steps, n_trials, warm=False) for _ in range(max(1, repeats))]
    commands = [] if tiny else [run_cli(steps, n_trials, w) for _ in range(max(1, repeats)) for w in (True, False)]
    pieces = trial_pieces(steps, piece_repeats)
    imports = {"import_torch_s": [fresh_import_s("torch") for _ in range(piece_repeats)]}
    if not tiny:  # ~5 s a time on 2 cores
        imports["import_trainable_s"] = [
            fresh_import_s("studyrunner.orchestrate.cluster.trainable") for _ in range(piece_repeats)
        ]
    record = recording_s(steps, piece_repeats)
    split_names = list(studies[0]["split_per_trial_s"])
    figures = {
        "platform_utilisation": figure(
            [s["utilisation"] for s in studies],
            "fraction",
            target=">= 0.90",
            note=f"{n_trials} trials x ~{train_s:g} s training, {SLOTS} CPU slots",
        ),
        "platform_fixed_cost_per_trial_s": figure([s["fixed_cost_per_trial_s"] for s in studies], "s"),
    }
    if cold:
        figures["platform_utilisation_cold_workers"] = figure(
            [s["utilisation"] for s in cold], "fraction", note="STUDYRUNNER_WARM_WORKERS=0: trial actors start cold"
        )
    for warm in (True, False) if commands else ():
        figures[f"command_utilisation_{'warm' if warm else 'cold'}_workers"] = figure(
            [c["utilisation"] for c in commands if c["warm_workers"] == warm],
            "fraction",
            note="`studyrunner submit` in a new process, its embedded Ray's start and stop included",
        )
    for name in split_names:
        values = [s["split_per_trial_s"][name] for s in studies if s["split_per_trial_s"][name] is not None]
        if values:
            figures[f"fixed_cost_{name}_s"] = figure(values, "s/trial")
    for name, values in {**pieces, **imports}.items():
        figures[f"piece_{name}"] = figure(values, "s")
    figures["piece_driver_recording_per_trial_s"] = figure(record, "s", note="Recorder fed one trial's reports")
    return {
        "figures": figures,
        "details": {
            "ms_per_step_calibrated": round(ms, 2),
            "steps_per_trial": steps,
            "eval_examples": EVAL_EXAMPLES,
            "studies": studies,
            "studies_cold_workers": cold,
            "commands": commands,
        },
    }


if __name__ == "__main__":  # a single study, for profiling: python -m benchmarks.utilisation [trials] [seconds]
    import json

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    secs_each = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
    started = time.perf_counter()
    step_count = max(4, round(1000 * secs_each / calibrate_ms_per_step()))
    print(json.dumps(run_study(step_count, n), indent=1, default=str))
    print(f"{time.perf_counter() - started:.1f} s in all")
