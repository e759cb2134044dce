"""Trainer efficiency on the CPU: the product's training step beside a hand-written PyTorch loop of
identical arithmetic, in one process, one torch thread, interleaved repeats.

The cell is the quickstart's 1x4 (`gpu_trainer.QUICKSTART_1X4`: looped d 64, 4 heads, p-hop n=32 p=2,
batch 64). Product: `run_trial` on the CPU; tokens/s from its own `step_time_ms` records (batch, forward,
backward, clip, AdamW, loss read back; evaluation excluded). Bare: the same model class as
gpu_trainer.py with the product's initial weights, the same batches (`task.train_batch`), masked
cross-entropy, grad clip, foreach AdamW with the same groups and schedule, timed the same way. On the
CPU the two compute the same numbers, so their train losses are compared too (`max_loss_diff`).

Also: what the batch prefetcher (studyrunner/train/prefetch.py) does on the CPU: `run_trial` wall time
with STUDYRUNNER_PREFETCH=0 against =1, with the second core idle and with it busy (a neighbour process
doing matmuls on one thread, as when a study fills both CPU slots).

Needs torch, numpy and pydantic only (no Ray, MLflow or SQL).
"""

from __future__ import annotations

import copy
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from .common import figure, timed
from .gpu_trainer import QUICKSTART_1X4, Bare

SIZES = {  # steps per run, repeats, log window (steps), prefetch repeats
    "tiny": (12, 1, 4, 1),
    "quick": (80, 3, 10, 2),
    "full": (300, 5, 20, 3),
}


def cell(steps: int, window: int) -> dict[str, Any]:
    cfg = copy.deepcopy(QUICKSTART_1X4)
    cfg["train"].update(steps=steps, warmup_steps=min(10, steps // 2), log_every=window, device="cpu")
    cfg["eval"].update(every=steps, examples=256)
    return cfg


def product(cfg: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    from studyrunner.train import MemoryReporter, run_trial

    reporter = MemoryReporter()
    wall, final = timed(run_trial, cfg, seed, reporter)
    return {
        "window_ms": [v for _, v in reporter.series("step_time_ms")],
        "losses": [v for _, v in reporter.series("train_loss")],
        "wall_s": wall,
        "train_time_s": final["train_time_s"],
    }


def bare(cfg: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """The product's step, written out by hand (see the module docstring)."""
    from studyrunner.tasks import build_task
    from studyrunner.train.optim import lr_at
    from studyrunner.train.trainer import build_trial

    ref = build_trial(cfg, seed)  # the product's initial weights, exactly as it builds them
    p, t = cfg["model"]["params"], cfg["train"]
    task = build_task(cfg["task"]["name"], cfg["task"]["params"], seed)
    facts = task.facts
    model = Bare(
        facts.vocab_size, facts.seq_len, p["d_model"], p["n_heads"], p["block_layers"], p["loops"], facts.causal
    )
    model.load_state_dict(ref.model.state_dict())
    del ref
    params = list(model.parameters())
    groups = [
        {"params": [q for q in params if q.dim() >= 2], "weight_decay": t["weight_decay"]},
        {"params": [q for q in params if q.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=t["lr"], betas=tuple(t["betas"]), foreach=True)
    model.train()
    times, losses = [], []
    for step in range(t["steps"]):
        started = time.perf_counter()
        lr = lr_at(step, lr=t["lr"], steps=t["steps"], warmup_steps=t["warmup_steps"], min_lr_ratio=t["min_lr_ratio"])
        for g in opt.param_groups:
            g["lr"] = lr
        batch = task.train_batch(step, t["batch_size"])
        logits = model(batch.inputs)
        loss = F.cross_entropy(logits[batch.loss_mask], batch.targets[batch.loss_mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - started)
    w = t["log_every"]
    return {
        "window_ms": [1000 * statistics.fmean(times[i : i + w]) for i in range(0, len(times), w)],
        # summed in order from 0.0 and divided, as the trainer's window does (so equal losses compare equal)
        "losses": [sum(losses[i : i + w], 0.0) / len(losses[i : i + w]) for i in range(0, len(losses), w)],
    }


def _steady(window_ms: list[float]) -> float:
    """Median window mean after the first window (allocator and cache warm-up)."""
    return statistics.median(window_ms[1:] or window_ms)


@contextmanager
def _env(name: str, value: str):
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextmanager
def busy_neighbour():
    """A process keeping one core busy with one-thread matmuls, as a second trial would."""
    code = (
        "import torch; torch.set_num_threads(1); a = torch.randn(256, 256)\n"
        "while True:\n    a = torch.tanh(a @ a.T * 0.01)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(1.5)  # its torch import
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def measure(quick: bool = True, tiny: bool = False) -> dict[str, Any]:
    steps, repeats, window, prefetch_repeats = SIZES["tiny" if tiny else "quick" if quick else "full"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = cell(steps, window)
        from studyrunner.tasks import build_task

        task = build_task(cfg["task"]["name"], cfg["task"]["params"], 0)
        tokens = task.train_batch(0, cfg["train"]["batch_size"]).inputs.numel()  # as the trainer counts
        prod_tps, bare_tps, ratio, loss_diff = [], [], [], []
        with _env("STUDYRUNNER_PREFETCH", "0"):  # the step as the CPU runs it by default
            for r in range(repeats):
                runs = {}
                for side in ("product", "bare") if r % 2 == 0 else ("bare", "product"):
                    runs[side] = (product if side == "product" else bare)(cfg)
                p, b = _steady(runs["product"]["window_ms"]), _steady(runs["bare"]["window_ms"])
                prod_tps.append(1000 * tokens / p)
                bare_tps.append(1000 * tokens / b)
                ratio.append(b / p)
                loss_diff.append(
                    max(abs(x - y) for x, y in zip(runs["product"]["losses"], runs["bare"]["losses"], strict=False))
                )
        prefetch: dict[str, dict[str, list[float]]] = {"idle": {}, "busy": {}}
        conditions = ("idle",) if tiny else ("idle", "busy")
        for condition in conditions:
            ctx = busy_neighbour() if condition == "busy" else _null()
            with ctx:
                for r in range(prefetch_repeats):
                    for mode in ("0", "1") if r % 2 == 0 else ("1", "0"):
                        with _env("STUDYRUNNER_PREFETCH", mode):
                            prefetch[condition].setdefault(mode, []).append(product(cfg)["wall_s"])
        figures = {
            "trainer_cpu_tokens_per_s": figure(prod_tps, "tokens/s", note="product run_trial step, 1 thread"),
            "bare_cpu_tokens_per_s": figure(bare_tps, "tokens/s", note="hand-written loop, same arithmetic"),
            "trainer_cpu_efficiency": figure(ratio, "x bare", target=">= 0.95"),
            "trainer_cpu_max_loss_diff": figure(loss_diff, "abs", note="train-loss windows, product vs bare", digits=9),
        }
        for condition in conditions:
            off, on = prefetch[condition]["0"], prefetch[condition]["1"]
            figures[f"prefetch_cpu_speedup_{condition}"] = figure(
                [a / b for a, b in zip(off, on, strict=True)],
                "x",
                note=f"run_trial wall without / with prefetch, second core {condition}",
            )
        return {
            "figures": figures,
            "details": {
                "cell": "quickstart 1x4 (looped d64, p-hop n=32 p=2, batch 64)",
                "steps": steps,
                "repeats": repeats,
                "threads": 1,
                "prefetch_wall_s": prefetch,
            },
        }
    finally:
        torch.set_num_threads(threads)


@contextmanager
def _null():
    yield
