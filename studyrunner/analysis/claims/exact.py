"""Exact randomisation tests, and the intervals that invert them under a shift, for seeds whose values no
t-test describes: bimodal cells (seeds that fail to chance or succeed), cells the failure rule splits, and
values tied at a bound (accuracies at 1.0).

Each test enumerates a group of rearrangements of the data that leave it equally likely when there is no
effect (Fisher's randomisation principle; Good, "Permutation, Parametric and Bootstrap Tests of
Hypotheses", 2005; Pesarin & Salmaso 2010):

- `sign_flip`: paired values (per-seed differences over shared seeds): the 2^n sign flips; exact when the
  differences are symmetric about 0, which holds when the two sides' seeds are exchangeable.
- `two_sample`: disjoint seeds: the C(na + nb, na) ways to split the pooled values.
- `slope`: a slope over shared seeds: every permutation of each seed's values across its x values (exact
  when x has no effect within a seed); unrestricted permutations when no seed repeats.

The statistic is linear (mean difference, least-squares slope), so under the shift model (the effect δ
added to one side, or the slope b times x) every rearrangement g compares with the observed statistic as
c_g + e_g·δ >= 0 with e_g >= 0: the one-sided p-values are step functions of δ with thresholds −c_g/e_g,
and the one-sided (1 − alpha) bounds are order statistics of those thresholds. So the bound lies above 0
exactly when the one-sided p at 0 is below alpha: interval and verdict always agree.

Groups up to MAX_EXACT elements are enumerated; larger ones are sampled (MC_DRAWS, a fixed seed, the
observed arrangement counted once: p = (1 + b) / (1 + m), valid; Phipson & Smyth 2010). Small n cannot
reach small p: the smallest p is 1 / |group| (0.25 for two paired seeds, 1/16 for four).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

MAX_EXACT = 100_000
MC_DRAWS = 20_000
SEED = 0
_TOL = 1e-12


@dataclass
class Randomisation:
    estimate: float  # the observed statistic (mean difference, slope)
    lo: float
    hi: float
    p_up: float  # one-sided p of "greater than the null value"
    p_down: float
    size: int  # arrangements counted (the group, or the draws + 1)
    exact: bool  # enumerated (True) or sampled
    method: str

    @property
    def smallest_p(self) -> float:
        return 1.0 / self.size


def _result(c: np.ndarray, e: np.ndarray, estimate: float, null: float, alpha: float, exact: bool, method: str):
    """Bounds and p-values from the rearrangements' (c_g, e_g) (the observed one included)."""
    size = len(c)
    # a rearrangement that only swaps equal values (accuracies tied at 1.0) ties with the observed one:
    # c is 0 up to float noise, and noise must not decide whether it counts
    scale = max(float(np.max(np.abs(c))) if size else 0.0, 1e-300)
    c = np.where(np.abs(c) <= _TOL * scale, 0.0, c)
    moves = e > _TOL
    thresholds = np.sort(-c[moves] / e[moves])
    const_up = int(np.sum(~moves & (c >= 0)))
    const_down = int(np.sum(~moves & (c <= 0)))
    p_up = (const_up + np.searchsorted(thresholds, null, side="right")) / size
    p_down = (const_down + len(thresholds) - np.searchsorted(thresholds, null, side="left")) / size
    k_up = math.ceil(alpha * size - const_up)  # p_up(δ) < alpha  <=>  δ < thresholds[k_up - 1]
    lo = float(thresholds[k_up - 1]) if 1 <= k_up <= len(thresholds) else -math.inf
    k_down = math.ceil(alpha * size - const_down)  # p_down(δ) < alpha  <=>  δ > the k_down-th largest
    hi = float(thresholds[len(thresholds) - k_down]) if 1 <= k_down <= len(thresholds) else math.inf
    return Randomisation(estimate, lo, hi, float(p_up), float(p_down), size, exact, method)


