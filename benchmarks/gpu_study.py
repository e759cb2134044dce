"""Run the first look of one `studies/gpu/` study (its `start` seeds of every cell) on one GPU, without Ray or
MLflow: its trials in packs (`train.pack` as the study sets it, else each cell's seeds: train/packing.py), each
pack in its own process, all at once (small cells are launch-bound, so packs and processes sharing the GPU
multiply its throughput), a JSON line per finished trial.

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


def _pack(path: str, members: list[tuple[int, int]], device: str, steps: int | None, queue: Any) -> None:
    """Train one pack, [(cell index, seed)], and put each member's row on `queue`."""
    import torch

    from studyrunner.study import compile_study, loads
    from studyrunner.train import Diverged, run_trial
    from studyrunner.train.vectorized import run_trials_together

    torch.set_num_threads(1)
    compiled = compile_study(loads(Path(path).read_text()))
    metric = compiled.study.metric.name
    configs = []
    for index, _ in members:
        config = dict(compiled.cells[index].config)
        config["train"] = {**config["train"], "device": device, **({"steps": steps} if steps else {})}
        configs.append(config)
    reporters = [_Progress(queue, key, metric) for key in members]
    started = time.perf_counter()
    try:
        if len(members) == 1:  # alone, as the orchestrator trains a trial that is not packed
            finals: list[Any] = [run_trial(configs[0], members[0][1], reporters[0])]
        else:
            finals = run_trials_together(configs, [seed for _, seed in members], reporters)
    except Diverged as diverged:  # a trial alone raises where a packed member's entry says so
        finals = [diverged]
    except Exception as exc:  # noqa: BLE001 - a pack's failure is each member's row, as the orchestrator records it
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        finals = [{"status": "failed", "error": error}] * len(members)
    wall = round(time.perf_counter() - started, 1)
    for (index, seed), final in zip(members, finals, strict=True):
        cell = compiled.cells[index]
        if not isinstance(final, dict):  # Diverged: the member's metrics when it stopped
            row = {"status": "diverged", **(final.metrics or {})}
        else:
            row = final if "status" in final else {"status": "succeeded", **final}
        queue.put({"cell_index": index, "cell_hash": cell.cell_hash, "label": cell.label,
                   "overrides": cell.overrides, "seed": seed, "pack": len(members), "wall_s": wall, **row})  # fmt: skip


def packs_of(compiled) -> list[list[tuple[int, int]]]:
    """The first look's trials, [(cell index, seed)], as they train: grouped as the Tune run groups them
    (`packing.pack_groups`), a cell's seeds packed where the study leaves `train.pack` unset and the cell can
    pack, and every other trial alone (a pack of one, trained by `run_trial`)."""
    import dataclasses

    from studyrunner.train.packing import check_packable, pack_groups, pack_mode

    def packed_by_cell(trial):
        if pack_mode(trial.config) is not None:
            return trial
        try:
            check_packable(trial.config)
        except ValueError:  # a conversion's student, dropout, ...: trains alone
            return trial
        return dataclasses.replace(trial, config={**trial.config, "train": {**trial.config["train"], "pack": "seeds"}})

    index = {c.cell_hash: i for i, c in enumerate(compiled.cells)}
    packs, alone = pack_groups([packed_by_cell(t) for t in compiled.trials])
    return [[(index[t.cell_hash], t.seed) for t in group] for group in (*packs, *([t] for t in alone))]


def first_look(study: Path, deadline: float, device: str, out: Path, steps: int | None = None) -> dict[str, Any]:
    """Run the study's first look (packs at once) until done or `deadline` seconds; rows to `out` (JSON lines)."""
    from studyrunner.study import compile_study, loads

    compiled = compile_study(loads(study.read_text()))  # a sequential study's trials: its first look's
    packs = packs_of(compiled)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_pack, args=(str(study), members, device, steps, queue)) for members in packs]
    started = time.perf_counter()
    for proc in procs:
        proc.start()
    total = sum(len(m) for m in packs)
    print(f"{compiled.study.name}: {total} trials in {len(packs)} packs at once on {device}", flush=True)
    done, progress, finished = 0, {}, set()
    metric = compiled.study.metric.name
    with out.open("w") as sink:
        while done < total and time.perf_counter() - started < deadline:
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
            print(f"{time.perf_counter() - started:6.0f}s {row['label']} seed {row['seed']}: "
                  f"{row['status']} {metric}={row.get(metric)} ({row['wall_s']} s)", flush=True)  # fmt: skip
        for (index, seed), last in sorted(progress.items()):
            if (index, seed) not in finished:  # stopped at the deadline: how far it got, not a result
                cell = compiled.cells[index]
                row = {"cell_hash": cell.cell_hash, "label": cell.label, "overrides": cell.overrides, "seed": seed}
                sink.write(json.dumps({**row, "status": "unfinished", **last}, default=str) + "\n")
    wall = time.perf_counter() - started
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    print(f"{done} of {total} trials finished in {wall:.0f} s -> {out}", flush=True)
    return {"study": compiled.study.name, "trials": total, "packs": len(packs), "finished": done,
            "wall_s": round(wall, 1), "deadline_s": deadline, "rows": str(out)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("study", type=Path)
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds; unfinished trials are left out")
    parser.add_argument("--device", default=os.environ.get("DEV", "cuda"))
    args = parser.parse_args()

    from studyrunner.study import compile_study, loads

    name = compile_study(loads(args.study.read_text())).study.name
    first_look(args.study, args.deadline, args.device, Path(os.environ.get("OUT", ".")) / f"{name}.jsonl")


if __name__ == "__main__":
    main()
