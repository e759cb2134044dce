"""What each metric of a task can read: its range, which end is perfect, what guessing scores (the chance level)
and what the best strategy that does not compute the answer scores (the heuristic floor).

A verdict on a metric that sits at one of these levels says little about looping: two models at the ceiling
tie whatever their depth, and a model at a heuristic floor may only have learnt the shortcut (i-GSM's copy
chains, Sudoku's cells that the givens alone pin down). The analysis reads these levels to flag such claims
(`analysis/claims/validity.py`: the `ceiling` and `floor` threats); they are declared here, by the task, from its
own eval data, never guessed from a metric's name.

- **chance**: the expected score of a uniform guess among the answers a scored position can take (the task's
  `answer_choices`: the alphabet of a p-hop answer, the digits of a Sudoku cell), over the eval examples;
  exact match: the chance of guessing every scored position of an example; losses: the cross-entropy of that
  guess (ln of the choices; bits for `bpc`).
- **floor**: where a strategy that reads the input but does not do the task's computation scores above chance,
  its exact expected score on the eval set, with the strategy named (`Task.heuristic_floors`).

Accuracies and exact matches lie in [0, 1], higher better; losses in [0, inf), lower better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

HIGHER_BETTER = ("accuracy", "exact_match")
LOWER_BETTER = ("loss", "bpc")


@dataclass(frozen=True)
class MetricLevels:
    """The levels of one metric of one task (on its eval set)."""

    low: float
    high: float
    higher_is_better: bool
    chance: float | None = None
    floor: float | None = None  # a non-computing strategy's score, where it beats chance
    floor_strategy: str = ""
    # Read on a log scale (perplexity: chance is the vocabulary's size, 1 is perfect): "near" a level means
    # near in log units, as for the loss it is the exponential of.
    log_scale: bool = False

    @property
    def best(self) -> float:
        """The perfect score: the ceiling of an accuracy, 0 for a loss."""
        return self.high if self.higher_is_better else self.low

    @property
    def uninformative(self) -> float | None:
        """The best score that shows nothing computed: the heuristic floor where there is one, else chance."""
        candidates = [v for v in (self.chance, self.floor) if v is not None]
        if not candidates:
            return None
        return max(candidates) if self.higher_is_better else min(candidates)

    def to_dict(self) -> dict:
        return {
            "range": [self.low, self.high],
            "better": "higher" if self.higher_is_better else "lower",
            "chance": self.chance,
            "floor": self.floor,
            "floor_strategy": self.floor_strategy,
            **({"scale": "log"} if self.log_scale else {}),
        }


def bounded(chance: float | None, floor: float | None = None, strategy: str = "") -> MetricLevels:
    return MetricLevels(0.0, 1.0, True, chance, floor if floor is not None and chance is not None and floor > chance
                        else None, strategy if floor is not None else "")  # fmt: skip


def loss_levels(chance: float | None, floor: float | None = None, strategy: str = "") -> MetricLevels:
    keep = floor is not None and chance is not None and floor < chance
    return MetricLevels(0.0, math.inf, False, chance, floor if keep else None, strategy if keep else "")


def guessing(choices: torch.Tensor, scored: torch.Tensor, loss_scored: torch.Tensor) -> dict[str, float]:
    """Chance levels of a uniform guess among `choices` (B, T) at the `scored` positions (B, T bool) for
    accuracy and exact match, and at the `loss_scored` ones for the loss (nats)."""
    choices = choices.to(torch.float64).clamp_min(1.0)
    per_position = (1.0 / choices)[scored]
    accuracy = float(per_position.mean()) if per_position.numel() else math.nan
    log_hit = torch.where(scored, -torch.log(choices), torch.zeros_like(choices)).sum(dim=1)
    exact = float(torch.exp(log_hit).mean())
    nats = torch.log(choices)[loss_scored]
    return {"accuracy": accuracy, "exact_match": exact, "loss": float(nats.mean()) if nats.numel() else math.nan}
