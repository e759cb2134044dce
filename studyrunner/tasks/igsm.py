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
- **Operations and `min_ops`.** An *operation* is one `+` or `-` between two terms of an expression, or one
  multiplication `k * X` by a coefficient: `X = Y` has none, `X = 2 * Y` one, `X = Y + 3 * Z - W` three. A
  constant has none. The *operations on the query's path* are the fewest operations met on any path of the
  dependency DAG from the query down to a constant, each expression on the path counting all its operations
  (evaluating it performs them all): ops(constant) = 0, ops(X) = (operations of X's expression) +
  min over the parameters Y it reads of ops(Y). With `min_ops: k` every problem has ops(query) >= k
  (problems with fewer are redrawn, vectorised, as for distractors). A *copy chain* (`X = Y`, `Y = Z`,
  `Z = 3`: answered by copying a constant) is exactly a query with ops 0, so any `min_ops >= 1` excludes
  copy chains. `min_ops >= 1` also redraws the problems whose answer does not depend on the constants (the
  query's value, a linear form over the constants mod `modulus`, is zero: `X = A - B` with `B = A` is always
  0; 2-7% of the problems otherwise, which makes 0 the most common answer). The copy-and-guess floor
  (`heuristic_floors`: copy the copy chains, answer 0 where the constants cancel, guess the rest) then falls
  to chance: for a prime modulus every answer is equally likely, and the strategy fitted on training batches
  scores 1/modulus on the eval set (tests/test_igsm_floor.py). `min_ops: 0` (the default) keeps the original
  sampler and its data unchanged.
- **Surface.** Statements `A # B = expr .` in random order (not topological, as in the paper's example),
  then `A # B ?`; left-padded with a pad token so the answer is always predicted at the last position.

Readings chosen where the paper is silent (it defers the sampler to Ye et al.): answer only, no chain of
thought (the paper shows a CoT example but never says the targets include it; CoT targets are not
offered); statement order random, `shuffle: false` gives a topological order instead; the constants and
coefficient probabilities above are this implementation's. Held-out examples: a fixed hash of the token
sequence sends 1 in 16 problems to evaluation, and training redraws any problem that lands there.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from pydantic import Field, model_validator

from ..params import StrictParams
from .base import Batch, Task, TaskFacts
from .holdout import VALIDATION, draw, draw_apart, is_eval
from .overlap import Overlap, partition_overlap
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
    min_ops: int = Field(
        0,
        ge=0,
        le=64,
        description="Fewest arithmetic operations (+, -, k*) on every path from the query down to a constant; "
        "problems with fewer are redrawn. >= 1 also excludes copy chains (X = Y, Y = 3) and answers in which the "
        "constants cancel (X = A - B, B = A). 0: the original sampler.",
    )

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
        if self.min_ops:
            top = max_path_ops(self)
            if self.min_ops > top:
                raise ValueError(
                    f"min_ops ({self.min_ops}) exceeds the {top} operations a query of {self.nodes} nodes with at most "
                    f"{self.max_terms} terms can have on its path; raise nodes or max_terms, or lower min_ops"
                )
            rate = acceptance(_key(self))
            if rate < MIN_ACCEPTANCE:
                raise ValueError(
                    f"min_ops {self.min_ops} with nodes {self.nodes}, max_terms {self.max_terms}: only {rate:.2%} of "
                    f"sampled problems have that many operations on the query's path (at least {MIN_ACCEPTANCE:.0%} "
                    "are needed to sample in bounded time); raise nodes or max_terms, or lower min_ops"
                )
        return self


MIN_ACCEPTANCE = 0.01  # the least share of sampled problems `min_ops` may keep (measured on a pilot sample)
PILOT = 2048


def _key(p: IgsmParams) -> tuple:
    return tuple(sorted(p.model_dump().items()))


def max_path_ops(p: IgsmParams) -> int:
    """An upper bound on ops(query): a path through every node, each expression as long as its position in the
    order allows (t earlier parameters: min(max_terms, t) terms, their signs and, modulus > 2, coefficients)."""
    terms = [min(p.max_terms, t) for t in range(1, p.nodes)]
    return sum(k - 1 + (k if p.modulus > 2 else 0) for k in terms)


@lru_cache(maxsize=128)
def acceptance(key: tuple) -> float:
    """The share of the sampler's problems that are kept (a distractor, and ops(query) >= min_ops), on a fixed
    pilot sample (a function of the params alone): sizes the draws, so that a round yields about what it asks."""
    p = IgsmParams.model_construct(**dict(key))
    tokens, _ = sample_problems(np.random.default_rng(0x9A7), PILOT, p, Vocab(p))
    return len(tokens) / PILOT


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
    distractor, or with fewer than `min_ops` operations on the query's path, are dropped (the caller
    draws again). Counting the operations draws nothing from `rng`: with `min_ops: 0` the problems are
    those of the original sampler."""
    w, n, m_terms, mod = p.level_width, p.nodes, p.max_terms, p.modulus
    rows = np.arange(count)
    edge_ids = np.argsort(rng.random((count, (p.levels - 1) * w * w)), axis=1)[:, :n]
    level, rest = np.divmod(edge_ids, w * w)
    a, b = np.divmod(rest, w)
    name_a, name_b = level * w + a, (level + 1) * w + b  # (count, n) entity tokens
    values = np.zeros((count, n), dtype=np.int64)
    deps = np.zeros((count, n), dtype=np.int64)  # bitmask of ancestors
    ops = np.zeros((count, n), dtype=np.int64)  # ops(X): fewest operations on a path from X to a constant
    # with min_ops: each value as a linear form over the constants (mod `mod`), to find answers that cancel
    forms = np.zeros((count, n, n), dtype=np.int64) if p.min_ops else None
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
        own = np.zeros(count, dtype=np.int64)  # this expression's operations
        below = np.full(count, np.iinfo(np.int64).max)  # the fewest operations under one of its terms
        for j in range(min(m_terms, t)):
            on = ~const & (j < k)
            src = srcs[:, j]
            total += np.where(on, signs[:, j] * coefs[:, j] * values[rows, src], 0)
            if forms is not None:
                forms[:, t] += np.where(on, signs[:, j] * coefs[:, j], 0)[:, None] * forms[rows, src]
            dep |= np.where(on, deps[rows, src] | (np.int64(1) << src), 0)
            base = 3 + 5 * j - 1  # slot of this term's op
            if j:
                slots[:, t, base] = np.where(signs[:, j] > 0, vocab.plus, vocab.minus)
                present[:, t, base] = on
            has_coef = on & (coefs[:, j] != 1)
            own += (on & (j > 0)).astype(np.int64) + has_coef  # its sign (not the first term's), its coefficient
            below = np.where(on, np.minimum(below, ops[rows, src]), below)
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
        ops[:, t] = np.where(const, 0, own + np.where(const, 0, below))  # `below` is unset for a constant
        if forms is not None:
            forms[:, t] %= mod
            forms[const, t, t] = 1
    ancestors = np.array([int(x).bit_count() for x in deps[:, -1]])
    keep = ancestors < n - 1  # at least one distractor
    if p.min_ops:  # enough operations, and an answer that depends on the constants
        keep &= (ops[:, -1] >= p.min_ops) & forms[:, -1].any(axis=1)
    query = np.stack([name_a[:, -1], name_b[:, -1], np.full(count, vocab.query)], axis=1)
    tokens = _statement_tokens(rng, p.shuffle, slots, present, query, vocab)
    return tokens[keep], values[keep, -1]


def _statement_tokens(rng: np.random.Generator, shuffle: bool, slots, present, query, vocab: Vocab) -> np.ndarray:
    """The statements (in random order if `shuffle`), then the query, as left-padded token rows: the slots
    (count, n, width) that are `present`, right-aligned."""
    count, n, width = slots.shape
    order = np.argsort(rng.random((count, n)), axis=1) if shuffle else np.broadcast_to(np.arange(n), (count, n))
    slots = np.take_along_axis(slots, order[:, :, None], axis=1).reshape(count, n * width)
    present = np.take_along_axis(present, order[:, :, None], axis=1).reshape(count, n * width)
    slots = np.concatenate([slots, query], axis=1)
    present = np.concatenate([present, np.ones((count, query.shape[1]), dtype=bool)], axis=1)
    # right-align the present tokens: sort so absent slots come first, keeping the order of the rest
    first = np.argsort(present, axis=1, kind="stable")
    return np.where(np.take_along_axis(present, first, axis=1), np.take_along_axis(slots, first, axis=1), vocab.pad)


def statements(tokens: list[int], vocab: Vocab) -> tuple[dict[tuple[int, int], list[int]], tuple[int, int]]:
    """{(entity, entity): the tokens right of its `=`} of a problem, and the queried parameter."""
    body = [t for t in tokens if t != vocab.pad]
    query = (body[-3], body[-2])
    found: dict[tuple[int, int], list[int]] = {}
    statement: list[int] = []
    for token in body[:-3]:
        if token == vocab.end:
            found[(statement[0], statement[1])] = statement[3:]
            statement = []
        else:
            statement.append(token)
    return found, query


def copy_chain_answer(tokens: list[int], vocab: Vocab) -> int | None:
    """The answer's digit token when the queried parameter is a chain of plain copies (`X = Y`) ending in a
    constant (`Y = 3`), so that copying answers it; None when any arithmetic is needed."""
    found, name = statements(tokens, vocab)
    for _ in range(len(found) + 1):
        rhs = found.get(name)
        if rhs is None:
            return None
        if len(rhs) == 1:  # a constant: its digit
            return rhs[0]
        if len(rhs) == 2 and all(t < vocab.entities for t in rhs):  # one term, no sign, no coefficient: a copy
            name = (rhs[0], rhs[1])
            continue
        return None
    return None


def _terms(rhs: list[int], vocab: Vocab) -> list[tuple[int, tuple[int, int]]]:
    """[(sign * coefficient, parameter)] of an expression's right-hand side (not a constant's)."""
    terms, j, sign = [], 0, 1
    while j < len(rhs):
        if rhs[j] in (vocab.plus, vocab.minus):
            sign, j = (1 if rhs[j] == vocab.plus else -1), j + 1
        coef = 1
        if rhs[j + 1] == vocab.times:
            coef, j = rhs[j] - vocab.entities, j + 2
        terms.append((sign * coef, (rhs[j], rhs[j + 1])))
        j += 2
    return terms


def fixed_answer(tokens: list[int], vocab: Vocab, modulus: int) -> int | None:
    """The answer's digit token when it does not depend on the constants at all (the query's value, as a linear
    form over the constants mod `modulus`, is zero: `X = A - B`, `B = A` gives 0 whatever A is), so that it is
    known without reading a single value; None otherwise."""
    found, query = statements(tokens, vocab)
    memo: dict[tuple[int, int], dict[tuple[int, int], int]] = {}

    def form(name: tuple[int, int]) -> dict[tuple[int, int], int]:
        if name not in memo:
            rhs = found[name]
            if len(rhs) == 1:
                memo[name] = {name: 1}
            else:
                total: dict[tuple[int, int], int] = {}
                for weight, ref in _terms(rhs, vocab):
                    for const, w in form(ref).items():
                        total[const] = (total.get(const, 0) + weight * w) % modulus
                memo[name] = total
        return memo[name]

    return None if any(form(query).values()) else vocab.digit(0)


def query_ops(tokens: list[int], vocab: Vocab) -> int:
    """ops(query) read back from a problem's tokens (the module docstring): the fewest operations (`+`, `-`,
    `k *`) on any path from the query down to a constant; 0 exactly for a copy chain."""
    found, query = statements(tokens, vocab)
    memo: dict[tuple[int, int], int] = {}

    def ops(name: tuple[int, int]) -> int:
        if name not in memo:
            rhs = found[name]
            if len(rhs) == 1:  # a constant
                memo[name] = 0
            else:
                signs = sum(t in (vocab.plus, vocab.minus) for t in rhs)
                coefs = sum(t == vocab.times for t in rhs)
                memo[name] = signs + coefs + min(ops(ref) for _, ref in _terms(rhs, vocab))
        return memo[name]

    return ops(query)


class Igsm(Task):
    def __init__(self, params: IgsmParams, seed: int):
        self.p, self.seed = params, seed
        self.vocab = Vocab(params)
        self.answer_choices = params.modulus
        self.facts = TaskFacts(vocab_size=self.vocab.size, seq_len=igsm_seq_len(params), causal=True)

    def _sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        if self.p.min_ops:  # ask for enough that about `count` are kept (the share kept is measured once)
            count = int(count / acceptance(_key(self.p)) * 1.05) + 1
        seqs, values = sample_problems(rng, count, self.p, self.vocab)
        return seqs, self.vocab.entities + values

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step, 0x165])
        return Batch.answer_at_end(*draw(self._sample, rng, batch_size, _SALT, want_eval=False))

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        p = self.p
        key = [0xE7A1, p.modulus, p.levels, p.level_width, p.nodes, p.max_terms, int(p.shuffle)]
        key += [p.min_ops] if p.min_ops else []  # the original eval sets stay as they were
        return {
            "": Batch.answer_at_end(*draw(self._sample, np.random.default_rng(key), examples, _SALT, want_eval=True))
        }

    def validation_sets(self, examples: int) -> dict[str, Batch]:
        """Held-out problems like the test set's, none of them a test problem (`holdout.draw_apart`)."""
        p = self.p
        taken = self.eval_sets(examples)[""].inputs.numpy()  # a problem's text fixes its answer
        key = [VALIDATION, p.modulus, p.levels, p.level_width, p.nodes, p.max_terms, int(p.shuffle), p.min_ops]
        return {"": Batch.answer_at_end(*draw_apart(self._sample, np.random.default_rng(key), examples, _SALT, taken))}

    def heuristic_floors(self, batch: Batch) -> dict[str, tuple[float, str]]:
        """Copy and guess: a question whose queried parameter is a chain of plain copies down to a constant
        (`X = Y`, `Y = 3`) is answered by copying that constant, one whose answer does not depend on the
        constants (it cancels: `X = A - B`, `B = A`) by that value (0), without any arithmetic on values; every
        other one is guessed (1 / modulus). Its expected score on the eval set; none where no question is either
        (any `min_ops >= 1`): the strategy is then plain guessing, the chance level."""
        rows = batch.inputs.tolist()
        copies = np.array([copy_chain_answer(row, self.vocab) is not None for row in rows])
        fixed = np.array([fixed_answer(row, self.vocab, self.p.modulus) is not None for row in rows]) & ~copies
        share = float(np.mean(copies | fixed))
        if share == 0:
            return {}
        score = share + (1 - share) / self.p.modulus
        strategy = (
            f"copy the constant at the end of a copy chain ({copies.mean():.1%} of the questions), answer 0 where the "
            f"constants cancel ({fixed.mean():.1%}), guess the rest"
        )
        return {"accuracy": (score, strategy), "exact_match": (score, strategy)}

    def is_eval_example(self, seqs: np.ndarray) -> np.ndarray:
        return is_eval(seqs, _SALT)

    def overlap(self, examples: int) -> dict[str, Overlap]:
        """Exact train/eval overlap (`overlap.py`): the partition key is the problem's token sequence."""
        return partition_overlap(self, examples, self.is_eval_example, "problem")


@register_task("igsm", IgsmParams)
def build(params: IgsmParams, seed: int) -> Igsm:
    return Igsm(params, seed)
