"""What every task provides: facts for the model builder, deterministic batches and metrics.

Tasks are pure Python/PyTorch: they import nothing from the platform.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from .levels import HIGHER_BETTER, MetricLevels, bounded, guessing, loss_levels


@dataclass(frozen=True)
class TaskFacts:
    """What a model builder needs to know about a task."""

    vocab_size: int
    seq_len: int  # longest input the model will see, over training and every eval split
    causal: bool  # True: decoder (causal attention); False: bidirectional encoder


@dataclass
class Batch:
    """Token inputs with per-position targets; only positions in `loss_mask` are scored."""

    inputs: torch.Tensor  # (B, T) long
    targets: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) bool

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @classmethod
    def answer_at_end(cls, sequences, answers) -> Batch:
        """Sequences (B, T) whose one scored target is `answers` (B,) at the last position."""
        inputs = torch.as_tensor(sequences)
        targets = torch.zeros_like(inputs)
        targets[:, -1] = torch.as_tensor(answers)
        mask = torch.zeros_like(inputs, dtype=torch.bool)
        mask[:, -1] = True  # loss on the answer only
        return cls(inputs, targets, mask)

    def slice(self, start: int, stop: int) -> Batch:
        return Batch(self.inputs[start:stop], self.targets[start:stop], self.loss_mask[start:stop])


class Task:
    """Base class. Subclasses set `facts` and implement `train_batch` and `eval_sets`.

    Determinism contract:
    - `train_batch(step, batch_size)` depends only on (task params, trial seed, step), so a trial
      resumed at step s sees the same data as one that never stopped.
    - `eval_sets(examples)` depends only on the task params, not on the trial seed, so every seed
      of a cell is scored on the same held-out examples.
    """

    facts: TaskFacts

    def train_batch(self, step: int, batch_size: int) -> Batch:
        raise NotImplementedError

    # Names of what `metrics` returns (besides `loss`); each is reported as eval_<name>[_<split>].
    metric_kinds: tuple[str, ...] = ("accuracy", "exact_match")

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        """Held-out splits, keyed by split suffix ('' for a task with one split, e.g. 'n8')."""
        raise NotImplementedError

    def validation_sets(self, examples: int) -> dict[str, Batch]:
        """Held-out splits apart from `eval_sets` (the test splits: no example in common), with the same keys:
        what a study's `tune:` section chooses on (`eval.split: validation`). Tasks without one cannot be tuned."""
        raise NotImplementedError(f"{type(self).__name__} has no validation split apart from its test split")

    def has_validation(self) -> bool:
        return type(self).validation_sets is not Task.validation_sets

    # Tasks whose answers are generated (a decoding evaluation, train/decoding.py, runs at the final
    # evaluation for families with a KV cache): `decodes`; whether a prediction at a scored position
    # is fed back as the next input (free-running answers) or the true next token is (streaming a text).
    decodes: bool = False
    decode_feedback: bool = True

    def decode_metric_names(self) -> set[str]:
        """What a family with a KV cache reports on this task (train/decoding.py): the decoding evaluation's
        metrics where the task decodes, else (causal tasks) the analytic KV bytes per token."""
        per_token = {"kv_cache_bytes_per_token", "kv_cache_bytes_per_token_analytic"}
        if not self.decodes:
            return per_token if self.facts.causal else set()
        kinds = ("loss", *self.metric_kinds)
        memory = per_token | {"kv_cache_bytes"}
        return {f"eval_decode_{k}" for k in kinds} | memory | {"eval_peak_memory_bytes", "decode_tokens_per_sec"}

    def split_names(self) -> list[str]:
        """The keys `eval_sets` returns, known without generating data (checked at validate time)."""
        return [""]

    def eval_capacity(self) -> int | None:
        """Distinct eval problems per split, where finite and small enough to matter; None otherwise.
        Asking for more eval examples than this is warned about (the eval set would repeat)."""
        return None

    def reported_metrics(self) -> set[str]:
        """Every eval metric name a trial of this task reports: unsuffixed always, per split as well."""
        kinds = ("loss", *self.metric_kinds)
        names = {f"eval_{k}" for k in kinds}
        names |= {f"eval_{k}_{split}" for k in kinds for split in self.split_names() if split}
        return names

    # --- what the metrics can read (tasks/levels.py) --------------------------------------------------

    # How many answers a scored position can take (the alphabet of the answer), for the chance level; a task
    # whose choices differ by position overrides `answer_choices_of`.
    answer_choices: int | None = None

    def answer_choices_of(self, batch: Batch) -> torch.Tensor:
        """(B, T) how many answers each position can take (only the scored ones are read)."""
        return torch.full_like(batch.targets, self.answer_choices or self.facts.vocab_size, dtype=torch.float64)

    def scored_positions(self, batch: Batch) -> torch.Tensor:
        """(B, T) the positions accuracy and exact match count (`metrics`): the loss's, unless overridden."""
        return batch.loss_mask

    def heuristic_floors(self, batch: Batch) -> dict[str, tuple[float, str]]:
        """{metric kind: (expected score, the strategy)} of the best strategy known that reads the input but does
        not do the task's computation, where it beats chance on this eval batch (none by default)."""
        return {}

    def metric_levels(self, examples: int) -> dict[str, MetricLevels]:
        """{eval metric name: its levels} on the eval sets of `examples` examples: per split (`eval_accuracy_n8`)
        and unsuffixed (the mean over splits, as `evaluate` reports it)."""
        per_split: dict[str, dict[str, MetricLevels]] = {}
        for split, batch in self.eval_sets(examples).items():
            chance = guessing(self.answer_choices_of(batch), self.scored_positions(batch), batch.loss_mask)
            floors = self.heuristic_floors(batch)
            kinds: dict[str, MetricLevels] = {}
            for kind in ("loss", *self.metric_kinds):
                floor, strategy = floors.get(kind, (None, ""))
                if kind in HIGHER_BETTER:
                    kinds[kind] = bounded(chance[kind], floor, strategy)
                elif kind == "loss":
                    kinds[kind] = loss_levels(chance["loss"], floor, strategy)
                elif kind == "bpc":
                    kinds[kind] = loss_levels(chance["loss"] / math.log(2), floor, strategy)
            per_split[split] = kinds
        out = {}
        for split, kinds in per_split.items():
            if split:
                out.update({f"eval_{kind}_{split}": levels for kind, levels in kinds.items()})
        for kind in next(iter(per_split.values()), {}):
            out[f"eval_{kind}"] = _mean_levels([kinds[kind] for kinds in per_split.values()])
        return out

    def loss(
        self, logits: torch.Tensor, batch: Batch, weights: torch.Tensor | None = None, *, dense: bool = False
    ) -> torch.Tensor:
        """Mean cross-entropy over the scored positions; with `weights` (B, T), of each position's
        cross-entropy times its weight (one term of an expected loss over a model's exits). `dense`: the same
        mean over every position with the mask as a 0/1 weight, with no indexing by the mask, whose result
        size the host must read (what a CUDA graph can capture: train/packed_graph.py); equal up to rounding."""
        mask = batch.loss_mask
        if dense:
            per_token = F.cross_entropy(logits.flatten(0, -2), batch.targets.flatten(), reduction="none")
            scored = mask.flatten().to(per_token.dtype)
            if weights is not None:
                scored = scored * weights.flatten().to(per_token.dtype)
            return (per_token * scored).sum() / mask.sum()
        if weights is None:
            return F.cross_entropy(logits[mask], batch.targets[mask])
        per_token = F.cross_entropy(logits[mask], batch.targets[mask], reduction="none")
        return (per_token * weights[mask]).mean()

    def metrics(self, logits: torch.Tensor, batch: Batch) -> dict[str, float]:
        """Per-token accuracy over scored positions and exact match over whole examples.

        Tasks with other notions of success (e.g. only blank Sudoku cells) override this and keep the
        names `accuracy` and `exact_match`, adding their own beside them.
        """
        mask = batch.loss_mask
        correct = (logits.argmax(-1) == batch.targets) & mask
        accuracy = correct.sum().item() / max(1, mask.sum().item())
        exact = (correct | ~mask).all(dim=1).float().mean().item()
        return {"accuracy": accuracy, "exact_match": exact}


def _mean_levels(levels: list[MetricLevels]) -> MetricLevels:
    """The levels of a mean over splits: each level averaged (a floor only where every split has one)."""
    first = levels[0]

    def mean(values):
        return None if any(v is None for v in values) else sum(values) / len(values)

    floors = [lv.floor for lv in levels]
    return replace(first, chance=mean([lv.chance for lv in levels]), floor=mean(floors))
