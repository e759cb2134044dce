"""Cross-section knob checks: a `train.*` or `eval.*` knob that only means something for some model
configs is rejected, naming the field, on a config that lacks what it acts on.

`train.ponder_lambda` on a `looped` cell would otherwise be a silent no-op: the family has no
halting, so nothing would be weighted. Each family's params declare which auxiliary terms a config
produces (`aux_terms()`) and which diagnostics it reports (`diagnostic_names()`); the knobs that
weight a term are listed once, in `models.output.AUX_TERMS`.
"""

from __future__ import annotations

from typing import Any

from ..models.output import AUX_TERMS
from ..models.registry import FamilyEntry
from ..train.packing import KNOB as PACK_KNOB
from ..train.packing import check_packable, pack_mode


def knob_problem(family: FamilyEntry, resolved: dict[str, Any]) -> tuple[tuple, str] | None:
    """(field location, message) for the first knob `resolved` sets that its model config lacks."""
    params = family.params_model.model_validate(resolved["model"]["params"])
    produced = params.aux_terms() if hasattr(params, "aux_terms") else set()
    for term, knobs in AUX_TERMS.items():
        for knob in knobs:
            if resolved["train"].get(knob) is not None and term not in produced:
                source = getattr(params, "aux_term_sources", {}).get(term)
                how = f"; it does with {source}" if source else ""
                return (
                    ("train", knob),
                    f"weights the {term!r} term, which model family {family.name!r} does not produce "
                    f"with these params{how}",
                )
    if problem := _lr_groups_problem(family, params, resolved["train"]):
        return problem
    if resolved["train"].get("engine") == "deepspeed" and (problem := _deepspeed_problem(family, params, resolved)):
        return problem
    if resolved["train"].get("deepspeed") is not None and resolved["train"].get("engine") != "deepspeed":
        return ("train", "deepspeed"), "is set but train.engine is not deepspeed; set train.engine: deepspeed"
    if pack_mode(resolved):
        knob = "pack" if resolved["train"].get("pack") else "vectorize_seeds"
        try:
            check_packable(resolved)
        except ValueError as exc:
            return ("train", knob), str(exc).removeprefix(PACK_KNOB).lstrip(": ")
    steps = getattr(params, "interpolate_steps", 0)
    if steps and steps >= resolved["train"]["steps"]:
        return (
            ("model", "params", "interpolate_steps"),
            f"{steps} must be smaller than train.steps ({resolved['train']['steps']}): the model must be fully "
            "converted (alpha = 1) by its last step",
        )
    ev = resolved["eval"]
    for knob in ("loops", "budgets"):
        if ev.get(knob) is not None and "loops" not in family.params_model.model_fields:
            return ("eval", knob), f"model family {family.name!r} has no loops to vary at evaluation"
    if problem := _trajectory_problem(family, params, resolved):
        return problem
    if ev.get("halt_collapse_fraction") is not None:
        names = params.diagnostic_names() if hasattr(params, "diagnostic_names") else set()
        if "ponder_steps_fraction" not in names:
            return (
                ("eval", "halt_collapse_fraction"),
                f"model family {family.name!r} does not halt with these params, so nothing can collapse",
            )
    return None


def _lr_groups_problem(family: FamilyEntry, params: Any, train: dict[str, Any]) -> tuple[tuple, str] | None:
    """train.lr_groups naming a group the config does not have, or on an engine that keeps one rate."""
    groups = train.get("lr_groups")
    if not groups:
        return None
    known = [*type(params).lr_group_names, "rest"]
    unknown = [g for g in groups if g not in known]
    if unknown:
        return ("train", "lr_groups"), (
            f"names group {unknown[0]!r}, which model family {family.name!r} does not have; its groups: "
            f"{', '.join(known)} (rest = every other parameter)"
        )
    for knob in ("vectorize_seeds", "pack", "engine"):
        if train.get(knob) and not (knob == "engine" and train[knob] == "plain"):
            return (
                "train",
                "lr_groups",
            ), f"cannot be combined with train.{knob}: {train[knob]} (one rate per model there)"
    return None


