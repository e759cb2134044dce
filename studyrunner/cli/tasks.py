"""`tasks`: every registered task with its options, the levels of its metrics and its measured train/eval overlap."""

from __future__ import annotations

import json
import math
import sys
import types
import typing
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ..errors import StudyrunnerError
from .common import app, out, user_errors

EXAMPLES = 512


class TasksFormat(StrEnum):
    table = "table"
    json = "json"


@app.command()
@user_errors
def tasks(
    name: Annotated[
        str | None, typer.Argument(help="One task to show [default: every registered task].", show_default=False)
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            help="NAME=VALUE: a task parameter (YAML value: hops=8, eval_operands=[2,4]) at which to compute the "
            "levels and the overlap instead of the defaults; repeat for several; needs NAME.",
        ),
    ] = None,
    examples: Annotated[
        int, typer.Option("--examples", min=1, max=65536, help="Eval examples per split the levels and overlap use.")
    ] = EXAMPLES,
    format: Annotated[TasksFormat, typer.Option("--format", "-f", help="table or json.")] = TasksFormat.table,
):
    """The registered tasks: their options (parameters with type, default and description), the levels of their
    metrics at the default parameters (range, which end is better, chance, heuristic floor and its strategy) and
    their measured train/eval overlap (the share of eval examples whose exact token sequence occurs in training)."""
    from ..tasks import TASKS

    if name is not None and name not in TASKS:
        raise StudyrunnerError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    if param and name is None:
        raise StudyrunnerError("--param needs a task NAME (the parameters of which task?)")
    names = [name] if name is not None else list(TASKS)
    params = _parse_params(param or []) if name is not None else {}
    described = [describe_task(n, params if n == name else {}, examples) for n in names]
    if format is TasksFormat.json:
        sys.stdout.write(json.dumps(_finite(described), indent=2, allow_nan=False, ensure_ascii=False) + "\n")
        return
    for entry in described:
        _print_task(entry)


# ------------------------------------------------------------------------------------------- the data


def describe_task(name: str, params: dict[str, Any] | None = None, examples: int = EXAMPLES) -> dict[str, Any]:
    """One task as `studyrunner tasks --format json` prints it: its options, the levels of its metrics and its
    measured overlap at `params` (the defaults where not given), on eval sets of `examples` examples."""
    from pydantic import ValidationError

    from ..tasks import build_task, get_task
    from ..tasks.overlap import headline, measure_overlap

    entry = get_task(name)
    try:
        validated = entry.params_model.model_validate(params or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise StudyrunnerError(f"task {name}: {where + ': ' if where else ''}{message}") from None
    try:
        task = build_task(name, validated, seed=0)
    except ValueError as exc:  # a setting the params model passes but the task cannot build (no text fits)
        raise StudyrunnerError(f"task {name}: {exc}") from None
    levels = task.metric_levels(examples)
    measured = measure_overlap(task, examples)
    overlap = {}
    for split, found in measured.items():
        top = headline(found)
        overlap[split] = {
            "share": top.share,
            "seen": top.seen,
            "examples": top.examples,
            "exact": top.exact,
            "method": top.method,
            **({"sampled": found["sampled"].to_dict()} if "exact" in found else {}),
        }
    return {
        "name": name,
        "description": _summary(entry.factory),
        "params": validated.model_dump(mode="json"),
        "options": [_option(field, info) for field, info in entry.params_model.model_fields.items()],
        "facts": {"vocab_size": task.facts.vocab_size, "seq_len": task.facts.seq_len, "causal": task.facts.causal},
        "examples": examples,
        "metrics": {metric: lv.to_dict() for metric, lv in sorted(levels.items())},
        "overlap": overlap,
    }


def _summary(factory) -> str:
    """The first paragraph of the task module's docstring, without its `Task `name`:` prefix."""
    doc = (sys.modules[factory.__module__].__doc__ or "").strip().split("\n\n", 1)[0]
    text = " ".join(doc.split())
    return text.split(": ", 1)[1] if text.startswith("Task `") and ": " in text else text


def _option(field: str, info) -> dict[str, Any]:
    default = None if info.is_required() else info.get_default(call_default_factory=True)
    if isinstance(default, tuple):
        default = list(default)
    bounds = {}
    for meta in info.metadata:
        for key in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            if getattr(meta, key, None) is not None:
                bounds[key] = getattr(meta, key)
    return {
        "name": field,
        "type": _type_name(info.annotation),
        "default": default,
        "required": info.is_required(),
        "bounds": bounds,
        "description": info.description or "",
    }


def _type_name(annotation) -> str:
    """A short readable name of a field's type: int, bool, list[int], int | None, 'a' | 'b'."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _parse_params(pairs: list[str]) -> dict[str, Any]:
    import yaml

    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise StudyrunnerError(f"--param {pair!r}: expected NAME=VALUE, e.g. --param hops=8")
        try:
            params[key.strip()] = yaml.safe_load(value) if value.strip() else value
        except yaml.YAMLError:
            raise StudyrunnerError(f"--param {pair!r}: the value is not a YAML scalar or list") from None
    return params


def _finite(obj):
    """JSON has no infinity: an unbounded end of a range prints as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


# ------------------------------------------------------------------------------------------- the tables


def _num(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)


def _pct(share) -> str:
    return "n/a" if share is None or not math.isfinite(share) else f"{share:.1%}"


def _print_task(entry: dict[str, Any]) -> None:
    facts = entry["facts"]
    set_params = ", ".join(f"{k}={json.dumps(v)}" for k, v in entry["params"].items())
    out.print(Text.assemble((entry["name"], "bold"), ": ", entry["description"]), highlight=False, soft_wrap=True)
    out.print(
        f"  at {set_params or 'no parameters'}: vocabulary {facts['vocab_size']}, sequence length {facts['seq_len']}, "
        f"{'causal' if facts['causal'] else 'bidirectional'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    options = Table(title=Text(f"{entry['name']}: options"), title_justify="left")
    for col in ("option", "type", "default", "bounds", "description"):
        options.add_column(col, overflow="fold")
    for opt in entry["options"]:
        bounds = ", ".join(f"{k} {v}" for k, v in opt["bounds"].items())
        default = "(required)" if opt["required"] else json.dumps(opt["default"])
        options.add_row(*(Text(str(x)) for x in (opt["name"], opt["type"], default, bounds, opt["description"])))
    out.print(options)
    metrics = Table(
        title=Text(f"{entry['name']}: metric levels on {entry['examples']} eval examples per split"),
        title_justify="left",
    )
    for col in ("metric", "range", "better", "chance", "floor", "floor strategy"):
        metrics.add_column(col, overflow="fold", justify="right" if col in ("chance", "floor") else "left")
    for metric, lv in entry["metrics"].items():
        low, high = lv["range"]
        metrics.add_row(
            Text(metric),
            Text(f"[{_num(low)}, {_num(high)}]" if math.isfinite(high) else f"[{_num(low)}, inf)"),
            Text(lv["better"]),
            Text(_num(lv["chance"])),
            Text(_num(lv["floor"])),
            Text(lv["floor_strategy"] or ""),
        )
    out.print(metrics)
    for split, ov in entry["overlap"].items():
        label = f"split {split}" if split else "eval set"
        seen = f"{ov['seen']}/{ov['examples']}" if ov["seen"] is not None else f"of {ov['examples']}"
        line = f"  overlap ({label}): {_pct(ov['share'])} of eval examples occur in training ({seen}); {ov['method']}"
        if "sampled" in ov:
            s = ov["sampled"]
            line += f"; sampled: {_pct(s['share'])} ({s['seen']}/{s['examples']})"
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print()
