"""Shared pieces of the claims simulations (benchmarks/equivalence.py, futility.py, holm.py, skewed.py,
bimodality.py): a trials frame of cells × seeds, the data shapes studies give, and the fixed and sequential
decisions through the product's own code (`claims.evaluate`, `sequential.run_sequential`: the `take_look` the
runner calls after each wave). Synthetic metrics, no training; every simulation's RNG is seeded, so a table is
the same on every run.

Data shapes, for a metric named like an accuracy (range [0, 1], as the product knows it):

- `normal`: y = μ_cell + u_seed + e, a seed effect u ~ N(0, 0.03) shared by a seed's cells and e ~ N(0, 0.05);
- `ceiling`: accuracies near 1 on 512 examples: y = min(1, μ_cell + u_seed + N(0, 0.03)), rounded to 1/512, so
  seeds tie at 1.0;
- `bimodal`: a seed of a cell fails to chance (0.25 + N(0, 0.01)) with probability q_cell, else learns
  (0.95 + N(0, 0.03)); the cell's mean is 0.95 − 0.7·q_cell, so a difference of means is one of failure rates;
- `bimodal-rule`: the same seeds, the study declaring `failure: "eval_accuracy < 0.5"`.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy import stats

from studyrunner.analysis import claims, sequential
from studyrunner.analysis.data import StudyData, annotate
from studyrunner.study.claim_entries import ClaimEntry
from studyrunner.study.claims_grammar import parse_rule

METRIC = "eval_accuracy"
SEED_SD, NOISE_SD = 0.03, 0.05
CEILING_SD = 0.03
CHANCE, SUCCESS = 0.25, 0.95
RULE = f"{METRIC} < 0.5"
SHAPES = ("normal", "ceiling", "bimodal", "bimodal-rule")


def template(cells: int, seeds: int, metric: str = METRIC) -> pd.DataFrame:
    """A trials frame (results.trials_frame's shape, annotated) of every (cell, seed), the metric to fill."""
    cell = np.repeat(np.arange(cells), seeds)
    seed = np.tile(np.arange(seeds), cells)
    frame = pd.DataFrame(
        {
            "trial_key": [f"c{c}-s{s}" for c, s in zip(cell, seed, strict=True)],
            "cell_hash": [f"c{c}" for c in cell],
            "cell": [f"arm={c}" for c in cell],
            "seed": seed,
            "status": "succeeded",
            "model.params.arm": cell,
            "model.params.loops": 1,
            "effective_depth": 1.0,
            "baseline_of": "",
            metric: 0.0,
        }
    )
    return annotate(frame, None)


def study(frame: pd.DataFrame, cells: int, rule: str | None = None, metric: str = METRIC) -> StudyData:
    data = StudyData("sim", frame, metric=metric, cells_order=[f"c{c}" for c in range(cells)])
    if rule:
        data.failure_rule = parse_rule(rule)
    return data


def with_values(data: StudyData, y: np.ndarray, seeds: dict[str, int] | None = None) -> StudyData:
    """`data` with the metric's values (cells × max, raveled) and, with `seeds`, the first n seeds of each cell."""
    full = data.trials.assign(**{data.metric: y})
    if data.failure_rule is not None:
        full = annotate(full.drop(columns=["failed"], errors="ignore"), data.failure_rule)
    if seeds is not None:
        keep = full.seed.to_numpy() < full.cell_hash.map(seeds).to_numpy()
        full = full[keep]
    return replace(data, trials=full)


def expected_ceiling(mu: float) -> float:
    """E[min(1, X)] for X ~ N(mu, s²), s² = seed and noise variances (the rounding to 1/512 is unbiased)."""
    s = math.sqrt(SEED_SD**2 + CEILING_SD**2)
    z = (mu - 1) / s
    return float(mu - ((mu - 1) * stats.norm.cdf(z) + s * stats.norm.pdf(z)))


def ceiling_mu(target: float) -> float:
    """The μ whose clipped mean is `target` (below 1)."""
    from scipy.optimize import brentq

    return float(brentq(lambda m: expected_ceiling(m) - target, 0.0, 3.0))


def draw(shape: str, means: np.ndarray, seeds: int, rng: np.random.Generator) -> np.ndarray:
    """y[cell, seed] (raveled) for cells whose true means are `means` (for bimodal shapes: means in
    [0.25, 0.95], reached through each cell's failure probability)."""
    k = len(means)
    if shape.startswith("bimodal"):
        q = (SUCCESS - np.asarray(means)) / (SUCCESS - CHANCE)
        fail = rng.random((k, seeds)) < q[:, None]
        good = SUCCESS + rng.normal(0, 0.03, (k, seeds))
        y = np.where(fail, CHANCE + rng.normal(0, 0.01, (k, seeds)), good)
        return np.clip(y, 0.0, 1.0).ravel()
    u = rng.normal(0, SEED_SD, seeds)[None, :]
    if shape == "ceiling":
        mu = np.array([ceiling_mu(m) for m in means])[:, None]
        y = np.minimum(1.0, mu + u + rng.normal(0, CEILING_SD, (k, seeds)))
        return (np.round(y * 512) / 512).ravel()
    if shape == "normal":
        return np.clip(np.asarray(means)[:, None] + u + rng.normal(0, NOISE_SD, (k, seeds)), 0.0, 1.0).ravel()
    raise ValueError(shape)


def fixed_verdict(data: StudyData, entry: ClaimEntry, y: np.ndarray, n: int) -> str:
    """The fixed-sample verdict of `entry` on the first n seeds of every cell."""
    cells = data.cells_order
    return claims.evaluate(with_values(data, y, {c: n for c in cells}), entry).verdict


def sequential_run(data: StudyData, entry_or_entries, y: np.ndarray, design: sequential.Design, **kw):
    """The looks of a sequential study on values `y` (every seed up to max drawn up front)."""
    entries = entry_or_entries if isinstance(entry_or_entries, list) else [entry_or_entries]

    def at(counts: dict[str, int]) -> StudyData:
        return with_values(data, y, counts)

    return sequential.run_sequential(at, design, list(data.cells_order), specs=entries, **kw)


def se(rate: float, n: int) -> float:
    return math.sqrt(max(rate * (1 - rate), 0.05 * 0.95) / max(n, 1))


def markdown(rows: list[dict], columns: list[str] | None = None) -> str:
    """A Markdown table of `rows` (floats to 3 decimals)."""
    columns = columns or list(rows[0])
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        out.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in columns) + " |")
    return "\n".join(out)


def report(sims: int, out, make_rows, per: str = "row") -> int:
    """Run a benchmark's table (`make_rows()` -> rows), print it as Markdown with the Monte-Carlo standard error
    of a 5% rate and the time taken, and write `{"sims", "seconds", "rows"}` to `out` (a Path) when given."""
    started = time.perf_counter()
    rows = make_rows()
    print(markdown(rows))
    elapsed = time.perf_counter() - started
    se = math.sqrt(0.05 * 0.95 / sims)
    print(f"\n{sims} simulated studies per {per} (Monte-Carlo se of a 5% rate: {se:.4f}); {elapsed:.0f} s")
    if out:
        out.write_text(json.dumps({"sims": sims, "seconds": round(elapsed), "rows": rows}, indent=1))
    return 0
