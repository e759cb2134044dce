"""The one shape every model family returns, so the trainer never needs to know the family."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, vocab)
    # Ponder cost, consistency loss, regulariser...; a zero scalar when the family has none.
    # The trainer adds it to the task loss unweighted: families apply their own coefficients.
    aux_loss: torch.Tensor
    # Flat scalar diagnostics (halting probabilities, gate values, ...), logged as metrics by name.
    diagnostics: dict[str, float] = field(default_factory=dict)
