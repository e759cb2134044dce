"""The prepared GPU run: every GPU figure side by side, in one run on the lent device (at most ~8 minutes).

    PYTHONPATH=. python benchmarks/gpu_suite.py [--tiny] [--out PATH] [--study studies/gpu/X.yaml]

Needs torch, numpy, pandas and pydantic only (the device machine has no Ray or MLflow). Writes one JSON
(default `$OUT/gpu_suite.json`, else ./gpu_suite.json), rewritten after each part, naming the device, with
each figure beside its target (docs/performance.md gives them):

1. `step`: the quickstart's 1x4 cell (benchmarks/gpu_trainer.py `QUICKSTART_1X4`): the product's trainer
   (`run_trial`, fp32 eager) against a bare eager loop of the same arithmetic and a bare whole-step CUDA
   graph; and the product's graphed step (a pack of one, train/packed_graph.py). Target: the product's step
   <= 1.25x the bare graph.
2. `packed`: the same cell packed, S = 1, 8, 32 members (train/vectorized.py, graphed where it can be):
   seed-steps/s against one trial eager. Targets: S = 8 >= 10x, S = 32 >= 15x.
3. `fractional`: P processes sharing the GPU, each a pack of S (what `resources: {gpu: 1/P}` with
   `train.pack` gives), against one trial per GPU.
4. `large_cell`: a d 512 cell's model FLOP/s as a fraction of the GPU's bf16 matmul rate
   (benchmarks/large_cell.py). Target >= 0.45 (the issue's d >= 1024 target: see the page).
5. `first_look`: one `studies/gpu/` study's first look, its packs at once (benchmarks/gpu_study.py), stopped
   at a deadline: trials finished and wall time.

`--tiny`: every part on the CPU at toy size (what CI runs: the code paths, no figure that means anything).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_study, gpu_trainer, large_cell  # noqa: E402
from studyrunner.train import MemoryReporter, run_trial  # noqa: E402
from studyrunner.train.vectorized import run_trials_together  # noqa: E402

TARGETS = {
    "product_over_bare_graph": "<= 1.25",
    "packed_8_over_one_trial": ">= 10",
    "packed_32_over_one_trial": ">= 15",
    "large_cell_mfu": ">= 0.45",
}


def cell(tiny: bool, steps: int) -> dict[str, Any]:
    config = copy.deepcopy(gpu_trainer.QUICKSTART_1X4)
    config["train"].update(steps=steps, log_every=20 if not tiny else 5)
    config["eval"].update(every=steps, examples=256 if not tiny else 16)
    if tiny:
        config["model"]["params"].update(d_model=16, n_heads=2)
        config["train"].update(batch_size=8, warmup_steps=2)
    return config


def steady_ms(reporter: MemoryReporter, skip: int) -> float:
    windows = [v for s, v in reporter.series("step_time_ms") if s > skip]
    return statistics.median(windows or [v for _, v in reporter.series("step_time_ms")[-1:]])


# ------------------------------------------------------------------------------------------ 1. step


def product_ms(config: dict, device: str, skip: int) -> float:
    cfg = copy.deepcopy(config)
    cfg["train"]["device"] = device
    reporter = MemoryReporter()
    run_trial(cfg, 0, reporter)
    return steady_ms(reporter, skip)


def packed_ms(config: dict, device: str, members: int, skip: int) -> tuple[float, str]:
    """ms per shared step of a pack of `members` seeds, and whether it was graphed."""
    cfg = copy.deepcopy(config)
    cfg["train"]["device"] = device
    reporters = [MemoryReporter() for _ in range(members)]
    run_trials_together(cfg, list(range(members)), reporters)
    return steady_ms(reporters[0], skip), reporters[0].run_facts.get("pack_graph", "")


def bare_graph_ms(config: dict, steps: int) -> float:
    """The bare model's whole step (forward, masked loss, backward, clip, fused capturable AdamW) as one CUDA
    graph on a fixed batch, replayed: the floor a trainer's step can reach on this GPU."""
    from studyrunner.tasks import build_task

    p, t = config["model"]["params"], config["train"]
    task = build_task(config["task"]["name"], config["task"]["params"], 0)
    f = task.facts
    shape = (p["d_model"], p["n_heads"], p["block_layers"], p["loops"])
    model = gpu_trainer.Bare(f.vocab_size, f.seq_len, *shape, f.causal)
    model.cuda()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=t["lr"], fused=True, capturable=True)
    batch = task.train_batch(0, t["batch_size"])
    x, y, mask = (a.cuda() for a in (batch.inputs, batch.targets, batch.loss_mask))
    scored = mask.flatten().float()

    def step() -> torch.Tensor:
        logits = model(x)
        per_token = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
        loss = (per_token * scored).sum() / scored.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - started) / steps


