"""The product's trainer on a GPU beside a bare PyTorch loop of identical arithmetic, in one process.

    PYTHONPATH=. python benchmarks/gpu_trainer.py [--steps 2000] [--modes fp32,bf16,reduce_overhead]
        [--reference PATH/gpu_reference.py] [--extras]

Needs torch, numpy and pydantic only (no Ray, MLflow or SQL: the import rule of train/, models/, tasks/).

For each mode, on the quickstart's 1x4 cell (looped, d 64, 4 heads, p-hop n=32 p=2, batch 64, 2000
steps, `studies/quickstart.yaml` cell ef712b8ca8ea):
- product: `run_trial` with train.device cuda and the mode's train.precision / train.compile;
  ms/step = median over its 20-step train records (`step_time_ms`, the trainer's own timing: batch
  generation and copy, forward, backward, clip, AdamW, the loss read back) after the first 200 steps;
- bare: a hand-written loop doing the same arithmetic (the same model, with the product's initial
  weights copied in; the same p-hop batches, generated on the CPU and copied; the masked loss; grad
  clip; fused AdamW with the same groups and schedule; the loss read back each step), timed the same way.
Modes: fp32, tf32, bf16 (autocast) eager; `compile` (torch.compile default) and `reduce_overhead`
(CUDA graphs) in fp32. `--reference` also times the shared bare reference's 1x4 step (fixed batch on
the device, loss over all positions, the whole step compiled) for context. `--extras`: a resumed
checkpoint on the GPU (CUDA RNG restored, dropout on) and a few steps of every study's first cell.

Prints a table; with $OUT set, writes $OUT/gpu_trainer.json (after each measurement).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from studyrunner.tasks import build_task  # noqa: E402
from studyrunner.train import MemoryReporter, run_trial  # noqa: E402
from studyrunner.train.optim import lr_at  # noqa: E402

# The quickstart's 1x4 cell as `studyrunner plan studies/quickstart.yaml` resolves it (cell ef712b8ca8ea).
QUICKSTART_1X4 = {
    "task": {"name": "phop", "params": {"alphabet": 4, "seq_len": 32, "hops": 2}},
    "model": {
        "family": "looped",
        "params": {
            "d_model": 64, "n_heads": 4, "mlp_ratio": 4, "pos": "learned", "rope_base": 10000.0,
            "norm": "layernorm", "bias": False, "dropout": 0.0, "init_std": 0.02, "linear_init": "torch",
            "block_layers": 1, "loops": 4,
        },
    },
    "train": {
        "steps": 2000, "batch_size": 64, "lr": 0.002, "warmup_steps": 100, "min_lr_ratio": 0.1,
        "weight_decay": 0.1, "betas": [0.9, 0.98], "grad_clip": 1.0, "log_every": 20,
    },
    "eval": {"every": 500, "examples": 2048},
}  # fmt: skip
MODES = {  # mode -> (train.precision, train.compile)
    "fp32": ("fp32", "none"),
    "tf32": ("tf32", "none"),
    "bf16": ("bf16", "none"),
    "compile": ("fp32", "default"),
    "reduce_overhead": ("fp32", "reduce_overhead"),
}
DEVICE = "cuda"  # --device cpu: a dry run of this script where there is no GPU
WINDOW, SKIP = 20, 200  # timing: means over 20-step windows, their median after the first 200 steps


# ------------------------------------------------------------------------------------- bare loop


class Block(nn.Module):
    def __init__(self, d: int, h: int, causal: bool):
        super().__init__()
        self.h, self.causal = h, causal
        self.norm1, self.norm2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.mlp = nn.Module()
        self.mlp.fc, self.mlp.proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn.qkv(self.norm1(x)).view(b, t, 3, self.h, d // self.h).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=self.causal
        )
        x = x + self.attn.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp.proj(F.gelu(self.mlp.fc(self.norm2(x))))


class Bare(nn.Module):
    """The `looped` family's 1xL model with the product's parameter names (so its state dict loads)."""

    def __init__(self, vocab: int, seq: int, d: int, h: int, k: int, loops: int, causal: bool):
        super().__init__()
        self.loops = loops
        self.embed = nn.Module()
        self.embed.tokens, self.embed.positions = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, h, causal) for _ in range(k))
        self.head = nn.Module()
        self.head.norm, self.head.out = nn.LayerNorm(d, bias=False), nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed.tokens(tokens) + self.embed.positions.weight[: tokens.shape[1]]
        for _ in range(self.loops):
            for block in self.blocks:
                h = block(h)
        return self.head.out(self.head.norm(h))


def bare_loop(config: dict, seed: int, precision: str, compile_mode: str) -> dict:
    """The same training arithmetic as run_trial, written out by hand; ms/step timed like the trainer."""
    from studyrunner.train.trainer import build_trial

    dev = torch.device(DEVICE)
    cfg = copy.deepcopy(config)
    cfg["train"].update(device="cpu", precision="fp32", compile="none")
    ref = build_trial(cfg, seed)  # the product's initial weights and task, built on the CPU as it does
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    p, t = config["model"]["params"], config["train"]
    task = build_task(config["task"]["name"], config["task"]["params"], seed)
    model = Bare(
        task.facts.vocab_size, task.facts.seq_len, p["d_model"], p["n_heads"], p["block_layers"], p["loops"],
        task.facts.causal,
    )  # fmt: skip
    model.load_state_dict(ref.model.state_dict())
    model.to(dev)
    params = list(model.parameters())
    groups = [
        {"params": [q for q in params if q.dim() >= 2], "weight_decay": t["weight_decay"]},
        {"params": [q for q in params if q.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=t["lr"], betas=tuple(t["betas"]), fused=dev.type == "cuda")
    fwd = (
        model
        if compile_mode == "none"
        else torch.compile(model, mode={"default": None}.get(compile_mode, "reduce-overhead"))
    )
    times, losses = [], []
    for step in range(t["steps"]):
        started = time.perf_counter()
        lr = lr_at(step, lr=t["lr"], steps=t["steps"], warmup_steps=t["warmup_steps"], min_lr_ratio=t["min_lr_ratio"])
        for g in opt.param_groups:
            g["lr"] = lr
        batch = task.train_batch(step, t["batch_size"])
        x, y, mask = (a.to(dev, non_blocking=True) for a in (batch.inputs, batch.targets, batch.loss_mask))
        if compile_mode == "reduce_overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = fwd(x)
            loss = F.cross_entropy(logits[mask], y[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - started)
    windows = [statistics.fmean(times[i : i + WINDOW]) for i in range(0, len(times), WINDOW)]
    return {
        "ms_per_step": 1000 * statistics.median(windows[SKIP // WINDOW :]),
        "first_window_ms": 1000 * windows[0],
        "train_loss_first": statistics.fmean(losses[:WINDOW]),
        "train_loss_last": statistics.fmean(losses[-WINDOW:]),
    }


# --------------------------------------------------------------------------------------- product


def product(config: dict, seed: int, precision: str, compile_mode: str) -> dict:
    cfg = copy.deepcopy(config)
    cfg["train"].update(device=DEVICE, precision=precision, compile=compile_mode)
    reporter = MemoryReporter()
    started = time.perf_counter()
    final = run_trial(cfg, seed, reporter)
    wall = time.perf_counter() - started
    windows = [v for s, v in reporter.series("step_time_ms") if s > SKIP]
    loss = [v for _, v in reporter.series("train_loss")]
    return {
        "ms_per_step": statistics.median(windows),
        "first_window_ms": reporter.series("step_time_ms")[0][1],
        "train_loss_first": loss[0],
        "train_loss_last": loss[-1],
        "eval_accuracy": final["eval_accuracy"],
        "eval_loss": final["eval_loss"],
        "wall_s": wall,
        "facts": reporter.run_facts,
    }


# ---------------------------------------------------------------------------------------- extras


def checkpoint_on_gpu(config: dict) -> dict:
    """A resumed trial on the GPU: CUDA RNG state round-trips; with dropout (CUDA RNG in every step)
    an interrupted and resumed trial against one that never stopped, and two uninterrupted runs."""
    import tempfile

    from studyrunner.train.checkpoint import capture_rng, restore_rng

    state = capture_rng()
    a = torch.rand(4, device=DEVICE)
    restore_rng(state)
    rng_ok = bool(torch.equal(a, torch.rand(4, device=DEVICE))) and ("cuda" in state or DEVICE == "cpu")

    cfg = copy.deepcopy(config)
    cfg["model"]["params"]["dropout"] = 0.1
    cfg["train"].update(steps=60, warmup_steps=5, checkpoint_every=20, device=DEVICE)
    cfg["eval"].update(every=30, examples=256)
    timing = {"tokens_per_sec", "step_time_ms", "train_time_s"}

    def strip(m):
        return {k: v for k, v in m.items() if k not in timing}

    class Crash(MemoryReporter):
        def log(self, step, metrics):
            if step == 40:
                raise KeyboardInterrupt
            super().log(step, metrics)

    one, two = strip(run_trial(cfg, 0)), strip(run_trial(cfg, 0))
    with tempfile.TemporaryDirectory() as folder:
        try:
            run_trial(cfg, 0, Crash(), checkpoints=folder)
        except KeyboardInterrupt:
            pass
        resumed = strip(run_trial(cfg, 0, MemoryReporter(), checkpoints=folder))
    return {
        "cuda_rng_roundtrip": rng_ok,
        "uninterrupted_runs_identical": one == two,
        "resumed_equals_uninterrupted": resumed == one,
        "max_abs_diff_resumed": max(abs(resumed[k] - one[k]) for k in one),
    }


def smoke_studies(steps: int = 20) -> dict:
    """A few steps of each study's first cell on the GPU (every family and task the studies use)."""
    from studyrunner.study import compile_study, loads

    out = {}
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        try:
            cells = compile_study(loads(path.read_text())).cells
            seen = set()
            for cell in cells:
                kind = (cell.config["model"]["family"], cell.config["task"]["name"])
                if kind in seen:
                    continue
                seen.add(kind)
                cfg = copy.deepcopy(cell.config)
                cfg["train"].update(steps=steps, warmup_steps=0, log_every=10, device=DEVICE, precision="bf16")
                cfg["eval"].update(every=steps, examples=min(256, cfg["eval"]["examples"]))
                cfg["eval"].pop("loops", None)
                final = run_trial(cfg, 0)
                out[f"{path.stem}:{kind[0]}/{kind[1]}"] = f"ok loss {final['train_loss']:.3f}"
        except Exception as e:  # noqa: BLE001 - a report, not a test
            out[path.stem] = f"ERR {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return out


