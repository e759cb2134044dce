"""The analysis layer's intervals and verdicts at the seed counts studies run, by simulation.

    python -m benchmarks.coverage [--sims 400] [--seed 0] [--designs 2x2,3x5] [--shapes normal,bimodal]

Synthetic studies with a known truth, no training: a cell per depth D (loops = D), or two cells at the top
depth (`+`: the quickstart's 1⊗4 and 4⊗1 beside 1⊗1), `seeds` seeds per cell, seed effects shared by a
seed's cells (the same seed is the same initialisation and data stream in every cell). Data shapes:

- `normal`: y = 0.3 + a·ln D + u_seed + e, u ~ N(0, 0.03), e ~ N(0, 0.04·(1 + ln D / ln D_max)).
- `bimodal`: each trial fails to chance (y = 0.25 + N(0, 0.02)) with probability 0.3, else learns
  (y = 0.6 + a·ln D + u_seed + N(0, 0.04)); the study declares `failure: "y < 0.4"`.
- `bimodal-norule`: the same seeds, no failure rule (verify sees the modes from 3 seeds a cell).
- `ceiling`: accuracies near 1 on 512 examples: y = min(1, 0.96 + a·ln D + u_seed + N(0, 0.03)), rounded
  to 1/512, so seeds tie at 1.0.

Under the null (a = 0) every claim's supported rate (and contradicted rate) is its false-positive rate, at
most 0.05 by design (one-sided 0.05); `mean > c` and `iqm > c` are checked against their true values (the
null's boundary), failure rates with equal true rates. Coverage is the share of simulations whose shown
interval holds the true value (of the null: 0; of the effect: the true slope or difference, for the
normal and ceiling shapes), among those that show one; `undecidable` is the share that show none (no test
holds there: a mean or IQM against a number on bimodal seeds). The nominal level of the shown interval is
90% (the two one-sided 95% bounds the verdict uses); older versions showed 95%.

`table()` runs each claim through `claims.evaluate` only, so the same script measures an older version:
PYTHONPATH=<checkout of the old commit> python benchmarks/coverage.py prints its `before` figures.
tests/test_analysis_coverage.py asserts the false-positive rates and coverage of a subset.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from studyrunner.analysis import claims
from studyrunner.analysis.data import from_frame

SLOPE, BETA, SEED_SD, NOISE_SD = 0.05, 0.3, 0.03, 0.04
FAIL_P, CHANCE = 0.3, 0.25
EFFECT = {"normal": 0.05, "bimodal": 0.05, "bimodal-norule": 0.05, "ceiling": 0.01}
SHAPES = tuple(EFFECT)
RULE = {"bimodal": "y < 0.4"}


@dataclass(frozen=True)
class Design:
    depths: tuple[int, ...]
    seeds: int
    split_top: bool = False  # two cells at the top depth (loops x block = D x 1 and 1 x D)


DESIGNS = {
    "2x2": Design((1, 4), 2),
    "2x3": Design((1, 4), 3),
    "3x3": Design((1, 2, 4), 3),
    "2x5": Design((1, 4), 5),
    "3x5": Design((1, 2, 4), 5),
    "5x5": Design((1, 2, 4, 8, 16), 5),
    "2+x2": Design((1, 4), 2, True),
    "2+x3": Design((1, 4), 3, True),
    "2+x5": Design((1, 4), 5, True),
}


def _cells(design: Design) -> list[tuple[int, int]]:
    """(loops, block_layers) per cell."""
    cells = [(d, 1) for d in design.depths]
    return cells + [(1, design.depths[-1])] if design.split_top else cells


def _values(shape: str, depth: np.ndarray, seed_effect: np.ndarray, a: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """(y, failed-to-chance) for trials at `depth` with their seeds' effects."""
    n = len(depth)
    lnd = np.log(depth)
    if shape == "normal":
        top = max(np.log(16.0), lnd.max()) if lnd.max() > 0 else 1.0
        sd = NOISE_SD * (1 + lnd / top)
        return BETA + a * lnd + seed_effect + rng.normal(0, 1, n) * sd, np.zeros(n, bool)
    if shape.startswith("bimodal"):
        fail = rng.random(n) < FAIL_P
        learned = 0.6 + a * lnd + seed_effect + rng.normal(0, NOISE_SD, n)
        return np.where(fail, CHANCE + rng.normal(0, 0.02, n), learned), fail
    y = np.minimum(1.0, 0.96 + a * lnd + seed_effect + rng.normal(0, 0.03, n))
    return np.round(y * 512) / 512, np.zeros(n, bool)


