"""Seeds trained together on the CPU: seed-steps/s of `run_trials_together` for 8 seeds
of the quickstart's 1x4 cell against the same 8 seeds as separate `run_trial`s.

    python -m benchmarks.seeds_together [--quick | --tiny] [--seeds 8] [--steps N]

The cell is `gpu_trainer.QUICKSTART_1X4` (looped d 64, 4 heads, 1 layer x 4 loops, p-hop n=32 p=2,
batch 64) on the CPU, every run with one torch thread (a `resources.cpu: 1` trial), N steps, one eval
of 256 examples at the end. Four ways to train the same 8 (seed, N steps):

- `separate`: 8 `run_trial`s one after another in this process (the reference);
- `separate_2proc`: two processes at once, each running 4 of the seeds as separate trials (what a study
  filling 2 CPU slots does; the second reference, since the machine has 2 cores);
- `together`: one `run_trials_together` over the 8 seeds in this process;
- `together_2proc` (not with --quick): two processes at once, each training 4 seeds together.

Beside it, `separate` and `together` on the same cell at d 16, batch 16 (4x the steps): where per-op
overhead rather than arithmetic dominates a CPU step, which is where batching seeds pays on a CPU.

Rates are seed-steps per second: `step` rates over the trainer's own training-step time
(`step_time_ms` records: batches, forward, backward, clip, AdamW; build and evaluation excluded; the
first of 4 train windows left out as warm-up; processes at once: over the slower one's), `wall` rates
over whole calls (build and evaluation included), `cpu` rates over the process CPU time of whole calls
(one thread each, so nearly blind to other jobs on the machine, though a shared machine still slows
everyone's caches). The target: `together` >= 2x `separate` on 2 CPU cores.

Needs torch, numpy and pydantic only (no Ray, MLflow or SQL).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from .common import ROOT, figure, skipped
from .gpu_trainer import QUICKSTART_1X4

SIZES = {  # steps per run, repeats, with the two-process together run (steps: a multiple of 4)
    "tiny": (4, 1, False),
    "quick": (8, 1, False),
    "full": (40, 2, True),
}
SEEDS = 8


SMALL = {"d_model": 16, "n_heads": 2, "batch_size": 16}  # the same cell, small enough to be overhead-bound


def cell(steps: int, small: bool = False) -> dict[str, Any]:
    cfg = copy.deepcopy(QUICKSTART_1X4)
    if small:
        cfg["model"]["params"].update(d_model=SMALL["d_model"], n_heads=SMALL["n_heads"])
        cfg["train"]["batch_size"] = SMALL["batch_size"]
    window = max(1, steps // 4)  # 4 train records; the first (warm-up) is left out of step rates
    cfg["train"].update(steps=steps, warmup_steps=min(10, steps - 1), log_every=window, device="cpu")
    cfg["eval"].update(every=steps, examples=256)
    return cfg


def _run(kind: str, cfg: dict[str, Any], seeds: list[int]) -> dict[str, float]:
    """Train `seeds` one way in this process (one torch thread); its times."""
    from studyrunner.train import MemoryReporter, run_trial
    from studyrunner.train.vectorized import run_trials_together

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reporters = [MemoryReporter() for _ in seeds]
        wall, cpu = time.perf_counter(), time.process_time()
        if kind == "separate":
            finals = [run_trial(cfg, seed, reporter) for seed, reporter in zip(seeds, reporters, strict=True)]
        else:
            finals = run_trials_together(cfg, seeds, reporters)
            reporters = reporters[:1]  # the shared step: every seed reports the same times
        windows = [_windows(r.series("step_time_ms"))[1:] for r in reporters]  # after the first (warm-up)
        return {
            "seed_steps": len(seeds) * cfg["train"]["steps"],
            "steady_seed_steps": len(seeds) * sum(n for n, _ in windows[0]),
            "train_s": sum(n * ms for w in windows for n, ms in w) / 1000,
            "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu,
            "train_loss": statistics.fmean(f["train_loss"] for f in finals),
        }
    finally:
        torch.set_num_threads(threads)


def _windows(series: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """(steps, mean ms per step) of each train window, from (record step, step_time_ms) records."""
    steps = [step for step, _ in series]
    return [(step - before, ms) for before, (step, ms) in zip([0, *steps], series, strict=False)]


def _in_processes(kind: str, cfg: dict[str, Any], groups: list[list[int]]) -> dict[str, float]:
    """`_run(kind, ...)` in one process per seed group, all at once; the rates of the whole."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.seeds_together", "--child", kind, json.dumps([cfg, seeds])],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for seeds in groups
    ]
    outs = []
    for proc in procs:
        stdout, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark child ({kind}) failed with exit status {proc.returncode}")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return {
        "seed_steps": sum(o["seed_steps"] for o in outs),
        "steady_seed_steps": sum(o["steady_seed_steps"] for o in outs),
        "train_s": max(o["train_s"] for o in outs),  # at once: the whole is done when the slower is
        "wall_s": max(o["wall_s"] for o in outs),
        "cpu_s": sum(o["cpu_s"] for o in outs),
        "train_loss": statistics.fmean(o["train_loss"] for o in outs),
    }


def _rates(run: dict[str, float]) -> dict[str, float]:
    n = run["seed_steps"]
    return {"step": run["steady_seed_steps"] / run["train_s"], "wall": n / run["wall_s"], "cpu": n / run["cpu_s"]}


