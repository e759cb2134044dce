"""Task `recall`: key -> value lookup in a fixed random table, knowledge that must live in the weights.

The contrast to p-hop and addition (computation) that Frey et al., *Adaptive Loops and Memory in
Transformers: Think Harder or Know More?* (seed 000), draw: looping should help computation while memory
helps recall. The paper itself evaluates on language-model benchmarks; this synthetic proxy is the one the
engineering notes suggest.

A table maps `table_size` distinct keys, each `key_len` tokens over `key_alphabet`, to values drawn
uniformly from `values` symbols. The table is a function of the task params (including `table_seed`) and
never of the trial seed, so every seed of a cell learns the same facts. An example asks `queries` distinct
keys in a row, each followed by its value: `k1 k1' v1 k2 k2' v2 ...` (causal, teacher-forced; only the
value tokens are scored, so exact match = every value of the example right).

Held-out examples: a fixed hash of the key tuple sends 1 in 16 tuples to evaluation; training never sees
those tuples, though it sees every key in other tuples. That is why `queries` must be at least 2: with one
key per example, holding out an example would hold out the fact itself, which no model could recall.
Reading chosen: keys are composite (two tokens by default) so that a lookup needs the tokens combined;
`key_len: 1` gives the plain single-token lookup.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field, model_validator

from ..params import StrictParams
from .base import Batch, Task, TaskFacts
from .holdout import HOLDOUT, VALIDATION, draw, draw_apart, is_eval
from .registry import register_task

MIN_TUPLES = 1024  # ordered distinct key tuples needed so the held-out 1/16 is never empty
_SALT = 0x2EC4


class RecallParams(StrictParams):
    key_alphabet: int = Field(16, ge=2, le=1024, description="Symbols a key token is drawn from.")
    key_len: int = Field(2, ge=1, le=8, description="Tokens per key.")
    table_size: int = Field(256, ge=2, le=65536, description="Keys in the table (facts to store).")
    values: int = Field(16, ge=2, le=1024, description="Symbols a value is drawn from.")
    queries: int = Field(4, ge=2, le=64, description="Distinct keys asked per example (at least 2, see the doc).")
    table_seed: int = Field(0, ge=0, le=2**31 - 1, description="Which random table (not the trial seed).")

    @model_validator(mode="after")
    def _check(self) -> RecallParams:
        keys = self.key_alphabet**self.key_len
        if self.table_size > keys:
            raise ValueError(
                f"table_size {self.table_size} exceeds the {keys} distinct keys of key_alphabet^key_len "
                f"({self.key_alphabet}^{self.key_len})"
            )
        if self.queries > self.table_size:
            raise ValueError(f"queries ({self.queries}) cannot exceed table_size ({self.table_size})")
        if math.perm(self.table_size, self.queries) < MIN_TUPLES:
            raise ValueError(
                f"table_size {self.table_size} with queries {self.queries} gives only "
                f"{math.perm(self.table_size, self.queries)} distinct examples; at least {MIN_TUPLES} are needed "
                f"so that the held-out 1/{HOLDOUT} of them is not empty (raise table_size or queries)"
            )
        return self


def make_table(p: RecallParams) -> tuple[np.ndarray, np.ndarray]:
    """(keys (table_size, key_len), values (table_size,)): a function of the params only."""
    rng = np.random.default_rng([0x7AB1E, p.table_seed, p.key_alphabet, p.key_len, p.table_size, p.values])
    space = p.key_alphabet**p.key_len
    if space <= 1 << 22:
        ids = rng.choice(space, size=p.table_size, replace=False)
    else:  # draw distinct ids without materialising the space
        ids = np.unique(rng.integers(0, space, size=2 * p.table_size))
        while len(ids) < p.table_size:
            ids = np.unique(np.concatenate([ids, rng.integers(0, space, size=p.table_size)]))
        ids = rng.permutation(ids)[: p.table_size]
    keys = (ids[:, None] // p.key_alphabet ** np.arange(p.key_len - 1, -1, -1)) % p.key_alphabet
    return keys.astype(np.int64), rng.integers(0, p.values, size=p.table_size)


def distinct_rows(rng: np.random.Generator, count: int, n: int, q: int) -> np.ndarray:
    """(count, q) indices in [0, n), distinct within each row: redraw the clashing entries column by column."""
    out = rng.integers(0, n, size=(count, q))
    for j in range(1, q):
        clash = (out[:, :j] == out[:, j : j + 1]).any(axis=1)
        while clash.any():
            out[clash, j] = rng.integers(0, n, size=int(clash.sum()))
            clash = (out[:, :j] == out[:, j : j + 1]).any(axis=1)
    return out


class Recall(Task):
    def __init__(self, params: RecallParams, seed: int):
        self.answer_choices = params.values
        self.p, self.seed = params, seed
        self.keys, self.values = make_table(params)
        block = params.key_len + 1
        self.facts = TaskFacts(
            vocab_size=params.key_alphabet + params.values, seq_len=params.queries * block - 1, causal=True
        )

    def sequences(self, tuples: np.ndarray) -> np.ndarray:
        """(m, queries) table indices -> (m, queries*(key_len+1)) tokens: key tokens then the value."""
        p = self.p
        keys = self.keys[tuples]  # (m, q, key_len)
        vals = (self.values[tuples] + p.key_alphabet)[..., None]
        return np.concatenate([keys, vals], axis=2).reshape(len(tuples), -1)

    def _sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray]:
        return (distinct_rows(rng, count, self.p.table_size, self.p.queries),)

    def _batch(self, tuples: np.ndarray) -> Batch:
        seq = torch.from_numpy(self.sequences(tuples))
        inputs, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        mask = torch.zeros_like(targets, dtype=torch.bool)
        mask[:, self.p.key_len - 1 :: self.p.key_len + 1] = True  # the positions that predict a value
        return Batch(inputs, targets, mask)

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step, 0x2EC])
        (tuples,) = draw(self._sample, rng, batch_size, _SALT, want_eval=False)
        return self._batch(tuples)

    def _key(self) -> list[int]:
        p = self.p
        return [p.table_seed, p.key_alphabet, p.key_len, p.table_size, p.values]

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        (tuples,) = draw(self._sample, np.random.default_rng([0xE7A1, *self._key()]), examples, _SALT, True)
        return {"": self._batch(tuples)}

    def validation_sets(self, examples: int) -> dict[str, Batch]:
        (taken,) = draw(self._sample, np.random.default_rng([0xE7A1, *self._key()]), examples, _SALT, True)
        (tuples,) = draw_apart(self._sample, np.random.default_rng([VALIDATION, *self._key()]), examples, _SALT, taken)
        return {"": self._batch(tuples)}

    def is_eval_example(self, tuples: np.ndarray) -> np.ndarray:
        return is_eval(tuples, _SALT)

    def eval_capacity(self) -> int | None:
        total = math.perm(self.p.table_size, self.p.queries)
        return max(1, total // HOLDOUT) if total < 10**9 else None


@register_task("recall", RecallParams)
def build(params: RecallParams, seed: int) -> Recall:
    return Recall(params, seed)
