"""The benchmark suite: each measurement beside its target (docs/performance.md).

    python -m benchmarks all [--quick] [--only NAME,...] [--out PATH]
    python -m benchmarks sequential [--sims N]      the sequential-seeds simulation table (benchmarks/sequential.py)

Measurements (NAME): control_plane, trainer_cpu, seeds_together, large_cell, platform, waves (in that order;
`platform` and `waves` start a local Ray, so they run last). `--quick` (under 5 minutes on 2 idle CPU cores) runs
smaller and fewer repeats; `--tiny` runs the smallest sizes, for the tests (its figures mean nothing).

Prints a table and writes benchmarks/results/<YYYY-MM-DD>-<host>.json (or --out): every figure's
median and min-max over its repeats, each measurement's details, and the machine's facts (cores, torch
threads, device, versions, git sha, load average before and after). The trainer-level measurements
(trainer_cpu, large_cell) need no Ray or MLflow; control_plane and platform import the whole package.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import figure, load_average, machine_facts, result_path, write_results

ORDER = ("control_plane", "trainer_cpu", "seeds_together", "large_cell", "platform", "waves")
MODULES = {  # measurement name -> module under benchmarks/
    "control_plane": "control_plane",
    "trainer_cpu": "trainer_cpu",
    "seeds_together": "seeds_together",
    "large_cell": "large_cell",
    "platform": "utilisation",  # not platform.py: see utilisation.py
    "waves": "waves",
}


def _normalise(out: Any) -> dict[str, Any]:
    """Another module's `measure` result as {"figures": {name: figure}, "details": {...}}: figures that
    carry median/min/max (or `skipped`) are kept, bare numbers become one-value figures."""
    if not isinstance(out, dict):
        return {"figures": {}, "details": {"result": out}}
    source = out["figures"] if isinstance(out.get("figures"), dict) else out
    figures: dict[str, Any] = {}
    for name, value in source.items():
        if isinstance(value, dict) and ({"median", "min", "max"} <= value.keys() or "skipped" in value):
            figures[name] = value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            figures[name] = figure([value], "")
    details = out.get("details", {}) if source is not out else {}
    leftover = {k: v for k, v in out.items() if k not in ("figures", "details") and k not in figures}
    return {"figures": figures, "details": {**details, **leftover}}


def run_one(name: str, quick: bool, tiny: bool) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        module = importlib.import_module(f"benchmarks.{MODULES[name]}")
    except ModuleNotFoundError as exc:
        if exc.name != f"benchmarks.{MODULES[name]}":
            raise
        return {"figures": {name: {"skipped": "not available"}}, "details": {}, "seconds": 0.0}
    measure: Callable[..., Any] = module.measure
    try:
        if name == "seeds_together":  # its own interface: measure(quick: bool[, tiny]) -> dict
            tiny_kw = {"tiny": True} if tiny and "tiny" in inspect.signature(measure).parameters else {}
            out = _normalise(measure(quick or tiny, **tiny_kw))
        else:
            out = measure(quick=quick, tiny=tiny)
    except Exception as exc:  # noqa: BLE001 - one broken measurement must not lose the others
        traceback.print_exc()
        out = {
            "figures": {name: {"skipped": f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}},
            "details": {},
        }
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def run(
    names: list[str], quick: bool, tiny: bool, out: Path | None, console=None, command: str = ""
) -> tuple[dict[str, Any], Path]:
    mode = "tiny" if tiny else "quick" if quick else "full"
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": command,
        "mode": mode,
        "machine": machine_facts(),
        "measurements": {},
    }
    path = out or result_path()
    for name in names:
        if console is not None:
            console.print(f"[bold]{name}[/] ({mode}) ...")
        result["measurements"][name] = run_one(name, quick, tiny)
        result["machine"]["load_average_after"] = load_average()
        write_results(result, path)  # after each: a crash later keeps what was measured
    result["seconds"] = round(sum(m["seconds"] for m in result["measurements"].values()), 1)
    write_results(result, path)
    return result, path


def _number(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"
    return f"{x:.3g}"


def table(result: dict[str, Any]):
    from rich.table import Table
    from rich.text import Text

    m = result["machine"]
    title = (
        f"{result['date']} {m['host']} ({result['mode']}): {m['cpu_count']} cores, torch {m['torch']} "
        f"({m['torch_threads']} threads), {m['device']}, git {m['git_sha'][:12]}, load {m.get('load_average')}"
    )
    t = Table(title=title, title_justify="left")
    for col, justify in (("measurement", "left"), ("figure", "left"), ("median", "right"), ("min-max", "right")):
        t.add_column(col, justify=justify)
    for col in ("unit", "n", "target", ""):
        t.add_column(col)
    for name, measured in result["measurements"].items():
        for i, (fig_name, f) in enumerate(measured["figures"].items()):
            label = name if i == 0 else ""
            if "skipped" in f:
                t.add_row(
                    label,
                    fig_name,
                    Text(f"skipped: {f['skipped']}", style="yellow"),
                    "",
                    "",
                    "",
                    f.get("target", ""),
                    "",
                )
                continue
            ok = f.get("meets_target")
            mark = Text("ok", style="green") if ok else Text("MISSED", style="bold red") if ok is False else Text("")
            t.add_row(
                label,
                fig_name,
                _number(f["median"]),
                f"{_number(f['min'])}-{_number(f['max'])}",
                f.get("unit", ""),
                str(f.get("repeats", "")),
                f.get("target", ""),
                mark,
            )
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("all",), help="run the suite (--only picks measurements)")
    ap.add_argument("--quick", action="store_true", help="smaller and fewer repeats (under 5 min on 2 cores)")
    ap.add_argument("--tiny", action="store_true", help="smallest sizes, for tests (figures mean nothing)")
    ap.add_argument("--only", default="", help=f"comma-separated measurements of: {', '.join(ORDER)}")
    ap.add_argument("--out", type=Path, default=None, help="result file (default benchmarks/results/DATE-HOST.json)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sequential"]:  # a table of its own, not a measurement of the suite
        from .sequential import main as sequential_main

        return sequential_main(argv[1:])
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(ORDER)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        ap.error(f"unknown measurement(s) {', '.join(unknown)}; known: {', '.join(ORDER)}")
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 150)
    result, path = run(names, args.quick, args.tiny, args.out, console, "python -m benchmarks " + " ".join(argv))
    console.print(table(result))
    console.print(f"{result['seconds']} s; written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
