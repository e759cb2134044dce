"""Coverage of the analysis layer's intervals at the seed counts studies run (issue 14), by simulation.

    python -m benchmarks.coverage [--sims 400] [--seed 0]

Known truth: y = β + α·ln D + u_seed + e, with α = 0.05, β = 0.3, a seed effect u ~ N(0, 0.03) shared by a
seed's cells (the same seed is the same initialisation and data stream in every cell), and noise
e ~ N(0, 0.04·(1 + ln D / ln D_max)) that grows with depth. Designs: depths × seeds = 2×2, 3×2, 3×5, 5×5
(depths 1, 4 / 1, 2, 4 / 1, 2, 4, 8, 16). For each interval, the fraction of simulations whose 95% interval
holds the true value; for a claim, the fraction whose interval of lhs − rhs holds the true difference (a
claim's verdict is wrong only when that interval misses). `before` is the method the analysis layer used
until issue 14; `after` is the default now. tests/test_analysis_coverage.py asserts the `after` column.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd
from scipy import stats as sps

from studyrunner.analysis import claims, fits, stats
from studyrunner.analysis.data import from_frame

ALPHA, BETA, SEED_SD, NOISE_SD = 0.05, 0.3, 0.03, 0.04
DESIGNS = {"2x2": ([1, 4], 2), "3x2": ([1, 2, 4], 2), "3x5": ([1, 2, 4], 5), "5x5": ([1, 2, 4, 8, 16], 5)}
LEVEL = 0.93  # the floor for a nominal 95% interval over 400 simulations


def sample(depths, seeds: int, rng: np.random.Generator) -> pd.DataFrame:
    """One simulated study in `results.trials_frame`'s shape: a cell per depth (loops = D), `seeds` seeds."""
    d = np.repeat(np.asarray(depths, dtype=float), seeds)
    s = np.tile(np.arange(seeds), len(depths))
    sd = NOISE_SD * (1 + np.log(d) / np.log(max(depths)))
    y = BETA + ALPHA * np.log(d) + rng.normal(0, SEED_SD, seeds)[s] + rng.normal(0, 1, len(d)) * sd
    return pd.DataFrame(
        {
            "trial_key": [f"D{int(a)}-s{b}" for a, b in zip(d, s, strict=True)],
            "cell_hash": [f"D{int(a)}" for a in d],
            "cell": [f"loops={int(a)}" for a in d],
            "seed": s,
            "status": "succeeded",
            "model.params.block_layers": 1,
            "model.params.loops": d.astype(int),
            "effective_depth": d,
            "baseline": "",
            "baseline_of": "",
            "y": y,
        }
    )


def _holds(lo: float, hi: float, truth: float) -> bool:
    return bool(np.isfinite(lo) and np.isfinite(hi) and lo <= truth <= hi)


def _old_bca(x) -> tuple[float, float]:
    """The per-cell BCa interval as it was shown before (from 3 seeds)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 3 or np.ptp(x) == 0:
        return math.nan, math.nan
    ci = sps.bootstrap((x,), np.mean, method="BCa", n_resamples=2000, rng=np.random.default_rng(0))
    return ci.confidence_interval.low, ci.confidence_interval.high


def _old_paired_boot(d) -> tuple[float, float]:
    """The paired bootstrap interval as it was shown before: BCa from 3 distinct differences, else percentile."""
    return _old_bca(d) if len(d) >= 3 and np.ptp(d) > 0 else stats.stratified_bootstrap([d], np.mean)


def simulate(design: str, sims: int, seed: int = 0, before: bool = True, claims_too: bool = True) -> dict:
    """Coverage of every interval in one design: {interval name: {"before": rate, "after": rate}}."""
    depths, seeds = DESIGNS[design]
    rng = np.random.default_rng([seed, len(depths), seeds])
    top = max(depths)
    true_cell = {d: BETA + ALPHA * math.log(d) for d in depths}
    true_diff = ALPHA * math.log(top)
    slope_claim = "slope(y ~ ln effective_depth) > 0"
    pair_claim = f"y[loops={top}] > y[loops=1]"
    iqm_claim = "iqm(y)[loops=1] > 0"
    hits: dict[str, dict[str, list[bool]]] = {}

    def record(name: str, when: str, ok: bool) -> None:
        hits.setdefault(name, {}).setdefault(when, []).append(ok)

    for _ in range(sims):
        frame = sample(depths, seeds, rng)
        f = fits.fit(frame.effective_depth, frame.y, clusters=frame.seed, extrapolate=False)
        record("fit slope α", "after", _holds(*f.param_ci["alpha"], ALPHA))
        one = frame[frame.effective_depth == 1].y.to_numpy()
        record("cell mean (t)", "after", _holds(*stats.t_interval(one), true_cell[1]))
        record("cell mean (t)", "before", _holds(*stats.t_interval(one), true_cell[1]))
        record("cell IQM", "after", _holds(*stats.yuen_interval(one), true_cell[1]))
        d = frame[frame.effective_depth == top].y.to_numpy() - one
        record("paired difference", "after", _holds(*stats.t_interval(d), true_diff))
        if before:
            b = fits.fit(
                frame.effective_depth,
                frame.y,
                strata=frame.effective_depth,
                ci="bootstrap",
                n_boot=200,
                extrapolate=False,
            )
            record("fit slope α", "before", _holds(*b.param_ci["alpha"], ALPHA))
            record("cell IQM", "before", _holds(*stats.stratified_bootstrap([one], stats.iqm), true_cell[1]))
            record("paired difference", "before", _holds(*_old_paired_boot(d), true_diff))
            if seeds >= 3:  # BCa was not shown below 3 seeds
                record("cell mean (BCa, shown before)", "before", _holds(*_old_bca(one), true_cell[1]))
        if claims_too:
            data = from_frame(frame, metric="y")
            for name, claim, truth in (
                ("claim: slope > 0", slope_claim, ALPHA),
                ("claim: deepest > shallowest", pair_claim, true_diff),
                ("claim: IQM > 0", iqm_claim, true_cell[1]),
            ):
                v = claims.evaluate(data, claim)
                record(name, "after", _holds(v.lo, v.hi, truth))
    return {name: {when: float(np.mean(v)) for when, v in by.items()} for name, by in hits.items()}


def table(sims: int, seed: int = 0, before: bool = True) -> pd.DataFrame:
    rows = []
    for design in DESIGNS:
        for name, rates in simulate(design, sims, seed, before).items():
            rows.append({"design": design, "interval": name, **rates})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sims", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = table(args.sims, args.seed)
    wide = out.pivot_table(index="interval", columns="design", values=["before", "after"], sort=False)
    options = ("display.width", 250, "display.max_columns", 20, "display.float_format", "{:.3f}".format)
    with pd.option_context(*options):
        print(f"coverage of nominal 95% intervals, {args.sims} simulations per design (floor {LEVEL})")
        print(wide.swaplevel(axis=1).sort_index(axis=1, level=0, sort_remaining=False))


if __name__ == "__main__":
    main()
