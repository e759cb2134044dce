"""What every task provides: facts for the model builder, deterministic batches and metrics.

Tasks are pure Python/PyTorch: they import nothing from the platform.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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

    def loss(self, logits: torch.Tensor, batch: Batch, weights: torch.Tensor | None = None) -> torch.Tensor:
        """Mean cross-entropy over the scored positions; with `weights` (B, T), of each position's
        cross-entropy times its weight (one term of an expected loss over a model's exits)."""
        mask = batch.loss_mask
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
