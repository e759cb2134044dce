"""Run the first look of one `studies/gpu/` study (its `start` seeds of every cell) on one GPU, without Ray or
MLflow: each trial through `run_trial` in its own process, all at once (small cells are launch-bound, so
processes sharing the GPU multiply its throughput), a JSON line per finished trial.

    PYTHONPATH=. python benchmarks/gpu_study.py studies/gpu/faithful_ut_memory.yaml [--deadline 480]

Needs torch, numpy and pydantic only (the device machine has no Ray or MLflow). Writes $OUT/<study>.jsonl
(default: the current folder): per trial its cell, overrides, seed, final metrics and wall time. Trials still
running at the deadline are stopped and left out. `benchmarks/gpu_study_verdicts.py` turns the file into the
study's verdicts at that one look.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any


class _Progress:
    """Sends each evaluation to the parent, so a trial stopped at the deadline still says how far it got."""

    def __init__(self, queue: Any, key: tuple[int, int], metric: str) -> None:
        self.queue, self.key, self.metric = queue, key, metric

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.metric in metrics:
            self.queue.put({"progress": self.key, "step": step, self.metric: metrics[self.metric]})


def _one(path: str, cell_index: int, seed: int, device: str, queue: Any) -> None:
    import torch

    from studyrunner.study import compile_study, loads
    from studyrunner.train import run_trial

    torch.set_num_threads(1)
    compiled = compile_study(loads(Path(path).read_text()))
    cell = compiled.cells[cell_index]
    config = dict(cell.config)
    config["train"] = {**config["train"], "device": device}
    started = time.perf_counter()
    try:
        final: dict[str, Any] = {
            "status": "succeeded",
            **run_trial(config, seed, _Progress(queue, (cell_index, seed), compiled.study.metric.name)),
        }
    except Exception as exc:  # noqa: BLE001 - a trial's failure is a row, as the orchestrator records it
        final = {"status": "failed", "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
    final["wall_s"] = round(time.perf_counter() - started, 1)
    queue.put(
        {
            "cell_index": cell_index,
            "cell_hash": cell.cell_hash,
            "label": cell.label,
            "overrides": cell.overrides,
            "seed": seed,
            **final,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("study", type=Path)
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds; unfinished trials are left out")
    parser.add_argument("--device", default=os.environ.get("DEV", "cuda"))
    args = parser.parse_args()

    from studyrunner.study import compile_study, loads

    compiled = compile_study(loads(args.study.read_text()))
    seeds = compiled.study.seeds
    first = list(range(seeds.start)) if hasattr(seeds, "start") else list(seeds)
    out = Path(os.environ.get("OUT", ".")) / f"{compiled.study.name}.jsonl"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_one, args=(str(args.study), i, seed, args.device, queue))
        for i in range(len(compiled.cells))
        for seed in first
    ]
    started = time.perf_counter()
    for proc in procs:
        proc.start()
    print(f"{compiled.study.name}: {len(procs)} trials at once on {args.device}", flush=True)
    done, progress, finished = 0, {}, set()
    metric = compiled.study.metric.name
    with out.open("w") as sink:
        while done < len(procs) and time.perf_counter() - started < args.deadline:
            try:
                row = queue.get(timeout=5)
            except Exception:  # noqa: BLE001 - queue.Empty: nothing finished in the last 5 s
                continue
            if "progress" in row:
                progress[tuple(row.pop("progress"))] = row
                continue
            done += 1
            finished.add((row.pop("cell_index"), row["seed"]))
            sink.write(json.dumps(row, default=str) + "\n")
            sink.flush()
            print(
                f"{time.perf_counter() - started:6.0f}s {row['label']} seed {row['seed']}: "
                f"{row['status']} {metric}={row.get(metric)} ({row['wall_s']} s)",
                flush=True,
            )
        for (index, seed), last in sorted(progress.items()):
            if (index, seed) not in finished:  # stopped at the deadline: how far it got, not a result
                cell = compiled.cells[index]
                row = {"cell_hash": cell.cell_hash, "label": cell.label, "overrides": cell.overrides, "seed": seed}
                sink.write(json.dumps({**row, "status": "unfinished", **last}, default=str) + "\n")
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    print(f"{done} of {len(procs)} trials finished in {time.perf_counter() - started:.0f} s -> {out}", flush=True)


if __name__ == "__main__":
    main()