def measure(
    quick: bool = True, tiny: bool = False, *, seeds: int | None = None, steps: int | None = None
) -> dict[str, Any]:
    size_steps, repeats, with_2proc_together = SIZES["tiny" if tiny else "quick" if quick else "full"]
    seeds = seeds or (2 if tiny else SEEDS)  # tiny: the code paths only, in seconds
    cfg = cell(steps or size_steps)
    all_seeds = list(range(seeds))
    halves = [all_seeds[: seeds // 2], all_seeds[seeds // 2 :]]
    kinds = ["separate", "together"] + ([] if tiny else ["separate_2proc"])  # tiny: no process starts
    kinds += ["together_2proc"] if with_2proc_together else []
    _run("separate", cell(2), [0])  # warm-up: first calls of every kernel, lazy imports
    _run("together", cell(2), [0, 1])
    rates: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for r in range(repeats):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:  # interleaved: slow drifts hit both sides
            if kind.endswith("_2proc"):
                run = _in_processes(kind.removesuffix("_2proc"), cfg, halves)
            else:
                run = _run(kind, cfg, all_seeds)
            runs[kind].append({k: round(v, 4) for k, v in run.items()})
            rates[kind].append(_rates(run))

    # Where batching pays on a CPU: the same cell at d 16, batch 16 (per-op overhead, not arithmetic, dominates).
    small_cfg = cell(4 * (steps or size_steps), small=True)
    small: dict[str, list[dict[str, float]]] = {"separate": [], "together": []}
    for r in range(repeats):
        for kind in ("separate", "together") if r % 2 == 0 else ("together", "separate"):
            small[kind].append(_rates(_run(kind, small_cfg, all_seeds)))

    def ratio(a: str, b: str, rate: str) -> list[float]:
        return [x[rate] / y[rate] for x, y in zip(rates[a], rates[b], strict=True)]

    figures: dict[str, Any] = {}
    for kind in kinds:
        figures[f"{kind}_seed_steps_per_s"] = figure(
            [x["step"] for x in rates[kind]], "seed-steps/s", note="over training-step time"
        )
    figures["together_speedup"] = figure(
        ratio("together", "separate", "step"), "x separate", target=">= 2", note="step rate, 1 thread each"
    )
    figures["together_speedup_wall"] = figure(ratio("together", "separate", "wall"), "x separate", note="whole calls")
    figures["together_speedup_cpu"] = figure(
        ratio("together", "separate", "cpu"), "x separate", note="seed-steps per CPU second, whole calls"
    )
    if "separate_2proc" in kinds:
        figures["together_vs_2proc"] = figure(
            ratio("together", "separate_2proc", "step"), "x", note="1 process, 1 thread vs 2 processes at once"
        )
    else:
        figures["together_vs_2proc"] = skipped("not in --tiny mode (two process starts)")
    figures["small_cell_together_speedup"] = figure(
        [t["step"] / s["step"] for t, s in zip(small["together"], small["separate"], strict=True)],
        "x separate",
        note="step rate; the cell at d 16, batch 16",
    )
    if with_2proc_together:
        figures["together_2proc_vs_separate_2proc"] = figure(
            ratio("together_2proc", "separate_2proc", "step"), "x", note="both on 2 processes at once"
        )
    return {
        "figures": figures,
        "details": {
            "cell": "quickstart 1x4 (looped d64, p-hop n=32 p=2, batch 64), CPU, 1 torch thread per process",
            "seeds": seeds,
            "steps": cfg["train"]["steps"],
            "repeats": repeats,
            "runs": runs,
            "small_cell": {**SMALL, "steps": small_cfg["train"]["steps"], "rates": small},
            "load_average": list(os.getloadavg()),
        },
    }


def print_table(result: dict[str, Any]) -> None:
    d = result["details"]
    print(f"{d['seeds']} seeds x {d['steps']} steps, {d['cell']}; load average {d['load_average']}")
    print(f"{'run (seed-steps/s)':<22}{'step':>9}{'wall':>9}{'cpu':>9}{'train_loss':>12}")
    for kind, runs in d["runs"].items():
        for run in runs:
            r = _rates(run)
            print(f"{kind:<22}{r['step']:>9.2f}{r['wall']:>9.2f}{r['cpu']:>9.2f}{run['train_loss']:>12.4f}")
    small = d["small_cell"]
    for kind, rates in small["rates"].items():
        for r in rates:
            print(f"{'small ' + kind:<22}{r['step']:>9.2f}{r['wall']:>9.2f}{r['cpu']:>9.2f}")
    for name, f in result["figures"].items():
        if "skipped" in f:
            print(f"{name:<36}skipped: {f['skipped']}")
        elif f["unit"].split()[0] == "x":
            target = f" (target {f['target']}: {'met' if f['meets_target'] else 'MISSED'})" if "target" in f else ""
            print(f"{name:<36}{f['median']:>7.2f} {f['unit']}{target}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.seeds_together", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 steps, one repeat (under a minute)")
    ap.add_argument("--tiny", action="store_true", help="2 seeds, 4 steps, for tests (figures mean nothing)")
    ap.add_argument("--seeds", type=int, default=None, help=f"seeds per run (default {SEEDS}; --tiny: 2)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print the result as JSON too")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "CONFIG_AND_SEEDS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, payload = args.child
        cfg, seeds = json.loads(payload)
        _run(kind, {**cfg, "train": {**cfg["train"], "steps": 2, "warmup_steps": 1}}, seeds[:2])  # warm-up
        print(json.dumps(_run(kind, cfg, seeds)))
        return
    result = measure(args.quick, args.tiny, seeds=args.seeds, steps=args.steps)
    print_table(result)
    if args.json:
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
