"""Shared pieces of the benchmark suite: repeats and their summary, machine facts, the result file.

A *figure* is one measured quantity: {"unit", "median", "min", "max", "repeats", "values"} plus,
where the measurement has one, "target" (e.g. ">= 0.90") and "meets_target"; a figure that could not be
measured here is {"skipped": "why"} instead. Imports the standard library and torch only, so the
trainer-level benchmarks run on bare GPU machines (no Ray, MLflow or SQL there).
"""

from __future__ import annotations

import datetime
import json
import operator
import os
import platform
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def figure(
    values: Sequence[float],
    unit: str,
    *,
    target: str | None = None,
    note: str = "",
    digits: int = 4,
) -> dict[str, Any]:
    """The summary of repeated measurements of one quantity; `target` like ">= 0.90" or "< 5"."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("a figure needs at least one value")
    out: dict[str, Any] = {
        "unit": unit,
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "repeats": len(values),
        "values": [round(v, digits) for v in values],
    }
    if target:
        op, bound = target.split()
        out["target"] = target
        out["meets_target"] = bool(_OPS[op](statistics.median(values), float(bound)))
    if note:
        out["note"] = note
    return out


def skipped(why: str, *, target: str | None = None, note: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"skipped": why}
    if target:
        out["target"] = target
    if note:
        out["note"] = note
    return out


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """(seconds, result) of one call of fn(*args, **kwargs)."""
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - started, result


def repeat(fn: Callable[[], float], n: int) -> list[float]:
    """`fn()` n times; its return values (each call measures and returns one number)."""
    return [float(fn()) for _ in range(max(1, n))]


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if out.returncode != 0:
        return "unknown"
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_facts() -> dict[str, Any]:
    """Where the figures were measured: cores, torch threads, device, versions, git sha, load."""
    import torch

    facts: dict[str, Any] = {
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_sha": git_sha(),
        "load_average": load_average(),
    }
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def result_path(folder: Path = RESULTS, when: datetime.date | None = None) -> Path:
    when = when or datetime.date.today()
    host = "".join(c if c.isalnum() or c in "-_." else "-" for c in socket.gethostname()) or "host"
    return folder / f"{when.isoformat()}-{host}.json"


def write_results(result: dict[str, Any], path: Path | None = None) -> Path:
    path = path or result_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path
