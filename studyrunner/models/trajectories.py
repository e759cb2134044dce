"""Trajectories through loop time (LoopFormer, seed 004): schedules, shortcut samplers, budgets.

A trajectory is a list of step sizes Δ_1..Δ_M that sum to 1; loop step i runs at start time
t_{i-1} = Δ_1 + ... + Δ_{i-1} with step size Δ_i. A budget M is a trajectory of M steps.

Schedules (`train.trajectory`, `eval.trajectory` in a study file), as a value:
- "uniform": Δ_i = 1/M, the paper's inference default and its teacher (max) trajectory;
- "front_loaded": Δ_i ∝ M - i + 1, large steps first (the paper's §4.4 finding: the best schedules
  take larger steps early and finer ones late; its own are found by enumeration, not a formula);
- "back_loaded": Δ_i ∝ i, the mirror image;
- {"geometric": r}: Δ_i ∝ r^(i-1) (r < 1 front-loaded, r > 1 back-loaded, r = 1 uniform);
- a list of step sizes: used as written (it has its own length);
- "enumerate_all" (evaluation only): every trajectory of M steps on the 1/L training grid, i.e. each
  composition of L into M positive parts divided by L (C(L-1, M-1) of them: 35 for L = 8, M = 4).
Only "uniform" and "enumerate_all" come from the paper; the others are this platform's axis values.

Shortcut samplers (the short trajectory of a training step, `shortcut_sampler`): the length S is
uniform in 1..L-1 (the paper's U{1..L-1}), then the step sizes are drawn by
- "grid_sequential" (the family's default): the official code's `sample_short_trajectory`: each step
  in turn uniform over the multiples of 1/L that leave room for the remaining steps, the last step
  filling to 1. Not uniform over compositions: it favours long first steps (L = 8, S = 4: the first
  step is 1..5 eighths with probability 1/5 each, so P(5,1,1,1) = 1/5 and P(first >= 4/8) = 2/5);
- "grid_composition": uniformly over the compositions of L into S parts, so every step is a multiple
  of 1/L (the notes' reading of the paper's "uniform discrete step schedule"; P(5,1,1,1) = 1/35,
  P(first >= 4/8) = 4/35 at L = 8, S = 4);
- "dirichlet": continuous, Dirichlet(1, ..., 1), i.e. uniform on the simplex (off the grid).
All draws use torch's global CPU generator, which trial checkpoints capture and restore.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

NAMED = ("uniform", "front_loaded", "back_loaded")
ENUMERATE_ALL = "enumerate_all"
SAMPLERS = ("grid_sequential", "grid_composition", "dirichlet")  # the first is loopformer's default
SUM_TOLERANCE = 1e-6


def parse_spec(value: Any, *, evaluation: bool) -> Any:
    """A schedule value from a study file, checked and in canonical form (a name, {'geometric': r}
    or a list of floats); ValueError with a one-line reason otherwise."""
    names = NAMED + ((ENUMERATE_ALL,) if evaluation else ())
    if isinstance(value, str):
        if value not in names:
            extra = "" if evaluation else f" ({ENUMERATE_ALL!r} is for eval.trajectory only)"
            hint = extra if value == ENUMERATE_ALL else ""
            raise ValueError(
                f"unknown schedule {value!r}{hint}; use one of {', '.join(names)}, {{geometric: RATIO}} "
                "or a list of step sizes summing to 1"
            )
        return value
    if isinstance(value, dict):
        if set(value) != {"geometric"}:
            raise ValueError(f"a schedule mapping takes exactly one key, 'geometric' (its ratio); got {sorted(value)}")
        ratio = value["geometric"]
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not math.isfinite(ratio) or ratio <= 0:
            raise ValueError(f"geometric ratio must be a positive finite number, got {ratio!r}")
        return {"geometric": float(ratio)}
    if isinstance(value, list):
        if not value:
            raise ValueError("a list of step sizes needs at least one step")
        steps = []
        for i, step in enumerate(value):
            if isinstance(step, bool) or not isinstance(step, int | float) or not math.isfinite(step):
                raise ValueError(f"step {i} is {step!r}; step sizes are positive numbers")
            if step <= 0:
                raise ValueError(f"step {i} is {step}; every step size must be positive")
            steps.append(float(step))
        total = math.fsum(steps)
        if abs(total - 1.0) > SUM_TOLERANCE:
            raise ValueError(f"step sizes must sum to 1, they sum to {total:.6g}")
        return steps
    raise ValueError(f"a schedule is a name, {{geometric: RATIO}} or a list of step sizes, got {value!r}")


def schedule(spec: Any, m: int) -> list[float]:
    """The M-step trajectory of a schedule (not "enumerate_all"); a list must have M steps."""
    if m < 1:
        raise ValueError(f"a trajectory needs at least one step, got {m}")
    if isinstance(spec, list):
        if len(spec) != m:
            raise ValueError(f"the schedule lists {len(spec)} steps, not {m}")
        return [float(s) for s in spec]
    if spec == "uniform":
        weights = [1.0] * m
    elif spec == "front_loaded":
        weights = [float(m - i) for i in range(m)]
    elif spec == "back_loaded":
        weights = [float(i + 1) for i in range(m)]
    elif isinstance(spec, dict) and "geometric" in spec:
        weights = [spec["geometric"] ** i for i in range(m)]
    else:
        raise ValueError(f"no {m}-step trajectory for schedule {spec!r}")
    total = math.fsum(weights)
    return [w / total for w in weights]


def schedule_length(spec: Any, default: int) -> int:
    """Steps of a schedule: a list has its own length, a named schedule takes `default`."""
    return len(spec) if isinstance(spec, list) else default


def start_times(steps: Sequence[float]) -> list[float]:
    """t_{i-1} for each step: the time fed to step i is its start time (t = 1 is never an input)."""
    times, t = [], 0.0
    for step in steps:
        times.append(t)
        t += step
    return times


def grid_compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every composition of `total` into `parts` positive integers, in lexicographic order."""
    if not 1 <= parts <= total:
        return
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


