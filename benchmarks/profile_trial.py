"""Where a quickstart trial's time goes on the CPU (docs/performance.md).

    python -m benchmarks.profile_trial [--steps 500] [--threads 1] [--ops 30]

Trains the quickstart's 1x4 cell (looped d 64, p-hop n=32 p=2, batch 64) with `run_trial`, as a Ray
worker would (one torch thread, checkpoints on every tenth of the run, a record every 20 steps, one
evaluation of 2048 examples per 500 steps, as the quickstart's 2000 steps have four), with each part
of the work wrapped in a timer: batch generation, forward, loss, backward, grad clip, optimizer
(zero_grad + step), evaluation, checkpoint writes, the reporter; "other" is the rest of the trial's
wall time (building it, the schedule, the train window, Python between the parts). Then
`torch.profiler` over `--ops` steps gives the operators the time is spent in.

Needs torch, numpy and pydantic only.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from collections import defaultdict
from typing import Any

import torch

from .gpu_trainer import QUICKSTART_1X4

PARTS = ("batch", "forward", "loss", "backward", "clip", "optimizer", "evaluation", "checkpoint", "report")


def quickstart(steps: int) -> dict[str, Any]:
    cfg = copy.deepcopy(QUICKSTART_1X4)
    cfg["train"].update(steps=steps, device="cpu")
    cfg["eval"].update(every=500, examples=2048)
    return cfg


class _Timers:
    """Seconds per part; a part called inside another (the loss inside evaluation) counts as that one."""

    def __init__(self) -> None:
        self.s: dict[str, float] = defaultdict(float)
        self.n: dict[str, int] = defaultdict(int)
        self.inside = False

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            if self.inside:
                return fn(*args, **kwargs)
            self.inside, started = True, time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.s[name] += time.perf_counter() - started
                self.n[name] += 1
                self.inside = False

        return timed


def breakdown(steps: int = 500, threads: int = 1) -> dict[str, Any]:
    """Seconds per part of one `run_trial` of the quickstart cell (see the module docstring)."""
    from studyrunner.train import MemoryReporter, run_trial, trainer
    from studyrunner.train.checkpoint import Checkpoints

    timers = _Timers()
    build, evaluate_and_record = trainer.build_trial, trainer.evaluate_and_record
    backward, clip, save = torch.Tensor.backward, torch.nn.utils.clip_grad_norm_, Checkpoints.save

    def build_wrapped(*args, **kwargs):
        trial = build(*args, **kwargs)
        trial.task.train_batch = timers.wrap("batch", trial.task.train_batch)
        trial.task.loss = timers.wrap("loss", trial.task.loss)
        trial.step_model = timers.wrap("forward", trial.step_model)
        trial.optimizer.step = timers.wrap("optimizer", trial.optimizer.step)
        trial.optimizer.zero_grad = timers.wrap("optimizer", trial.optimizer.zero_grad)
        return trial

    class Reporter(MemoryReporter):
        log = timers.wrap("report", MemoryReporter.log)

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    trainer.build_trial = build_wrapped
    trainer.evaluate_and_record = timers.wrap("evaluation", evaluate_and_record)
    torch.Tensor.backward = timers.wrap("backward", backward)
    torch.nn.utils.clip_grad_norm_ = timers.wrap("clip", clip)
    Checkpoints.save = timers.wrap("checkpoint", save)
    try:
        with tempfile.TemporaryDirectory(prefix="sr-profile-") as folder:
            started = time.perf_counter()
            final = run_trial(quickstart(steps), 0, Reporter(), checkpoints=folder)
            wall = time.perf_counter() - started
    finally:
        trainer.build_trial, trainer.evaluate_and_record = build, evaluate_and_record
        torch.Tensor.backward, torch.nn.utils.clip_grad_norm_, Checkpoints.save = backward, clip, save
        torch.set_num_threads(previous)
    # evaluate_and_record is called after every step; it evaluates only on the steps eval.every names
    parts = {name: timers.s.get(name, 0.0) for name in PARTS}
    parts["other"] = wall - sum(parts.values())
    return {
        "steps": steps,
        "threads": threads,
        "wall_s": wall,
        "train_time_s": final["train_time_s"],
        "seconds": parts,
        "share": {k: v / wall for k, v in parts.items()},
        "calls": dict(timers.n),
    }


def operators(steps: int = 30, threads: int = 1, rows: int = 15) -> str:
    """torch.profiler's table of the operators of `steps` training steps (after 10 warm-up steps)."""
    from torch.profiler import ProfilerActivity, profile

    from studyrunner.train.trainer import build_trial, train_step
    from studyrunner.train.trial_progress import Progress

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trial = build_trial(quickstart(steps + 10), 0)
        progress = Progress()
        for _ in range(10):
            train_step(trial, progress)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                train_step(trial, progress)
    finally:
        torch.set_num_threads(previous)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ops", type=int, default=30, help="steps under torch.profiler (0: skip)")
    args = ap.parse_args()
    out = breakdown(args.steps, args.threads)
    print(f"quickstart 1x4, {out['steps']} steps, {out['threads']} thread(s): {out['wall_s']:.1f} s wall")
    for name, seconds in sorted(out["seconds"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:11s} {seconds:7.2f} s  {100 * out['share'][name]:5.1f}%  ({out['calls'].get(name, '')} calls)")
    if args.ops:
        print(operators(args.ops, args.threads))


if __name__ == "__main__":
    main()
