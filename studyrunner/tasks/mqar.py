"""Task `mqar`: multi-query associative recall (Arora et al., Zoology), answers decoded autoregressively.

An example lists `pairs` key-value pairs, then asks `queries` of those keys in a random order, each
followed by its value:

    k1 v1 k2 v2 ... kP vP  q1 a1 q2 a2 ... qQ aQ

Keys within an example are distinct; values are drawn independently (so they may repeat). Key tokens are
0..keys-1 and value tokens keys..keys+values-1. The model reads causally and is scored on the answers
(teacher-forced: `eval_accuracy` per answer, `eval_exact_match` per example; chance 1/values). Unlike
`recall`, the facts are in the context, not the weights: the task exercises attention over the KV cache.

Decoded (`decodes`): at the final evaluation the families with a KV cache also run each held-out example
token by token and generate every answer greedily, the prediction taking the answer's place in the
context (`eval_decode_accuracy`, `eval_decode_exact_match`), and report the cache's bytes per token
(train/decoding.py).

Held-out examples: a fixed hash of the whole token sequence sends 1 in 16 to evaluation; training
redraws any example that lands there.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field, model_validator

from ..params import StrictParams
from .base import Batch, Task, TaskFacts
from .holdout import HOLDOUT, VALIDATION, draw, draw_apart
from .registry import register_task

_SALT = 0x3A7


class MqarParams(StrictParams):
    pairs: int = Field(8, ge=1, le=1024, description="Key-value pairs in the context.")
    queries: int = Field(4, ge=1, le=1024, description="Keys asked after the pairs (distinct; at most pairs).")
    keys: int = Field(64, ge=2, le=4096, description="Key symbols (distinct within an example).")
    values: int = Field(64, ge=2, le=4096, description="Value symbols.")

    @model_validator(mode="after")
    def _check(self) -> MqarParams:
        if self.pairs > self.keys:
            raise ValueError(f"pairs ({self.pairs}) cannot exceed keys ({self.keys}): keys are distinct per example")
        if self.queries > self.pairs:
            raise ValueError(f"queries ({self.queries}) cannot exceed pairs ({self.pairs})")
        if math.perm(self.keys, self.pairs) * self.values**self.pairs < 64 * HOLDOUT:
            raise ValueError(
                f"keys {self.keys}, values {self.values}, pairs {self.pairs} give too few distinct examples for a "
                f"held-out 1/{HOLDOUT} (raise keys, values or pairs)"
            )
        return self


class Mqar(Task):
    decodes = True
    decode_feedback = True

    def __init__(self, params: MqarParams, seed: int):
        self.answer_choices = params.values
        self.p, self.seed = params, seed
        self.facts = TaskFacts(
            vocab_size=params.keys + params.values, seq_len=2 * (params.pairs + params.queries) - 1, causal=True
        )

    def _sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray]:
        p = self.p
        keys = rng.random((count, p.keys)).argsort(axis=1)[:, : p.pairs]
        values = rng.integers(0, p.values, size=(count, p.pairs)) + p.keys
        asked = rng.random((count, p.pairs)).argsort(axis=1)[:, : p.queries]
        context = np.stack([keys, values], axis=2).reshape(count, -1)
        rows = np.arange(count)[:, None]
        questions = np.stack([keys[rows, asked], values[rows, asked]], axis=2).reshape(count, -1)
        return (np.concatenate([context, questions], axis=1).astype(np.int64),)

    def _batch(self, sequences: np.ndarray) -> Batch:
        seq = torch.from_numpy(sequences)
        inputs, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        mask = torch.zeros_like(targets, dtype=torch.bool)
        mask[:, 2 * self.p.pairs :: 2] = True  # each query key predicts its value
        return Batch(inputs, targets, mask)

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step, _SALT])
        (sequences,) = draw(self._sample, rng, batch_size, _SALT, want_eval=False)
        return self._batch(sequences)

    def _key(self) -> list[int]:
        p = self.p
        return [_SALT, p.pairs, p.queries, p.keys, p.values]

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        (sequences,) = draw(self._sample, np.random.default_rng([0xE7A1, *self._key()]), examples, _SALT, True)
        return {"": self._batch(sequences)}

    def validation_sets(self, examples: int) -> dict[str, Batch]:
        (taken,) = draw(self._sample, np.random.default_rng([0xE7A1, *self._key()]), examples, _SALT, True)
        rng = np.random.default_rng([VALIDATION, *self._key()])
        (sequences,) = draw_apart(self._sample, rng, examples, _SALT, taken)
        return {"": self._batch(sequences)}


@register_task("mqar", MqarParams)
def build(params: MqarParams, seed: int) -> Mqar:
    return Mqar(params, seed)
