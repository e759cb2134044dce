"""One cell of every family and task of `studies/gpu/*.yaml`, 30 steps in bf16 on the GPU: do the GPU study
files train there? (A smoke run, not a timing: the step times include the first steps' warm-up.)

    PYTHONPATH=. python benchmarks/gpu_studies.py        # DEV=cpu to try it without a GPU (slow)

Needs torch, numpy and pydantic only. A converted cell's teacher lives in a ledger this run has not got, so it
trains without one. With $OUT set, writes $OUT/gpu_studies.json.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

from studyrunner.study import compile_study, loads
from studyrunner.train import run_trial

STEPS = 30


def smoke(path: Path, device: str) -> dict[str, object]:
    out: dict[str, object] = {}
    seen = set()
    for cell in compile_study(loads(path.read_text())).cells:
        kind = (cell.config["model"]["family"], cell.config["task"]["name"])
        if kind in seen:
            continue
        seen.add(kind)
        cfg = copy.deepcopy(cell.config)
        if cfg["model"]["params"].get("teacher"):
            cfg["model"]["params"]["teacher"] = None
            for key in ("distill_lambda", "align_beta", "lr_groups"):
                cfg["train"].pop(key, None)
        cfg["train"].update(steps=STEPS, warmup_steps=0, log_every=10, device=device, precision="bf16")
        cfg["eval"].update(every=STEPS, examples=min(256, cfg["eval"]["examples"]))
        cfg["eval"].pop("loops", None)
        cfg["eval"].pop("budgets", None)
        started = time.perf_counter()
        name = f"{path.stem}:{kind[0]}/{kind[1]}"
        try:
            final = run_trial(cfg, 0)
            out[name] = {
                "loss": round(final["train_loss"], 3),
                "step_ms": round(final.get("step_time_ms", float("nan")), 2),
                "wall_s": round(time.perf_counter() - started, 1),
            }
        except Exception as exc:  # noqa: BLE001 - a report, not a test
            out[name] = f"ERR {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        print(name, out[name], flush=True)
    return out


def main() -> None:
    device = os.environ.get("DEV", "cuda")
    out: dict[str, object] = {}
    for path in sorted(Path("studies/gpu").glob("*.yaml")):
        out.update(smoke(path, device))
    Path(os.environ.get("OUT", "."), "gpu_studies.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