def sample(depths, seeds: int, rng: np.random.Generator, shape: str = "normal", a: float = SLOPE, split_top=False,
           disjoint: bool = False) -> pd.DataFrame:  # fmt: skip
    """One simulated study in `results.trials_frame`'s shape; `disjoint`: each cell its own seeds."""
    cells = _cells(Design(tuple(depths), seeds, split_top))
    loops = np.repeat([c[0] for c in cells], seeds)
    block = np.repeat([c[1] for c in cells], seeds)
    s = np.tile(np.arange(seeds), len(cells))
    if disjoint:
        s = s + seeds * np.repeat(np.arange(len(cells)), seeds)
    d = (loops * block).astype(float)
    u = rng.normal(0, SEED_SD, s.max() + 1)[s]
    y, _ = _values(shape, d, u, a, rng)
    return pd.DataFrame(
        {
            "trial_key": [f"L{a_}B{b}-s{c}" for a_, b, c in zip(loops, block, s, strict=True)],
            "cell_hash": [f"L{a_}B{b}" for a_, b in zip(loops, block, strict=True)],
            "cell": [f"loops={a_} block_layers={b}" for a_, b in zip(loops, block, strict=True)],
            "seed": s,
            "status": "succeeded",
            "model.params.block_layers": block,
            "model.params.loops": loops,
            "model.params.width": np.where(d == max(depths), 2, 1),  # selects both top cells of a `+` design
            "effective_depth": d,
            "baseline": "",
            "baseline_of": "",
            "y": y,
        }
    )


def truths(design: Design, shape: str, a: float, draws: int = 400_000) -> dict[str, float]:
    """True values by a large simulation (exact for the linear shapes): mean and IQM per depth, the
    slope of the mean over the design's points, failure rates."""
    rng = np.random.default_rng(12345)
    out = {}
    pts_x, pts_y = [], []
    for loops, block in _cells(design):
        depth = np.full(draws, float(loops * block))
        y, _ = _values(shape, depth, rng.normal(0, SEED_SD, draws), a, rng)
        out[f"mean {loops}x{block}"], out[f"iqm {loops}x{block}"] = float(y.mean()), _iqm(y)
        pts_x.append(math.log(loops * block))
        pts_y.append(float(y.mean()))
    out["slope"] = float(np.polyfit(pts_x, pts_y, 1)[0])
    return out


def _iqm(y: np.ndarray) -> float:
    lo, hi = np.quantile(y, [0.25, 0.75])
    return float(y[(y >= lo) & (y <= hi)].mean())


def _claims(design: Design, shape: str, t: dict) -> list[tuple[str, str, float, str]]:
    """(name, claim, true value of lhs − rhs, frame) per claim kind; frame: "shared" or "disjoint" seeds."""
    top, bottom = design.depths[-1], design.depths[0]
    top_cell = f"y[loops={top}, block_layers=1]"
    bottom_cell = f"y[loops={bottom}, block_layers=1]"
    diff = t[f"mean {top}x1"] - t[f"mean {bottom}x1"]
    out = [
        ("slope > 0", "slope(y ~ ln effective_depth) > 0", t["slope"], "shared"),
        ("paired mean", f"{top_cell} > {bottom_cell}", diff, "shared"),
        ("paired IQM", f"iqm(y){top_cell[1:]} > iqm(y){bottom_cell[1:]}", math.nan, "shared"),
        ("mean > truth", f"{bottom_cell} > {t[f'mean {bottom}x1']:.6f}", 0.0, "shared"),
        ("IQM > truth", f"iqm(y){bottom_cell[1:]} > {t[f'iqm {bottom}x1']:.6f}", 0.0, "shared"),
        ("Welch (disjoint seeds)", f"{top_cell} > {bottom_cell}", diff, "disjoint"),
    ]
    if design.split_top:
        both = (t[f"mean {top}x1"] + t[f"mean 1x{top}"]) / 2 - t[f"mean {bottom}x1"]
        out.append(("cells a side", f"y[width=2] > {bottom_cell}", both, "shared"))
    if shape == "bimodal":
        out.append(("failure rates", f"failure_rate[loops={top}, block_layers=1] < failure_rate[loops={bottom}]",
                    0.0, "shared"))  # fmt: skip
        out.append(("failure rate < truth", f"failure_rate[loops={bottom}] < {FAIL_P}", 0.0, "shared"))
    return out


