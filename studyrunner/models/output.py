"""The one shape every model family returns, so the trainer never needs to know the family."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# The auxiliary terms a family may return, each with the `train.*` knobs that weight it. A family
# returns the raw term; the trainer applies the weight and its schedule (train/schedules.py); the
# compiler rejects a knob for a term the cell's family does not produce.
AUX_TERMS: dict[str, tuple[str, ...]] = {
    "ponder": ("ponder_lambda", "ponder_lambda_warmup_steps"),  # halting cost (ACT N+R, PonderNet steps)
    "regulariser": ("regulariser_lambda",),  # looping regulariser: distance between blocks l and l+k
    # LoopFormer objectives (seed 004): the task loss of the short run (its logits in aux_logits), and
    # the distance of its final state to the full run's (detached). Unset weights are the paper's 0.1.
    "shortcut": ("shortcut_lambda",),
    "consistency": ("consistency_lambda",),
    "exit_kl_uniform": ("exit_entropy_beta",),  # LoopLM: KL(exit distribution || uniform) = -H + log T
    "distill": ("distill_lambda",),  # MELT from a LoopLM teacher: KD at every loop
    "attn_align": ("align_beta", "align_start_step"),  # MELT: attention outputs vs the teacher's
}


def aux_metric_names(terms: set[str]) -> set[str]:
    """Names the trainer records for a model's aux terms: the raw term's train-window mean and its weight."""
    return {f"train_{t}" for t in terms} | {f"{t}_weight" for t in terms}


def grad_norm_metric_names(groups: set[str]) -> set[str]:
    """Names the trainer records for a model's gradient-norm groups (e.g. 'router' -> router_grad_norm)."""
    return {f"{g}_grad_norm" for g in groups}


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, vocab)
    # Raw, unweighted auxiliary scalars by name (keys of AUX_TERMS); empty when the family has none.
    # The trainer weights and schedules them from the study file's `train` section.
    aux: dict[str, torch.Tensor] = field(default_factory=dict)
    # Flat scalar diagnostics (halting probabilities, gate values, ...), logged as metrics by name.
    # Filled only when forward is called with diagnose=True (the trainer does so at evaluation).
    diagnostics: dict[str, float] = field(default_factory=dict)
    # Logits of extra predictions whose loss needs the task's targets (LoopFormer's short run): the
    # trainer scores each with the task's own loss and adds it to `aux` under the same name, so it is
    # weighted like any aux term. Filled only in training forwards that make them.
    aux_logits: dict[str, torch.Tensor] = field(default_factory=dict)
    # Several outputs with per-token weights (B, T) summing to 1 over the list (LoopLM's exits): when
    # set, training minimises the expected task loss sum_e task.loss(logits_e, weights=w_e) instead of
    # the loss of `logits`; evaluation scores `logits`.
    exits: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