def sign_flip(d, alpha: float, null: float = 0.0) -> Randomisation | None:
    """The sign-flip test of the mean of paired differences `d` against `null`, with its shift interval."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    n = len(d)
    if n < 1:
        return None
    if 2**n <= MAX_EXACT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        exact = True
    else:
        rng = np.random.default_rng(SEED)
        signs = np.vstack([np.ones(n), rng.choice((1.0, -1.0), size=(MC_DRAWS, n))])
        exact = False
    mean = float(d.mean())
    c = (signs - 1.0) @ d / n  # T_s(δ) − T_obs(δ) = c_s + e_s·δ (a flipped 0 adds exactly 0)
    e = (1.0 - signs).mean(axis=1)
    how = "exact" if exact else f"{MC_DRAWS} random"
    return _result(c, e, mean, null, alpha, exact, f"sign-flip test over {n} seeds ({how} sign flips)")


def two_sample(a, b, alpha: float, null: float = 0.0) -> Randomisation | None:
    """The two-sample permutation test of mean(a) − mean(b) against `null`, with its shift interval."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    na, nb = len(a), len(b)
    if not na or not nb:
        return None
    pooled = np.concatenate([a, b])
    n = na + nb
    if math.comb(n, na) <= MAX_EXACT:
        member = np.zeros((math.comb(n, na), n), dtype=bool)
        for i, chosen in enumerate(itertools.combinations(range(n), na)):
            member[i, list(chosen)] = True
        exact = True
    else:
        rng = np.random.default_rng(SEED)
        order = np.argsort(rng.random((MC_DRAWS, n)), axis=1)[:, :na]
        member = np.zeros((MC_DRAWS + 1, n), dtype=bool)
        member[0, :na] = True
        np.put_along_axis(member[1:], order, True, axis=1)
        exact = False
    observed = float(a.mean() - b.mean())
    k = member[:, :na].sum(axis=1)  # originals of a kept on the a side
    moved = member.astype(float) - np.r_[np.ones(na), np.zeros(nb)]  # +1 into a, −1 out of a
    c = (moved @ pooled) * (1 / na + 1 / nb)  # T_S − T_obs at δ = 0: swapping equal values adds 0
    e = 1.0 - k / na + (na - k) / nb
    how = "exact" if exact else f"{MC_DRAWS} random"
    return _result(c, e, observed, null, alpha, exact, f"permutation test, {na} vs {nb} seeds ({how} splits)")


def slope(x, y, seeds, alpha: float, null: float = 0.0) -> Randomisation | None:
    """The least-squares slope of y on x against `null`, by permuting each seed's values across its x
    values (every value of a seed that appears once may go anywhere: unrestricted when no seed repeats)."""
    x, y, seeds = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(seeds)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y, seeds = x[ok], y[ok], seeds[ok]
    sxx = float(np.sum((x - x.mean()) ** 2))
    if len(x) < 2 or sxx <= 0:
        return None
    w = (x - x.mean()) / sxx
    labels, counts = np.unique(seeds, return_counts=True)
    blocks = [np.flatnonzero(seeds == s) for s in labels] if counts.max() > 1 else [np.arange(len(x))]
    size = math.prod(math.factorial(len(b)) for b in blocks)
    if size <= MAX_EXACT:
        per_block = [list(itertools.permutations(b)) for b in blocks]
        perms = np.empty((size, len(x)), dtype=int)
        for i, combo in enumerate(itertools.product(*per_block)):
            for block, chosen in zip(blocks, combo, strict=True):
                perms[i, block] = chosen
        exact = True
    else:
        rng = np.random.default_rng(SEED)
        perms = np.tile(np.arange(len(x)), (MC_DRAWS + 1, 1))
        for block in blocks:
            shuffled = np.argsort(rng.random((MC_DRAWS, len(block))), axis=1)
            perms[1:, block] = block[shuffled]
        exact = False
    observed = float(w @ y)
    c = (y[perms] - y) @ w  # T_π(b) − T_obs(b) = c_π + (1 − r_π)·b; swapping equal values adds 0
    e = (x - x[perms]) @ w
    how = "exact" if exact else f"{MC_DRAWS} random"
    within = "within each of" if len(blocks) > 1 else "over"
    method = f"permutation test of the slope {within} {len(blocks)} seeds ({how})"
    return _result(c, e, observed, null, alpha, exact, method)


def smallest_p_sign_flip(n: int) -> float:
    return 0.5**n if n else 1.0


def smallest_p_two_sample(na: int, nb: int) -> float:
    return 1.0 / math.comb(na + nb, na) if na and nb else 1.0
