"""Weights of the models' auxiliary terms over training, from the study file's `train` section.

A family returns raw terms by name (`ModelOutput.aux`); the trainer multiplies each by its weight
here and adds it to the task loss. Unset knobs weigh 0, so a term a family always computes (the
regulariser's distance, the ponder cost) is still logged as `train_{term}` at no effect on training;
except LoopFormer's two terms, which a config produces only when its objective asks for them, and
whose unset weight is the paper's 0.1.
"""

from __future__ import annotations

from .config import TrainConfig


def linear_warmup(step: int, warmup_steps: int) -> float:
    """Factor rising linearly from 0 at 0-based `step` 0 to 1 at `warmup_steps`; 1 throughout if 0.

    The seed-003 code's lambda_eff = lambda * min(1, step / warmup)."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, step / warmup_steps)


def ponder_weight(step: int, train: TrainConfig) -> float:
    lam = train.ponder_lambda or 0.0
    return lam * linear_warmup(step, train.ponder_lambda_warmup_steps or 0)


# LoopFormer's λ1 = λ2 = 0.1 "in all experiments" (seed 004): what an unset shortcut/consistency weight means.
LOOPFORMER_LAMBDA = 0.1


def _or_default(value: float | None, default: float) -> float:
    return float(default if value is None else value)


def align_weight(step: int, train: TrainConfig) -> float:
    """MELT's attention alignment: align_beta from align_start_step on (the paper's phase 2), else 0."""
    if step < (train.align_start_step or 0):
        return 0.0
    return float(train.align_beta or 0.0)


def counts_task_loss(train: TrainConfig, weights: dict[str, float]) -> bool:
    """Whether the task loss is part of this step's objective: always, except where the distillation has
    weight and `train.task_loss` is unless_distilled (unset): MELT's phase objectives (seed 001, section
    3.3, Table 6) are L_KD and L_KD + beta * alignment, with no cross-entropy."""
    return (train.task_loss or "unless_distilled") == "always" or not weights.get("distill")


def aux_weights(step: int, train: TrainConfig, terms) -> dict[str, float]:
    """Weight of each of `terms` at 0-based `step`; an unknown term is a family bug, not a silent 0."""
    schedules = {
        "ponder": lambda: ponder_weight(step, train),
        "regulariser": lambda: float(train.regulariser_lambda or 0.0),
        "shortcut": lambda: _or_default(train.shortcut_lambda, LOOPFORMER_LAMBDA),
        "consistency": lambda: _or_default(train.consistency_lambda, LOOPFORMER_LAMBDA),
        "exit_kl_uniform": lambda: float(train.exit_entropy_beta or 0.0),
        "distill": lambda: float(train.distill_lambda or 0.0),
        "attn_align": lambda: align_weight(step, train),
    }
    unknown = sorted(set(terms) - set(schedules))
    if unknown:
        raise KeyError(f"model returned aux terms {unknown} that no train knob weights; known: {sorted(schedules)}")
    return {name: schedules[name]() for name in terms}
