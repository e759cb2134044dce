"""Task `var_assign`: variable assignment at depth 0 and 1 (the reasoning primitives of Saunshi et al.,
*Reasoning with Latent Thoughts: On the Power of Looped Transformers*, seed 002, §3.4).

The paper's examples: depth 0 `a=1, b=2, c=6, b=?` (answer 2); depth 1 `a=1, b=2, c=a, d=b, d=?`
(answer 2). Here: `width` constants `x=v` (distinct names, values uniform over `values` digits); at depth
d >= 1, d further levels of `width` variables each copying a distinct variable of the level below (a
random permutation, as in the example where c=a, d=b); the query names a variable of the deepest level, so
depth 0 asks a constant and depth 1 a copy. Tokens: names, digits, `=`, `,`, `?`; the model reads
`a = 1 , ... , d = ?` (causal) and is scored on the answer at the last position only.

Readings chosen where the paper is silent: statements come level by level (constants first, as in both
examples), shuffled within each level; `shuffle: true` puts them in a uniformly random order instead
(a copy may then appear before the variable it copies). Depths 2-4 extend the definition as chains of
copies. The paper's math and code variants differ only in surface syntax, which a symbolic vocabulary does
not have. Held-out examples: a fixed hash of the token sequence sends 1 in 16 sequences to evaluation, and
training redraws any sequence that lands there.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, model_validator

from ..params import StrictParams
from .base import Batch, Task, TaskFacts
from .holdout import HOLDOUT, VALIDATION, draw, draw_apart, is_eval
from .registry import register_task

MIN_SPACE = 4096
_SALT = 0x7A55


class VarAssignParams(StrictParams):
    depth: int = Field(
        0, ge=0, le=4, description="Copies between the queried variable and its value (0 or 1 in the paper)."
    )
    width: int = Field(3, ge=1, le=16, description="Variables per level (constants, then copies).")
    names: int = Field(26, ge=2, le=256, description="Distinct variable names to draw from.")
    values: int = Field(10, ge=2, le=256, description="Distinct values (digits).")
    shuffle: bool = Field(False, description="Statements in random order instead of level by level.")

    @model_validator(mode="after")
    def _check(self) -> VarAssignParams:
        needed = (self.depth + 1) * self.width
        if needed > self.names:
            raise ValueError(
                f"depth {self.depth} x width {self.width} needs {needed} distinct names, names is {self.names}"
            )
        space = math.perm(self.names, needed) * self.values**self.width * self.width
        if space < MIN_SPACE:
            raise ValueError(
                f"only {space} distinct problems (names, values, width, depth); at least {MIN_SPACE} are needed so "
                f"that the held-out 1/{HOLDOUT} of them is not empty (raise names, values or width)"
            )
        return self


class VarAssign(Task):
    def __init__(self, params: VarAssignParams, seed: int):
        self.p, self.seed = params, seed
        self.answer_choices = params.values
        base = params.names + params.values
        self.eq, self.comma, self.query = base, base + 1, base + 2
        self.statements = (params.depth + 1) * params.width
        self.facts = TaskFacts(
            vocab_size=params.names + params.values + 3, seq_len=4 * self.statements + 3, causal=True
        )

    def _sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(count, seq_len) token rows and their answers (value tokens)."""
        p, w, s = self.p, self.p.width, self.statements
        names = np.argsort(rng.random((count, p.names)), axis=1)[:, :s].reshape(count, p.depth + 1, w)
        consts = rng.integers(0, p.values, size=(count, w))
        # right-hand sides: level 0 holds value tokens; level l copies names of level l-1 (a permutation)
        rhs = np.empty((count, p.depth + 1, w), dtype=np.int64)
        rhs[:, 0] = p.names + consts
        value_of = consts  # value of each variable of the current level, by slot
        for level in range(1, p.depth + 1):
            src = np.argsort(rng.random((count, w)), axis=1)
            rhs[:, level] = np.take_along_axis(names[:, level - 1], src, axis=1)
            value_of = np.take_along_axis(value_of, src, axis=1)
        lhs, rhs = names.reshape(count, s), rhs.reshape(count, s)
        if p.shuffle:
            order = np.argsort(rng.random((count, s)), axis=1)
        else:  # shuffle within each level only
            order = np.argsort(rng.random((count, p.depth + 1, w)), axis=2) + (np.arange(p.depth + 1) * w)[:, None]
            order = order.reshape(count, s)
        lhs, rhs = np.take_along_axis(lhs, order, axis=1), np.take_along_axis(rhs, order, axis=1)
        q = rng.integers(0, w, size=count)
        rows = np.arange(count)
        asked = names[rows, p.depth, q]
        answers = p.names + value_of[rows, q]
        body = np.stack([lhs, np.full_like(lhs, self.eq), rhs, np.full_like(lhs, self.comma)], axis=2)
        tail = np.stack([asked, np.full(count, self.eq), np.full(count, self.query)], axis=1)
        return np.concatenate([body.reshape(count, 4 * s), tail], axis=1), answers

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step, 0x7A5])
        return Batch.answer_at_end(*draw(self._sample, rng, batch_size, _SALT, want_eval=False))

    def _key(self) -> list[int]:
        p = self.p
        return [p.depth, p.width, p.names, p.values, int(p.shuffle)]

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        rng = np.random.default_rng([0xE7A1, *self._key()])
        return {"": Batch.answer_at_end(*draw(self._sample, rng, examples, _SALT, want_eval=True))}

    def validation_sets(self, examples: int) -> dict[str, Batch]:
        taken, _ = draw(self._sample, np.random.default_rng([0xE7A1, *self._key()]), examples, _SALT, True)
        rng = np.random.default_rng([VALIDATION, *self._key()])
        return {"": Batch.answer_at_end(*draw_apart(self._sample, rng, examples, _SALT, taken))}

    def is_eval_example(self, seqs: np.ndarray) -> np.ndarray:
        return is_eval(seqs, _SALT)


@register_task("var_assign", VarAssignParams)
def build(params: VarAssignParams, seed: int) -> VarAssign:
    return VarAssign(params, seed)
