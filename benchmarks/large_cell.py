"""Large-cell GPU efficiency: the model's TFLOP/s on a d 512 cell as a fraction of
the same GPU's measured bf16 matmul rate. Target >= 0.40. Needs a CUDA GPU; elsewhere the figure is
'skipped: no GPU' (`device="cpu"` runs the same code at toy size, as a dry run for tests).

Cell: looped, d 512, 8 heads, 2 distinct layers looped 4 times (effective depth 8), p-hop n = 256 (4
hops), batch 64 (16,384 tokens a step), bf16 autocast, `torch.compile` (default mode), trained by
`run_trial` (the product's step; batches prefetched to the GPU). ms/step = median of its
`step_time_ms` windows after warm-up (compilation). Model FLOPs per step, the usual count:

    3 x tokens x (2 x N_eff + 2 x 2 x T x d x layers_eff)    (forward x 3 = forward + backward)

N_eff: the weights each token passes through (block weights x loops, plus the output head; the
embedding lookups are not matmuls), layers_eff = block_layers x loops; the attention term is QK^T and
AV over the whole sequence (causal attention computes about half of it, so this is an upper count, as
in the usual MFU convention). The matmul rate: bf16 (8192 x 8192) @ (8192 x 8192), median of timed
repeats after warm-up.

Needs torch, numpy and pydantic only (no Ray, MLflow or SQL).
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import torch

from .common import figure, skipped

LARGE = {
    "task": {"name": "phop", "params": {"alphabet": 4, "seq_len": 256, "hops": 4}},
    "model": {
        "family": "looped",
        "params": {"d_model": 512, "n_heads": 8, "mlp_ratio": 4, "block_layers": 2, "loops": 4},
    },
    "train": {
        "steps": 400, "batch_size": 64, "lr": 1e-3, "warmup_steps": 50, "min_lr_ratio": 0.1, "weight_decay": 0.1,
        "betas": [0.9, 0.98], "grad_clip": 1.0, "log_every": 20, "precision": "bf16", "compile": "default",
    },
    "eval": {"every": 400, "examples": 256},
}  # fmt: skip
TOY = {"seq_len": 16, "hops": 2, "d_model": 32, "n_heads": 2, "steps": 8, "log_every": 2, "batch_size": 8}


def resolved(config: dict[str, Any]) -> dict[str, Any]:
    """The cell with every default filled (as a study compiles it)."""
    from studyrunner.study.compiler import resolve

    return resolve(copy.deepcopy(config))


def model_flops_per_step(config: dict[str, Any]) -> float:
    from studyrunner.models import build_model
    from studyrunner.tasks import build_task

    p, t = config["model"]["params"], config["train"]
    task = build_task(config["task"]["name"], config["task"]["params"], 0)
    with torch.device("meta"):
        model = build_model(config["model"]["family"], p, task.facts)
    block = sum(q.numel() for b in model.blocks for q in b.parameters() if q.dim() >= 2)
    head = sum(q.numel() for n, q in model.named_parameters() if q.dim() >= 2 and "head" in n)
    layers = p["block_layers"] * p["loops"]
    n_eff = block * p["loops"] + head
    seq = task.train_batch(0, 1).inputs.shape[1]
    tokens = t["batch_size"] * seq
    return 3.0 * tokens * (2.0 * n_eff + 4.0 * seq * p["d_model"] * layers)


def matmul_tflops(device: str, n: int = 8192, repeats: int = 20) -> float:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(repeats + 3):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - started)
    return 2.0 * n**3 / statistics.median(times) / 1e12


def model_ms_per_step(config: dict[str, Any], skip: int) -> dict[str, Any]:
    from studyrunner.train import MemoryReporter, run_trial

    reporter = MemoryReporter()
    started = time.perf_counter()
    final = run_trial(config, 0, reporter)
    windows = [(s, v) for s, v in reporter.series("step_time_ms")]
    steady = [v for s, v in windows if s > skip] or [v for _, v in windows[-1:]]
    return {"ms_per_step": statistics.median(steady), "wall_s": time.perf_counter() - started, "final": final}


def measure(quick: bool = True, tiny: bool = False, device: str | None = None) -> dict[str, Any]:
    device = device or ("cuda" if torch.cuda.is_available() else None)
    target = ">= 0.40"
    if device is None:
        return {"figures": {"large_cell_mfu": skipped("no GPU", target=target)}, "details": {}}
    config = copy.deepcopy(LARGE)
    repeats, skip = (1, 100) if quick else (3, 200)
    if quick:
        config["train"]["steps"] = 300
    if device == "cpu":  # a dry run of the code path at toy size
        tp, mp, tr = config["task"]["params"], config["model"]["params"], config["train"]
        tp.update(seq_len=TOY["seq_len"], hops=TOY["hops"])
        mp.update(d_model=TOY["d_model"], n_heads=TOY["n_heads"])
        tr.update(steps=TOY["steps"], log_every=TOY["log_every"], batch_size=TOY["batch_size"], warmup_steps=2)
        tr.update(precision="fp32", compile="none")
        config["eval"].update(every=TOY["steps"], examples=16)
        repeats, skip = 1, 2
    config["train"]["device"] = device
    config = resolved(config)
    flops = model_flops_per_step(config)
    peak = matmul_tflops(device, n=8192 if device == "cuda" else 256, repeats=20 if device == "cuda" else 3)
    runs = [model_ms_per_step(config, skip) for _ in range(repeats)]
    model_tflops = [flops / (r["ms_per_step"] / 1000) / 1e12 for r in runs]
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return {
        "figures": {
            "large_cell_mfu": figure(
                [m / peak for m in model_tflops],
                "fraction of matmul rate",
                target=target if device == "cuda" else None,
                note=f"{name}; d {config['model']['params']['d_model']}"
                + ("" if device == "cuda" else " (CPU dry run)"),
            ),
            "large_cell_model_tflops": figure(model_tflops, "TFLOP/s"),
            "matmul_tflops": figure([peak], "TFLOP/s", note="bf16 8192^3" if device == "cuda" else "fp32, dry run"),
        },
        "details": {
            "device": name,
            "model_flops_per_step": flops,
            "ms_per_step": [round(r["ms_per_step"], 3) for r in runs],
            "train_loss": [r["final"].get("train_loss") for r in runs],
            "config": config,
        },
    }