def part_step(tiny: bool, device: str) -> dict[str, Any]:
    steps, skip = (20, 5) if tiny else (600, 200)
    config = cell(tiny, steps)
    gpu_trainer.DEVICE = device
    out: dict[str, Any] = {
        "product_eager_ms": product_ms(config, device, skip),
        "bare_eager_ms": gpu_trainer.bare_loop(config, 0, "fp32", "none")["ms_per_step"] if not tiny else None,
    }
    out["product_graphed_ms"], out["product_graphed"] = packed_ms(config, device, 1, skip)
    if device == "cuda":
        out["bare_graph_ms"] = bare_graph_ms(config, steps=500)
        out["product_over_bare_graph"] = out["product_graphed_ms"] / out["bare_graph_ms"]
        out["product_eager_over_bare_graph"] = out["product_eager_ms"] / out["bare_graph_ms"]
    return out


# ---------------------------------------------------------------------------------------- 2. packed


def part_packed(tiny: bool, device: str, one_trial_ms: float) -> dict[str, Any]:
    steps, skip = (20, 5) if tiny else (400, 150)
    config = cell(tiny, steps)
    out: dict[str, Any] = {"one_trial_seed_steps_per_s": 1000 / one_trial_ms}
    for members in (1, 2) if tiny else (1, 8, 32):
        ms, graphed = packed_ms(config, device, members, skip)
        rate = members * 1000 / ms
        out[f"packed_{members}"] = {"ms_per_step": ms, "seed_steps_per_s": rate, "graph": graphed}
        out[f"packed_{members}_over_one_trial"] = rate / out["one_trial_seed_steps_per_s"]
    return out


# ------------------------------------------------------------------------------------ 3. fractional


def _pack_process(config: dict, device: str, members: int, skip: int, barrier: Any, queue: Any) -> None:
    torch.set_num_threads(1)
    cfg = copy.deepcopy(config)
    cfg["train"]["device"] = device
    reporters = [MemoryReporter() for _ in range(members)]
    barrier.wait()  # every process trains at once, as packs sharing one GPU do
    run_trials_together(cfg, list(range(members)), reporters)
    queue.put(members * 1000 / steady_ms(reporters[0], skip))


def part_fractional(tiny: bool, device: str, one_trial_ms: float) -> dict[str, Any]:
    steps, skip = (20, 5) if tiny else (400, 150)
    config = cell(tiny, steps)
    out: dict[str, Any] = {}
    ctx = mp.get_context("spawn")
    for processes, members in ((2, 2),) if tiny else ((4, 8), (8, 8)):
        barrier, queue = ctx.Barrier(processes), ctx.Queue()
        procs = [ctx.Process(target=_pack_process, args=(config, device, members, skip, barrier, queue))
                 for _ in range(processes)]  # fmt: skip
        for proc in procs:
            proc.start()
        rates = [queue.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join()
        total = sum(rates)
        out[f"{processes}x{members}"] = {"seed_steps_per_s": total, "over_one_trial": total * one_trial_ms / 1000}
    return out


# ----------------------------------------------------------------------------------- 4, 5 and main


def part_large_cell(tiny: bool, device: str) -> dict[str, Any]:
    measured = large_cell.measure(quick=True, tiny=tiny, device=device)
    return {**measured["figures"], "details": measured["details"]}


def part_first_look(tiny: bool, device: str, study: Path, out_dir: Path) -> dict[str, Any]:
    if tiny:
        return gpu_study.first_look(
            ROOT / "studies" / "quickstart.yaml", 300, device, out_dir / "first_look.jsonl", steps=10
        )
    return gpu_study.first_look(study, 240, device, out_dir / "first_look.jsonl")


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"cpu ({os.cpu_count()} cores)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="every part on the CPU at toy size (CI)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_suite.json")
    parser.add_argument("--study", type=Path, default=ROOT / "studies" / "gpu" / "faithful_melt_teacher.yaml")
    args = parser.parse_args(argv)
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "device": device_name(device),
        "torch": str(torch.__version__),
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tiny": args.tiny,
        "targets": TARGETS,
    }

    def run(name: str, part) -> Any:
        started = time.perf_counter()
        try:
            results[name] = part()
        except Exception:  # noqa: BLE001 - one part's failure is recorded; the others still run
            results[name] = {"error": traceback.format_exc()[-2000:]}
        results[name + "_s"] = round(time.perf_counter() - started, 1)
        args.out.write_text(json.dumps(results, indent=2, default=str))
        print(f"{name}: {json.dumps(results[name], default=str)[:400]}", flush=True)
        return results[name]

    step = run("step", lambda: part_step(args.tiny, device))
    one_ms = step.get("product_eager_ms") or 1.0
    run("packed", lambda: part_packed(args.tiny, device, one_ms))
    run("fractional", lambda: part_fractional(args.tiny, device, one_ms))
    run("large_cell", lambda: part_large_cell(args.tiny, device))
    run("first_look", lambda: part_first_look(args.tiny, device, args.study, args.out.parent))
    failed = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
    print(f"wrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