def reference_steps(path: str) -> dict:
    spec = importlib.util.spec_from_file_location("gpu_reference", path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    out = {}
    for mode in ("fp32", "bf16", "graphs"):
        torch.manual_seed(0)
        m = ref.Looped(8, 34, 64, 4, 1, 4).cuda()
        x = torch.randint(0, 8, (64, 34), device="cuda")
        y = torch.randint(0, 8, (64, 34), device="cuda")
        out[mode] = 1000 * ref.bench_step(m, x, y, mode, "cuda", steps=100, warm=20)
    return out


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="fp32,bf16,reduce_overhead")
    ap.add_argument("--reference", default="")
    ap.add_argument("--extras", action="store_true")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible: this benchmark needs one (--device cpu for a dry run)")
    config = copy.deepcopy(QUICKSTART_1X4)
    config["train"]["steps"] = args.steps
    result = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "cell": "quickstart 1x4 (ef712b8ca8ea)",
        "steps": args.steps,
        "modes": {},
    }
    out = os.environ.get("OUT")

    def save():
        if out:
            Path(out, "gpu_trainer.json").write_text(json.dumps(result, indent=1, default=str))

    for mode in args.modes.split(","):
        precision, compile_mode = MODES[mode]
        row = {}
        for side, fn in (("product", product), ("bare", bare_loop)):
            try:
                row[side] = fn(config, args.seed, precision, compile_mode)
            except Exception as e:  # noqa: BLE001 - report and go on
                traceback.print_exc()
                row[side] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        if "ms_per_step" in row["product"] and "ms_per_step" in row["bare"]:
            row["bare_over_product"] = row["bare"]["ms_per_step"] / row["product"]["ms_per_step"]
        result["modes"][mode] = row
        print(f"[{mode}] {json.dumps({k: v for k, v in row.items()}, default=str)[:600]}", flush=True)
        save()
    if args.reference:
        try:
            result["reference_1x4_ms"] = reference_steps(args.reference)
        except Exception as e:  # noqa: BLE001
            result["reference_1x4_ms"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        save()
    if args.extras:
        for name, fn in (("checkpoint", lambda: checkpoint_on_gpu(config)), ("studies", smoke_studies)):
            try:
                result[name] = fn()
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                result[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            save()

    print(f"\n{result['device']}, torch {result['torch']}, {result['cell']}, {args.steps} steps, {result['date']}")
    print(f"{'mode':16s} {'product ms/step':>16s} {'bare ms/step':>13s} {'bare/product':>13s} "
          f"{'loss first->last':>18s} {'eval_acc':>9s} {'1st window ms':>14s}")  # fmt: skip
    for mode, row in result["modes"].items():
        p, b = row["product"], row["bare"]
        if "error" in p or "error" in b:
            print(f"{mode:16s} product: {p.get('error', 'ok')} | bare: {b.get('error', 'ok')}")
            continue
        print(
            f"{mode:16s} {p['ms_per_step']:16.2f} {b['ms_per_step']:13.2f} {row['bare_over_product']:13.3f} "
            f"{p['train_loss_first']:8.3f}->{p['train_loss_last']:.3f} {p['eval_accuracy']:9.3f} "
            f"{p['first_window_ms']:14.1f}"
        )
    for key in ("reference_1x4_ms", "checkpoint", "studies"):
        if key in result:
            print(f"{key}: {json.dumps(result[key], default=str)}")
    if result["modes"]:
        first = next(iter(result["modes"].values()))["product"]
        print("facts:", json.dumps(first.get("facts", {})))
    assert all(math.isfinite(r["product"].get("train_loss_last", 0.0)) for r in result["modes"].values())


if __name__ == "__main__":
    main()
