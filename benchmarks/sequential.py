"""Sequential seeds by simulation: the false-positive rate under the looks, power and expected seeds.

    python -m benchmarks sequential [--sims 2000] [--seed 0] [--out PATH]

Synthetic studies, no training: each simulated study draws a metric for every (cell, seed) up front, and the
looks see the seeds a real run would have recorded by then. The decisions are `analysis.sequential.run_sequential`
(the same `take_look` the runner calls after each wave), so what is measured is what `submit` does.

Data shapes (metric y of a cell's seed, named `eval_accuracy` and clipped to [0, 1], as an accuracy is: the claims
see the range the product knows for accuracies, `analysis.claims.bounded`):
- normal: y = μ_cell + u_seed + e, a seed effect u ~ N(0, 0.03) shared by the seed's cells (the same seed is the
  same initialisation and data stream) and e ~ N(0, 0.05);
- heavy: as normal, with e = 0.05 · t₃ / √3 (heavy tails, the same sd);
- bimodal: a seed fails to chance (0.25 + N(0, 0.01)) with probability 0.3, else succeeds (0.95 + N(0, 0.03)):
  seeds that fail or succeed, as in Sudoku and halting studies.

Designs: cells × start → max (step 1, so a look after every seed), each with its claims:
- 2 cells, 2 → 8: "y[arm=1] > y[arm=0]" (paired t over shared seeds);
- 3 cells, 3 → 12: "y[arm=2] > y[arm=0]" and "y[arm=1] > y[arm=0]";
- 5 cells, 2 → 10: "y[arm=k] > y[arm=0]" for k = 1..4 (four claims);
- 4 cells, 3 → 12, step 2: "y[arm=3] > y[arm=0]" and "y[arm=3] > c" (c: the cell's mean under the null);
- 2 cells, 2 → 8 again, the claim declaring `min_effect: δ` (futility from the seeds its test needs at δ).

Under the null (every μ_cell equal; the number claim's threshold at the true mean of its cell) the table gives the
share of claims called **supported** (false positives; the design's level is one-sided 0.05) and contradicted.
Under a moderate effect (normal and heavy: arm k above arm 0 by δ·k/(K−1), δ chosen so the fixed design at `max`
has about 80% power on normal data; bimodal: the failure probability falls from 0.3 in arm 0 to 0 in the last
arm), the share supported (power) and the mean seeds per cell, beside the fixed design that runs `max` seeds and
decides once (`Design(max, max)`: the same code, one look at information 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from studyrunner.analysis import sequential
from studyrunner.analysis.data import StudyData, annotate

SEED_SD, NOISE_SD = 0.03, 0.05
FAIL_P, CHANCE, SUCCESS = 0.3, 0.25, 0.55
SHAPES = ("normal", "heavy", "bimodal")
METRIC = "eval_accuracy"  # y's name: an accuracy, so its range [0, 1] is known to the claims


@dataclass(frozen=True)
class SimDesign:
    cells: int
    start: int
    max: int
    step: int
    claims: tuple[str, ...]
    min_effect: bool = False  # the claims declare min_effect δ (the effect the alternative has)

    @property
    def name(self) -> str:
        step = f" step {self.step}" if self.step > 1 else ""
        return f"{self.cells} cells, {self.start}->{self.max}{step}" + (", min_effect" if self.min_effect else "")


def _pairs(k: int) -> tuple[str, ...]:
    return tuple(f"{METRIC}[arm={a}] > {METRIC}[arm=0]" for a in range(k - 1, 0, -1))


DESIGNS = {
    "2x2-8": SimDesign(2, 2, 8, 1, _pairs(2)),
    "3x3-12": SimDesign(3, 3, 12, 1, _pairs(3)),
    "5x2-10": SimDesign(5, 2, 10, 1, _pairs(5)),
    "4x3-12s2": SimDesign(4, 3, 12, 2, (f"{METRIC}[arm=3] > {METRIC}[arm=0]", f"{METRIC}[arm=3] > {{c}}")),
    "2x2-8m": SimDesign(2, 2, 8, 1, _pairs(2), min_effect=True),
}


def effect_size(design: SimDesign, shape: str) -> float:
    """δ of the last arm over arm 0 that gives the fixed design at `max` about 80% power (paired t, normal data;
    the same δ for the other shapes, whose spread differs)."""
    from scipy import stats

    n = design.max
    sd = math.sqrt(2) * NOISE_SD  # of a paired difference (the seed effect cancels)
    return float((stats.t.isf(0.05, n - 1) + stats.norm.ppf(0.8)) * sd / math.sqrt(n))


def _draws(design: SimDesign, shape: str, delta: float, rng: np.random.Generator) -> np.ndarray:
    """y[cell, seed] for every seed a study could run (cells × max). Under an effect (`delta` > 0) arm k is
    δ·k/(K−1) above arm 0 (bimodal: fails with probability FAIL_P·(1 − k/(K−1)), so the last arm never fails)."""
    k, n = design.cells, design.max
    share = np.arange(k) / max(1, k - 1)
    if shape == "bimodal":
        fail = rng.random((k, n)) < (FAIL_P * (1 - share) if delta > 0 else np.full(k, FAIL_P))[:, None]
        good = 0.4 + SUCCESS + rng.normal(0, 0.03, (k, n))
        return np.clip(np.where(fail, CHANCE + rng.normal(0, 0.01, (k, n)), good), 0.0, 1.0)
    mu = 0.4 + delta * share
    u = rng.normal(0, SEED_SD, n)[None, :]
    e = rng.normal(0, NOISE_SD, (k, n)) if shape == "normal" else NOISE_SD * rng.standard_t(3, (k, n)) / math.sqrt(3)
    return np.clip(mu[:, None] + u + e, 0.0, 1.0)


def _truth(design: SimDesign, shape: str) -> float:
    """The true mean of a cell under the null (the threshold of a number claim)."""
    return (1 - FAIL_P) * (0.4 + SUCCESS) + FAIL_P * CHANCE if shape == "bimodal" else 0.4


def template(design: SimDesign) -> pd.DataFrame:
    """A trials frame (results.trials_frame's shape, annotated) of every (cell, seed) up to max, y to fill."""
    k, n = design.cells, design.max
    cells = np.repeat(np.arange(k), n)
    seeds = np.tile(np.arange(n), k)
    frame = pd.DataFrame(
        {
            "trial_key": [f"c{c}-s{s}" for c, s in zip(cells, seeds, strict=True)],
            "cell_hash": [f"c{c}" for c in cells],
            "cell": [f"arm={c}" for c in cells],
            "seed": seeds,
            "status": "succeeded",
            "model.params.arm": cells,
            "model.params.loops": 1,
            "effective_depth": 1.0,
            "baseline_of": "",
            METRIC: 0.0,
        }
    )
    return annotate(frame, None)


def simulate(
    design: SimDesign, shape: str, sims: int, *, effect: bool, seed: int = 0, fixed: bool = False
) -> dict[str, float]:
    """Share of claims supported and contradicted, mean looks and mean seeds per cell over `sims` studies."""
    rng = np.random.default_rng([seed, design.cells, design.start, design.max, SHAPES.index(shape), int(effect)])
    delta = effect_size(design, shape) if effect else 0.0
    claims = [c.replace("{c}", f"{_truth(design, shape):.6g}") for c in design.claims]  # the null's cell mean
    specs = [(c, effect_size(design, shape) if design.min_effect else None) for c in claims]
    base = template(design)
    data = StudyData("sim", base, metric=METRIC, claims=claims, cells_order=[f"c{c}" for c in range(design.cells)])
    plan = sequential.Design(design.max if fixed else design.start, design.max, design.step)
    cells = list(data.cells_order)
    supported = contradicted = looks = seeds = 0.0
    for _ in range(sims):
        y = _draws(design, shape, delta, rng).ravel()
        full = base.assign(**{METRIC: y})

        def draw(counts: dict[str, int], full=full) -> StudyData:
            keep = full.seed.to_numpy() < full.cell_hash.map(counts).to_numpy()
            return replace(data, trials=full[keep])

        history = sequential.run_sequential(draw, plan, cells, specs=specs)
        final = sequential.final_states(history)
        supported += sum(c.state == sequential.ClaimState.SUPPORTED for c in final) / len(final)
        contradicted += sum(c.state == sequential.ClaimState.CONTRADICTED for c in final) / len(final)
        looks += len(history)
        seeds += float(np.mean(list(history[-1].seeds.values())))
    return {
        "supported": supported / sims,
        "contradicted": contradicted / sims,
        "looks": looks / sims,
        "seeds_per_cell": seeds / sims,
        "sims": sims,
    }


def table(
    sims: int, seed: int = 0, designs: list[str] | None = None, shapes: tuple[str, ...] = SHAPES, echo=None
) -> pd.DataFrame:
    """One row per design and data shape (`echo(row)` as each is done)."""
    rows = []
    for key in designs or list(DESIGNS):
        design = DESIGNS[key]
        for shape in shapes:
            null = simulate(design, shape, sims, effect=False, seed=seed)
            alt = simulate(design, shape, sims, effect=True, seed=seed)
            fixed = simulate(design, shape, sims, effect=True, seed=seed, fixed=True)
            fixed_null = simulate(design, shape, sims, effect=False, seed=seed, fixed=True)
            rows.append(
                {
                    "design": design.name,
                    "data": shape,
                    "false positive": null["supported"],
                    "fixed: false positive": fixed_null["supported"],
                    "null: seeds/cell": null["seeds_per_cell"],
                    "power": alt["supported"],
                    "fixed: power": fixed["supported"],
                    "effect: seeds/cell": alt["seeds_per_cell"],
                    "fixed: seeds/cell": design.max,
                    "effect: looks": alt["looks"],
                }
            )
            if echo is not None:
                echo(rows[-1])
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame) -> str:
    """A Markdown table (rates and means to 3 decimals)."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "|".join("---" for _ in frame.columns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks sequential", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000, help="simulated studies per cell of the table")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--designs", default="", help=f"comma-separated, of: {', '.join(DESIGNS)}")
    ap.add_argument("--out", type=Path, default=None, help="also write the table as JSON here")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    designs = [d for d in args.designs.split(",") if d] or None
    result = table(args.sims, args.seed, designs, echo=lambda row: print(json.dumps(row), flush=True))
    print(markdown(result))
    se = math.sqrt(0.05 * 0.95 / args.sims)
    print(f"\n{args.sims} simulated studies per row (Monte-Carlo se of a 5% rate: {se:.4f}); "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"sims": args.sims, "rows": result.to_dict("records")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