def _trajectory_problem(family: FamilyEntry, params: Any, resolved: dict[str, Any]) -> tuple[tuple, str] | None:
    """train.trajectory / eval.trajectory on a config that takes no step sizes, or that does not fit
    them (too long, no budget to apply to, ...): the family's `trajectory_problem` says which."""
    train, ev = resolved["train"].get("trajectory"), resolved["eval"].get("trajectory")
    if train is None and ev is None:
        return None
    check = getattr(params, "trajectory_problem", None)
    if check is None:
        loc = ("train", "trajectory") if train is not None else ("eval", "trajectory")
        return loc, f"model family {family.name!r} takes no trajectories (family loopformer does)"
    depths = [*(resolved["eval"].get("budgets") or []), *(resolved["eval"].get("loops") or [])]
    return check(train, ev, depths)


def _deepspeed_problem(family: FamilyEntry, params: Any, resolved: dict[str, Any]) -> tuple[tuple, str] | None:
    """What `train.engine: deepspeed` cannot train: auxiliary losses (a halting model's depth depends on its
    data, so ZeRO-3's per-layer gathers would differ between workers; the looping regulariser reads
    weights outside their layer's forward, where ZeRO-3 has them partitioned), gradient-norm diagnostics
    (ZeRO 2 and 3 partition the gradients), and the plain loop's own speed-ups."""
    where = ("train", "engine")
    train = resolved["train"]
    terms = sorted(params.aux_terms()) if hasattr(params, "aux_terms") else []
    if terms:
        what = "halting (its depth depends on the data)" if "ponder" in terms else "an auxiliary loss"
        return where, (
            f"deepspeed does not train models with auxiliary losses; model family {family.name!r} with these "
            f"params adds {', '.join(map(repr, terms))}: {what}"
        )
    groups = sorted(params.grad_norm_groups()) if hasattr(params, "grad_norm_groups") else []
    if groups:
        return where, (
            f"deepspeed partitions gradients, so it cannot record the gradient norms model family "
            f"{family.name!r} watches ({', '.join(groups)})"
        )
    if pack_mode(resolved):
        knob = "pack" if train.get("pack") else "vectorize_seeds"
        return ("train", knob), "cannot be combined with train.engine: deepspeed (one trial, many workers)"
    if (train.get("compile") or "none") != "none":
        return ("train", "compile"), f"{train['compile']!r} cannot be combined with train.engine: deepspeed; unset it"
    if train.get("precision") == "bf16":
        return ("train", "precision"), (
            "bf16 is not supported with train.engine: deepspeed (its autocast would not match DeepSpeed's own "
            "bf16 mode); use fp32 or tf32"
        )
    return None


def resources_problem(resources: Any, trains: list[dict[str, Any]]) -> tuple[tuple, str] | None:
    """Study-wide: `resources.workers` and the cells' engines must agree, and every DeepSpeed cell's global
    batch must split evenly over the workers' micro-batches."""
    deepspeed = [t for t in trains if t.get("engine") == "deepspeed"]
    workers = resources.workers
    if deepspeed and workers is None:
        return ("resources",), (
            "train.engine: deepspeed trains each trial on resources.workers data-parallel workers; "
            "set resources.workers (1 or more)"
        )
    if workers is not None and not deepspeed:
        return ("resources", "workers"), (
            "only train.engine: deepspeed trials run on several workers, and no cell of this study sets it"
        )
    if deepspeed and resources.gpu not in (0, 1):
        return ("resources", "gpu"), (
            f"a DeepSpeed worker trains on one whole GPU or none: 0 or 1 (per worker), got {resources.gpu:g}"
        )
    for train in deepspeed:
        accumulation = train["deepspeed"]["gradient_accumulation_steps"]
        if train["batch_size"] % (workers * accumulation):
            return ("train", "batch_size"), (
                f"{train['batch_size']} does not split over resources.workers ({workers}) x "
                f"train.deepspeed.gradient_accumulation_steps ({accumulation}) equal micro-batches"
            )
    return None
