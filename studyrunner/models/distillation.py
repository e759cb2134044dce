"""Divergences between a teacher's and a student's next-token distributions (knowledge distillation).

MELT (seed 001, Table 4) distils "GKD-allLoops" with TRL, without naming the divergence; GKD (Agarwal et al.
2024, "On-Policy Distillation of Language Models") trains on the generalised Jensen-Shannon divergence

    JSD_beta(P || Q) = beta KL(P || M) + (1 - beta) KL(Q || M),   M = beta P + (1 - beta) Q,

P the teacher, Q the student: beta -> 0 behaves as forward KL(P || Q) (scaled by beta), beta -> 1 as reverse
KL(Q || P); TRL's default beta is 0.5. The mixture is taken in probability space (a log-sum-exp of the
log-probabilities), as GKD defines it and TRL computes it.

Each divergence is summed over the vocabulary and averaged over the tokens given. Both distributions are
softmax(logits / temperature); the result is not multiplied by temperature^2 (Hinton et al.'s rescaling),
as TRL's GKD loss is not.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) per row, from log-probabilities."""
    return F.kl_div(q_log, p_log, reduction="none", log_target=True).sum(-1)


def divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    kind: str = "jsd",
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Mean over tokens of the divergence `kind` between the teacher's and the student's distributions
    (logits (..., V), the same shape); gradients flow into the student's logits only if the teacher's are
    detached (the callers compute them under no_grad)."""
    vocab = student_logits.shape[-1]
    q = F.log_softmax(student_logits.reshape(-1, vocab).float() / temperature, dim=-1)
    p = F.log_softmax(teacher_logits.reshape(-1, vocab).float() / temperature, dim=-1)
    if kind == "forward_kl":
        per_token = _kl(p, q)
    elif kind == "reverse_kl":
        per_token = _kl(q, p)
    elif kind == "jsd":
        if not 0 < beta < 1:
            raise ValueError(f"the generalised JSD needs 0 < beta < 1, got {beta} (use forward_kl or reverse_kl)")
        m = torch.logsumexp(torch.stack([p + math.log(beta), q + math.log1p(-beta)]), dim=0)
        per_token = beta * _kl(p, m) + (1 - beta) * _kl(q, m)
    else:
        raise ValueError(f"unknown divergence {kind!r}; use one of {', '.join(DIVERGENCES)}")
    # A divergence is >= 0; where the distributions agree (a converted student at its first step) rounding
    # leaves -1e-10 or so, which would read as a negative loss term.
    return per_token.clamp_min(0).mean()
