"""Checks that a compiled study can run and will report what it asks for, before anything runs.

Impossible settings are errors (exit 2): eval sets that cannot fit in memory, a `metric.name` that no
trial reports. Suspicious ones are warnings that `validate` and `submit` print and go on: more eval
examples than the task has distinct problems, an `exclude` entry that matches nothing.
"""

from __future__ import annotations

from ..models import build_model, get_family
from ..tasks import build_task
from ..train.evaluation import depth_metric_names, teacher_metric_names
from ..train.metrics import TRAINER_METRICS
from .canonical import canonical_json
from .claims_check import check_claims
from .compiled import CompiledStudy
from .spec_errors import spec_error

MAX_EVAL_TOKENS = 50_000_000  # eval sets live in memory: inputs, targets and mask, 17 bytes a token
MAX_MODELS_PROBED = 32  # distinct model configs built (on the meta device) to learn their diagnostics


def _key(config: dict) -> str:
    return canonical_json(config)


def check_feasible(compiled: CompiledStudy) -> None:
    """Refuse a cell that cannot run, warn of one that repeats its eval problems, and check that some trial
    reports the study's metric and every metric its claims name."""
    tasks: dict[str, object] = {}
    reported = _Reported(compiled, tasks)
    for cell in compiled.cells:
        key = _key(cell.config["task"])
        if key not in tasks:
            tasks[key] = build_task(cell.config["task"]["name"], cell.config["task"]["params"], seed=0)
        reported.names |= _check_cell(compiled, cell, tasks[key])
    study = compiled.study
    metric = study.metric.name
    if not reported(metric):
        near = sorted(n for n in reported.names if n.split("_")[0] == metric.split("_")[0]) or sorted(reported.names)
        raise spec_error(
            study.source,
            study._node,
            ("metric", "name"),
            f"no trial of this study reports {metric!r}; reported: {', '.join(near)}",
        )
    check_claims(compiled, reported, reported.every_name)


def _check_cell(compiled: CompiledStudy, cell, task) -> set[str]:
    """One cell's eval set and family against its task; the metrics its trials report (without the family's
    diagnostics, which `_Reported` probes only when needed)."""
    source, node = compiled.study.source, compiled.study._node
    examples = cell.config["eval"]["examples"]
    splits = task.split_names()
    tokens = examples * task.facts.seq_len * len(splits)
    if tokens > MAX_EVAL_TOKENS:
        raise spec_error(
            source,
            node,
            ("eval", "examples"),
            f"cell '{cell.label}': {examples:,} examples x {len(splits)} splits x {task.facts.seq_len} tokens "
            f"= {tokens:,} eval tokens; at most {MAX_EVAL_TOKENS:,} fit in memory",
        )
    capacity = task.eval_capacity()
    if capacity is not None and examples > capacity:
        warning = str(
            spec_error(
                source,
                node,
                ("eval", "examples"),
                f"cell '{cell.label}': {examples:,} examples but the task has only {capacity:,} distinct eval "
                "problems per split, so the eval set repeats them",
            )
        )
        if warning not in compiled.warnings:
            compiled.warnings.append(warning)
    params = cell.config["model"]["params"]
    family_params = get_family(cell.config["model"]["family"]).params_model.model_validate(params)
    if problem := family_params.facts_problem(task.facts):
        raise spec_error(source, node, ("model", "family"), f"cell '{cell.label}': {problem}")
    task_metrics = task.reported_metrics()
    reported = set(task_metrics)
    # other depths (eval.loops, eval.budgets): eval_accuracy_loops_8, eval_loss_budget_4, ...
    headline = ["eval_loss", *(f"eval_{kind}" for kind in task.metric_kinds)]
    reported |= depth_metric_names(cell.config["eval"], task_metrics, headline, params.get("loops"))
    if family_params.supports_decoding():  # a task that decodes, on a family with a KV cache
        reported |= task.decode_metric_names()
    if params.get("teacher") is not None:  # a conversion scores its teacher too
        reported |= teacher_metric_names(task)
    return reported


class _Reported:
    """Whether some trial of the study reports a metric. The families' diagnostics depend on their params, so
    they are learned by building a few model configs on the meta device, only when a name is not known yet."""

    def __init__(self, compiled: CompiledStudy, tasks: dict[str, object]):
        self.compiled, self.tasks = compiled, tasks
        self.names: set[str] = set(TRAINER_METRICS)
        self.probed: set[str] = set()

    def __call__(self, metric: str) -> bool:
        if metric in self.names:
            return True
        for cell in self.compiled.cells:
            key = _key(cell.config["model"])
            if key in self.probed or len(self.probed) >= MAX_MODELS_PROBED:
                continue
            self.probed.add(key)
            task = self.tasks[_key(cell.config["task"])]
            import torch

            with torch.device("meta"):
                model = build_model(cell.config["model"]["family"], cell.config["model"]["params"], task.facts)
            self.names.update(getattr(model, "diagnostic_names", ()))
            if metric in self.names:
                return True
        return False

    def every_name(self) -> set[str]:
        self("")  # probe every config (up to the cap)
        return self.names