def _holds(lo, hi, truth) -> bool | None:
    """Whether [lo, hi] holds truth (the odds-ratio scale's null, 1, for Fisher's interval); None: none shown."""
    if lo is None or hi is None or np.isnan(lo) or np.isnan(hi):
        return None
    return bool(lo <= truth <= hi)


def simulate(name: str, shape: str, sims: int, null: bool = True, seed: int = 0) -> dict[str, dict[str, float]]:
    """{claim kind: {supported, contradicted, coverage, undecidable, n}} for one design and data shape;
    `null`: no effect (a = 0), else the shape's effect."""
    design = DESIGNS[name]
    a = 0.0 if null else EFFECT[shape]
    t = truths(design, shape, a)
    kinds = _claims(design, shape, t)
    rng = np.random.default_rng([seed, len(design.depths), design.seeds, int(design.split_top), SHAPES.index(shape)])
    tally: dict[str, dict[str, list]] = {k[0]: {"verdict": [], "holds": []} for k in kinds}
    rule = RULE.get(shape)
    for _ in range(sims):
        frames = {}
        for which in ("shared", "disjoint"):
            frame = sample(design.depths, design.seeds, rng, shape, a, design.split_top, which == "disjoint")
            frames[which] = from_frame(frame, metric="y", failure=rule)
        for kind, text, truth, which in kinds:
            v = claims.evaluate(frames[which], text)
            tally[kind]["verdict"].append(v.verdict)
            null_value = 1.0 if getattr(v, "scale", "") == "odds ratio" else 0.0
            target = null_value if null else truth
            if not null and kind.startswith("failure"):
                target = math.nan
            if np.isfinite(target):
                tally[kind]["holds"].append(_holds(v.lo, v.hi, target))
    out = {}
    for kind, got in tally.items():
        verdicts = np.array(got["verdict"])
        shown = [h for h in got["holds"] if h is not None]
        out[kind] = {
            "supported": float(np.mean(verdicts == "supported")),
            "contradicted": float(np.mean(verdicts == "contradicted")),
            "coverage": float(np.mean(shown)) if shown else math.nan,
            "undecidable": 1 - len(shown) / len(got["holds"]) if got["holds"] else math.nan,
            "n": len(verdicts),
        }
    return out


def table(sims: int, designs=None, shapes=None, seed: int = 0) -> pd.DataFrame:
    rows = []
    for name in designs or DESIGNS:
        for shape in shapes or SHAPES:
            for null in (True, False):
                print(f"{name} {shape} {'null' if null else 'effect'}", file=sys.stderr, flush=True)
                for kind, r in simulate(name, shape, sims, null, seed).items():
                    rows.append({"design": name, "shape": shape, "truth": "null" if null else "effect",
                                 "claim": kind, **r})  # fmt: skip
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sims", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--designs", default=",".join(DESIGNS))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--csv", help="also write the table here")
    args = parser.parse_args(argv)
    out = table(args.sims, args.designs.split(","), args.shapes.split(","), args.seed)
    if args.csv:
        out.to_csv(args.csv, index=False)
    options = ("display.width", 250, "display.max_rows", 1000, "display.float_format", "{:.3f}".format)
    with pd.option_context(*options):
        level = "90%" if hasattr(claims, "ALPHA") and claims.ALPHA == 0.05 else "95%"
        print(f"{args.sims} simulations per design, shape and truth; shown intervals nominally {level}")
        print(out.drop(columns="n").to_string(index=False))


if __name__ == "__main__":
    sys.exit(main())
