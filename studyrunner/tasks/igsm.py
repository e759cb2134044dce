"""Task `igsm`: the simplified i-GSM of Saunshi et al., *Reasoning with Latent Thoughts: On the Power of
Looped Transformers* (seed 002, §2.1 / App. A.1), after Ye et al., *Physics of Language Models: Part 2.1*.

A problem is a set of assignments to "instance parameters" followed by a query; the answer is the queried
parameter's value mod `modulus` (7 in the paper, 23 in Ye et al.).

- **Hierarchy and names.** `levels` levels of `level_width` entities each; an instance parameter is an
  edge from an entity of level i to one of level i+1, written `A # B` (two entity tokens) as the paper's
  `E#I`. A problem uses `nodes` distinct parameters drawn uniformly from all such edges.
- **Dependency DAG.** The parameters are put in a random order; the first is a constant, each later one
  is a constant with probability 1/4 and otherwise an expression of 1..`max_terms` distinct earlier
  parameters: `t1 (+|-) t2 ...`, each term a parameter or `k * parameter` (k in 2..modulus-1, with
  probability 1/3; never for modulus 2), matching the operations of the paper's example (constant,
  copy, +, -, integer x).
- **Query and distractors.** The query is the last parameter of the order, always an expression; the
  parameters it does not depend on are distractors (every problem has at least one; problems without
  are redrawn).
- **Surface.** Statements `A # B = expr .` in random order (not topological, as in the paper's example),
  then `A # B ?`; left-padded with a pad token so the answer is always predicted at the last position.

Readings chosen where the paper is silent (it defers the sampler to Ye et al.): answer only, no chain of
thought (the paper shows a CoT example but never says the targets include it; CoT targets are not
offered); statement order random, `shuffle: false` gives a topological order instead; the constants and
coefficient probabilities above are this implementation's. Held-out examples: a fixed hash of the token
sequence sends 1 in 16 problems to evaluation, and training redraws any problem that lands there.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field, model_validator

from ..params import StrictParams
from .base import Batch, Task, TaskFacts
from .holdout import draw, is_eval
from .registry import register_task

P_CONST = 0.25
P_COEF = 1 / 3
_SALT = 0x165A
MAX_LEN = 4096


class IgsmParams(StrictParams):
    modulus: int = Field(7, ge=2, le=97, description="Answers mod this (7 in the paper, 23 in Ye et al.).")
    levels: int = Field(4, ge=2, le=8, description="Depth of the entity hierarchy.")
    level_width: int = Field(4, ge=1, le=16, description="Entities per level.")
    nodes: int = Field(6, ge=3, le=48, description="Instance parameters per problem, distractors included.")
    max_terms: int = Field(3, ge=1, le=8, description="Most parameters an expression combines.")
    shuffle: bool = Field(True, description="Statements in random order (false: topological order).")

    @model_validator(mode="after")
    def _check(self) -> IgsmParams:
        edges = (self.levels - 1) * self.level_width**2
        if self.nodes > edges:
            raise ValueError(
                f"nodes ({self.nodes}) exceeds the {edges} instance parameters of a {self.levels}-level hierarchy "
                f"of width {self.level_width} ((levels-1) * level_width^2)"
            )
        if igsm_seq_len(self) > MAX_LEN:
            raise ValueError(f"nodes x max_terms gives sequences of {igsm_seq_len(self)} tokens; at most {MAX_LEN}")
        return self


def igsm_seq_len(p: IgsmParams) -> int:
    statement = 2 + 1 + p.max_terms * 4 + (p.max_terms - 1) + 1  # name = (k * name) (op ...) .
    return p.nodes * statement + 3


class Vocab:
    """Token ids: entities, digits 0..modulus-1, then punctuation."""

    def __init__(self, p: IgsmParams):
        self.entities = p.levels * p.level_width
        d = self.entities + p.modulus
        self.eq, self.plus, self.minus, self.times, self.end, self.query, self.pad = range(d, d + 7)
        self.size = d + 7

    def digit(self, v: int) -> int:
        return self.entities + v


def sample_problems(rng: np.random.Generator, count: int, p: IgsmParams, vocab: Vocab):
    """`count` problems at once: (tokens (m, seq_len) left-padded, answer values (m,)), m <= count.

    Vectorised over problems: one loop over the nodes, each statement laid out in a fixed slot template
    (absent slots dropped afterwards), then the tokens are right-aligned. Problems without a
    distractor are dropped (the caller draws again)."""
    w, n, m_terms, mod = p.level_width, p.nodes, p.max_terms, p.modulus
    rows = np.arange(count)
    edge_ids = np.argsort(rng.random((count, (p.levels - 1) * w * w)), axis=1)[:, :n]
    level, rest = np.divmod(edge_ids, w * w)
    a, b = np.divmod(rest, w)
    name_a, name_b = level * w + a, (level + 1) * w + b  # (count, n) entity tokens
    values = np.zeros((count, n), dtype=np.int64)
    deps = np.zeros((count, n), dtype=np.int64)  # bitmask of ancestors
    width = 3 + 5 * m_terms  # name name = [op coef * X Y] per term (no op before the first) .
    slots = np.full((count, n, width), vocab.pad, dtype=np.int64)
    present = np.zeros((count, n, width), dtype=bool)
    slots[:, :, 0], slots[:, :, 1], slots[:, :, 2], slots[:, :, -1] = name_a, name_b, vocab.eq, vocab.end
    present[:, :, [0, 1, 2, -1]] = True
    u = rng.random((count, n))
    for t in range(n):
        const = np.full(count, t == 0) | ((u[:, t] < P_CONST) & (t < n - 1))
        c = rng.integers(0, mod, size=count)
        k = rng.integers(1, min(m_terms, max(t, 1)) + 1, size=count)
        srcs = np.argsort(rng.random((count, max(t, 1))), axis=1)[:, :m_terms]
        signs = np.where(rng.random((count, m_terms)) < 0.5, 1, -1)
        signs[:, 0] = 1
        coefs = np.where(rng.random((count, m_terms)) < P_COEF, rng.integers(2, max(3, mod), size=(count, m_terms)), 1)
        if mod <= 2:
            coefs[:] = 1
        total = np.zeros(count, dtype=np.int64)
        dep = np.zeros(count, dtype=np.int64)
        for j in range(min(m_terms, t)):
            on = ~const & (j < k)
            src = srcs[:, j]
            total += np.where(on, signs[:, j] * coefs[:, j] * values[rows, src], 0)
            dep |= np.where(on, deps[rows, src] | (np.int64(1) << src), 0)
            base = 3 + 5 * j - 1  # slot of this term's op
            if j:
                slots[:, t, base] = np.where(signs[:, j] > 0, vocab.plus, vocab.minus)
                present[:, t, base] = on
            has_coef = on & (coefs[:, j] != 1)
            slots[:, t, base + 1], slots[:, t, base + 2] = vocab.entities + coefs[:, j], vocab.times
            present[:, t, base + 1] = has_coef
            present[:, t, base + 2] = has_coef
            slots[:, t, base + 3], slots[:, t, base + 4] = name_a[rows, src], name_b[rows, src]
            present[:, t, base + 3] = on
            present[:, t, base + 4] = on
        # a constant writes its digit in the first term's coefficient slot
        slots[:, t, 3] = np.where(const, vocab.entities + c, slots[:, t, 3])
        present[:, t, 3] |= const
        values[:, t] = np.where(const, c, total % mod)
        deps[:, t] = np.where(const, 0, dep)
    ancestors = np.array([int(x).bit_count() for x in deps[:, -1]])
    keep = ancestors < n - 1  # at least one distractor
    order = np.argsort(rng.random((count, n)), axis=1) if p.shuffle else np.broadcast_to(np.arange(n), (count, n))
    slots = np.take_along_axis(slots, order[:, :, None], axis=1).reshape(count, n * width)
    present = np.take_along_axis(present, order[:, :, None], axis=1).reshape(count, n * width)
    query = np.stack([name_a[:, -1], name_b[:, -1], np.full(count, vocab.query)], axis=1)
    slots = np.concatenate([slots, query], axis=1)
    present = np.concatenate([present, np.ones((count, 3), dtype=bool)], axis=1)
    # right-align the present tokens: sort so absent slots come first, keeping the order of the rest
    first = np.argsort(present, axis=1, kind="stable")
    tokens = np.where(np.take_along_axis(present, first, axis=1), np.take_along_axis(slots, first, axis=1), vocab.pad)
    return tokens[keep], values[keep, -1]


class Igsm(Task):
    def __init__(self, params: IgsmParams, seed: int):
        self.p, self.seed = params, seed
        self.vocab = Vocab(params)
        self.facts = TaskFacts(vocab_size=self.vocab.size, seq_len=igsm_seq_len(params), causal=True)

    def _sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        seqs, values = sample_problems(rng, count, self.p, self.vocab)
        return seqs, self.vocab.entities + values

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step, 0x165])
        return Batch.answer_at_end(*draw(self._sample, rng, batch_size, _SALT, want_eval=False))

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        p = self.p
        key = [0xE7A1, p.modulus, p.levels, p.level_width, p.nodes, p.max_terms, int(p.shuffle)]
        return {
            "": Batch.answer_at_end(*draw(self._sample, np.random.default_rng(key), examples, _SALT, want_eval=True))
        }

    def is_eval_example(self, seqs: np.ndarray) -> np.ndarray:
        return is_eval(seqs, _SALT)


@register_task("igsm", IgsmParams)
def build(params: IgsmParams, seed: int) -> Igsm:
    return Igsm(params, seed)
