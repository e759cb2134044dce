"""Task `addition`: n-ary addition of fixed-width operands (Saunshi et al., seed 002, §2.1).

Format `abc+def+...=` then the sum as exactly A digits, least-significant first by default (the CPU
notes found reversed answers learnable; `reverse_answer: false` gives the paper's reading order).
Teacher-forced: the loss and metrics cover the answer digits only, so exact match under teacher
forcing equals greedy-decoding exact match. Every batch has one operand count, so nothing is padded;
evaluation reports each count in `eval_operands` as its own split (`_n8`), unseen counts included.
Held-out examples: a fixed hash of the operand tuple sends 1 in 16 tuples to evaluation; training redraws
any tuple that lands there, so no eval problem is ever trained on (`holdout.py`).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from ..params import StrictParams
from .base import Batch, Task, TaskFacts
from .holdout import HOLDOUT, VALIDATION, draw, draw_apart
from .registry import register_task

PLUS, EQUALS = 10, 11
_SALT = 0xADD  # the train/eval partition of operand tuples
MIN_EVAL_SPACE = 1000  # operand tuples per eval count, so the held-out 1/16 is never empty


class AdditionParams(StrictParams):
    digits: int = Field(3, ge=1, le=6, description="Digits per operand (zero-padded).")
    train_operands: list[int] = Field([2], min_length=1, description="Operand counts mixed in training.")
    eval_operands: list[int] = Field([2], min_length=1, description="Operand counts evaluated, one split each.")
    reverse_answer: bool = Field(True, description="Answer least-significant digit first.")

    @field_validator("train_operands", "eval_operands")
    @classmethod
    def _at_least_two(cls, counts: list[int]) -> list[int]:
        if any(c < 2 or c > 64 for c in counts):
            raise ValueError("operand counts must be between 2 and 64")
        return sorted(set(counts))

    @model_validator(mode="after")
    def _eval_space(self) -> AdditionParams:
        small = [n for n in self.eval_operands if 10 ** (self.digits * n) < MIN_EVAL_SPACE]
        if small:
            raise ValueError(
                f"eval operand count {small[0]} with {self.digits}-digit operands has only "
                f"{10 ** (self.digits * small[0])} distinct problems; at least {MIN_EVAL_SPACE} "
                f"(digits x operands >= 3) are needed so that the held-out 1/{HOLDOUT} of them is never empty"
            )
        return self


class Addition(Task):
    answer_choices = 10  # an answer digit

    def __init__(self, params: AdditionParams, seed: int):
        self.p, self.seed = params, seed
        max_n = max(params.train_operands + params.eval_operands)
        self.answer_digits = len(str(max_n * (10**params.digits - 1)))
        longest = max_n * (params.digits + 1) + self.answer_digits - 1
        self.facts = TaskFacts(vocab_size=12, seq_len=longest, causal=True)

    def sequences(self, operands: np.ndarray) -> np.ndarray:
        """(m, n) operands -> (m, n*(digits+1) + A) tokens."""
        m, n = operands.shape
        d = self.p.digits
        digits = (operands[..., None] // 10 ** np.arange(d - 1, -1, -1)) % 10  # (m, n, d), MSB first
        sep = np.full((m, n, 1), PLUS)
        sep[:, -1, 0] = EQUALS
        prompt = np.concatenate([digits, sep], axis=2).reshape(m, n * (d + 1))
        a = self.answer_digits
        answer = (operands.sum(axis=1)[:, None] // 10 ** np.arange(a)) % 10  # LSB first
        if not self.p.reverse_answer:
            answer = answer[:, ::-1]
        return np.concatenate([prompt, answer], axis=1)

    def _operands(self, n: int):
        high = 10**self.p.digits
        return lambda r, k: (r.integers(0, high, size=(k, n)),)

    def _batch(self, rng: np.random.Generator, count: int, n: int, want_eval: bool) -> Batch:
        """Operand tuples from one side of the fixed train/eval partition (see `holdout`)."""
        (operands,) = draw(self._operands(n), rng, count, _SALT, want_eval)
        return self._batch_of(operands)

    def _batch_of(self, operands: np.ndarray) -> Batch:
        seq = torch.from_numpy(self.sequences(operands))
        inputs, targets = seq[:, :-1], seq[:, 1:]
        mask = torch.zeros_like(targets, dtype=torch.bool)
        mask[:, -self.answer_digits :] = True
        return Batch(inputs.contiguous(), targets.contiguous(), mask)

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step, 0xADD])
        n = int(rng.choice(self.p.train_operands))
        return self._batch(rng, batch_size, n, want_eval=False)

    def split_names(self) -> list[str]:
        return [f"n{n}" for n in self.p.eval_operands]

    def eval_capacity(self) -> int | None:
        distinct = 10 ** (self.p.digits * min(self.p.eval_operands)) // HOLDOUT  # the held-out share
        return distinct if distinct < 10**9 else None

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        return {
            f"n{n}": self._batch(np.random.default_rng([0xE7A1, n, self.p.digits]), examples, n, want_eval=True)
            for n in self.p.eval_operands
        }

    def validation_sets(self, examples: int) -> dict[str, Batch]:
        out = {}
        for n in self.p.eval_operands:
            (taken,) = draw(self._operands(n), np.random.default_rng([0xE7A1, n, self.p.digits]), examples, _SALT, True)
            rng = np.random.default_rng([VALIDATION, n, self.p.digits])
            (operands,) = draw_apart(self._operands(n), rng, examples, _SALT, taken)
            out[f"n{n}"] = self._batch_of(operands)
        return out


@register_task("addition", AdditionParams)
def build(params: AdditionParams, seed: int) -> Addition:
    return Addition(params, seed)
