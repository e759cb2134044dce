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
from .errors import spec_error

MAX_EVAL_TOKENS = 50_000_000  # eval sets live in memory: inputs, targets and mask, 17 bytes a token
MAX_MODELS_PROBED = 32  # distinct model configs built (on the meta device) to learn their diagnostics


def _key(config: dict) -> str:
    return canonical_json(config)


def check_feasible(compiled: CompiledStudy) -> None:
    study = compiled.study
    source, node = study.source, study._node
    reported: set[str] = set(TRAINER_METRICS)
    tasks: dict[str, object] = {}
    for cell in compiled.cells:
        task_cfg, examples = cell.config["task"], cell.config["eval"]["examples"]
        key = _key(task_cfg)
        if key not in tasks:
            tasks[key] = build_task(task_cfg["name"], task_cfg["params"], seed=0)
        task = tasks[key]
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
        family_params = get_family(cell.config["model"]["family"]).params_model.model_validate(
            cell.config["model"]["params"]
        )
        if problem := family_params.facts_problem(task.facts):
            raise spec_error(source, node, ("model", "family"), f"cell '{cell.label}': {problem}")
        task_metrics = task.reported_metrics()
        reported |= task_metrics
        # other depths (eval.loops, eval.budgets): eval_accuracy_loops_8, eval_loss_budget_4, ...
        headline = ["eval_loss", *(f"eval_{kind}" for kind in task.metric_kinds)]
        grid = cell.config["model"]["params"].get("loops")
        reported |= depth_metric_names(cell.config["eval"], task_metrics, headline, grid)
        if family_params.supports_decoding():  # a task that decodes, on a family with a KV cache
            reported |= task.decode_metric_names()
        if cell.config["model"]["params"].get("teacher") is not None:  # a conversion scores its teacher too
            reported |= teacher_metric_names(task)

    probed: set[str] = set()

    def reports(metric: str) -> bool:
        """Whether a trial reports `metric`; the families' diagnostics are probed only when needed."""
        if metric in reported:
            return True
        for cell in compiled.cells:  # diagnostics depend on the family's params: probe a few configs
            key = _key(cell.config["model"])
            if key in probed or len(probed) >= MAX_MODELS_PROBED:
                continue
            probed.add(key)
            task = tasks[_key(cell.config["task"])]
            import torch

            with torch.device("meta"):
                model = build_model(cell.config["model"]["family"], cell.config["model"]["params"], task.facts)
            reported.update(getattr(model, "diagnostic_names", ()))
            if metric in reported:
                return True
        return False

    def every_name() -> set[str]:
        reports("")  # probe every config (up to the cap)
        return reported

    metric = study.metric.name
    if not reports(metric):
        near = sorted(n for n in reported if n.split("_")[0] == metric.split("_")[0]) or sorted(reported)
        raise spec_error(
            source, node, ("metric", "name"), f"no trial of this study reports {metric!r}; reported: {', '.join(near)}"
        )
    check_claims(compiled, reports, every_name)