def grid_trajectories(grid: int, m: int) -> list[list[float]]:
    """Every M-step trajectory on the 1/grid lattice ("enumerate_all")."""
    return [[c / grid for c in parts] for parts in grid_compositions(grid, m)]


def grid_label(steps: Sequence[float], grid: int) -> str:
    """'4_2_1_1' for (4/8, 2/8, 1/8, 1/8) on the 1/8 grid: the step sizes in grid units."""
    return "_".join(str(round(s * grid)) for s in steps)


def front_loading(steps: Sequence[float]) -> float:
    """How much of the trajectory's time is spent in its first steps: sum_i Δ_i (M - i) / (M - 1),
    1 when the first step takes everything, 0 when the last does, 0.5 for uniform (and for M = 1)."""
    m = len(steps)
    if m == 1:
        return 0.5
    return math.fsum(s * (m - 1 - i) / (m - 1) for i, s in enumerate(steps))


def _randint(low: int, high: int) -> int:
    """Uniform in [low, high] from torch's global CPU generator."""
    return int(torch.randint(low, high + 1, (1,)).item())


def sample_shortcut(sampler: str, grid: int, max_steps: int) -> list[float]:
    """A short trajectory: length S uniform in 1..max_steps, step sizes drawn by `sampler` on the
    1/grid lattice (or the simplex, for "dirichlet"). Sums to 1 (exactly, on the grid)."""
    if max_steps < 1 or max_steps > grid:
        raise ValueError(f"a shortcut needs 1 <= max_steps <= grid, got {max_steps} and {grid}")
    return sample_steps(sampler, grid, _randint(1, max_steps))


def sample_steps(sampler: str, grid: int, s: int) -> list[float]:
    """The step sizes of an S-step short trajectory drawn by `sampler` (its length already drawn)."""
    if not 1 <= s <= grid:
        raise ValueError(f"a shortcut of {s} steps does not fit the 1/{grid} grid")
    if sampler == "grid_composition":  # uniform over the C(grid-1, s-1) compositions: random cut points
        cuts = sorted(torch.randperm(grid - 1)[: s - 1].add(1).tolist())
        bounds = [0, *cuts, grid]
        return [(b - a) / grid for a, b in itertools.pairwise(bounds)]
    if sampler == "grid_sequential":  # the official code's: each step capped so the rest can take 1/grid
        units, left = [], grid
        for remaining in range(s, 1, -1):
            unit = _randint(1, left - (remaining - 1))
            units.append(unit)
            left -= unit
        units.append(left)
        return [u / grid for u in units]
    if sampler == "dirichlet":
        draws = -torch.rand(s, dtype=torch.float64).clamp_min(1e-300).log()  # Exp(1) draws
        steps = (draws / draws.sum()).tolist()
        steps[-1] = 1.0 - math.fsum(steps[:-1])  # exact sum, whatever the rounding
        return steps
    raise ValueError(f"unknown shortcut sampler {sampler!r}; use one of {', '.join(SAMPLERS)}")
