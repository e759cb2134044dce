"""When may a sequential look stop a claim for futility? By simulation, through `sequential.run_sequential` (the
runner's `take_look`): the futility rule judged from the first look (before) against the rule that judges no
claim before it has MIN_FUTILITY_SEEDS (4) seeds per side (now), and 3 for comparison.

    python -m benchmarks.futility [--sims 300] [--floors 0,3,4] [--out PATH]

The designs and data of benchmarks/sequential.py: 2 cells, 2 -> 8 seeds, step 1, O'Brien-Fleming; the claim
`eval_accuracy[arm=1] > eval_accuracy[arm=0]`, without a min_effect (conditional power at the current trend) and
with one (min_effect δ); normal and heavy-tailed seeds. Under the effect δ the fixed design at 8 seeds detects
with 80% power (normal seeds). Per row: power, the share of real effects stopped for futility, of them the share
stopped at the first look (2 seeds), the share of futile stops whose 90% interval at the stop holds the true
effect, the false-positive rate and the seeds per cell under no effect.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks import claims_sim as cs
from benchmarks import sequential as seqbench
from studyrunner.analysis import sequential
from studyrunner.analysis.data import StudyData

DESIGN = seqbench.DESIGNS["2x2-8"]


def simulate(shape: str, floor: int, sims: int, *, effect: bool, min_effect: bool, seed: int = 0) -> dict:
    rng = np.random.default_rng([seed, 7, seqbench.SHAPES.index(shape), int(effect), int(min_effect)])
    delta = seqbench.effect_size(DESIGN, shape) if effect else 0.0
    truth = seqbench.effect_size(DESIGN, shape) if effect else 0.0
    claims = list(DESIGN.claims)
    specs = [(c, seqbench.effect_size(DESIGN, shape) if min_effect else None) for c in claims]
    base = seqbench.template(DESIGN)
    data = StudyData("sim", base, metric=seqbench.METRIC, claims=claims, cells_order=["c0", "c1"])
    plan = sequential.Design(DESIGN.start, DESIGN.max, DESIGN.step)
    was = sequential.MIN_FUTILITY_SEEDS
    sequential.MIN_FUTILITY_SEEDS = floor  # the floor `_claim_look` reads (4 in the product)
    out = {"supported": 0, "futile": 0, "futile_first": 0, "futile_holds": 0, "seeds": 0.0}
    try:
        for _ in range(sims):
            y = seqbench._draws(DESIGN, shape, delta, rng).ravel()
            full = base.assign(**{seqbench.METRIC: y})

            def draw(counts, full=full):
                keep = full.seed.to_numpy() < full.cell_hash.map(counts).to_numpy()
                return replace(data, trials=full[keep])

            history = sequential.run_sequential(draw, plan, list(data.cells_order), specs=specs)
            (c,) = sequential.final_states(history)
            out["supported"] += c.state == sequential.ClaimState.SUPPORTED
            if c.state == sequential.ClaimState.FUTILE:
                out["futile"] += 1
                out["futile_first"] += c.decided_at == 1
                out["futile_holds"] += bool(c.lo <= truth <= c.hi)  # the 90% interval at the stop
            out["seeds"] += float(np.mean(list(history[-1].seeds.values())))
    finally:
        sequential.MIN_FUTILITY_SEEDS = was
    futile = max(out["futile"], 1)
    return {
        "power" if effect else "false positive": out["supported"] / sims,
        "futile": out["futile"] / sims,
        "futile at look 1": out["futile_first"] / sims,
        "futile stops whose 90% interval holds the effect": out["futile_holds"] / futile if out["futile"] else math.nan,
        "seeds/cell": out["seeds"] / sims,
    }


def table(sims: int, floors: list[int], shapes=("normal", "heavy"), echo=print) -> list[dict]:
    rows = []
    for shape in shapes:
        for min_effect in (False, True):
            for floor in floors:
                started = time.perf_counter()
                alt = simulate(shape, floor, sims, effect=True, min_effect=min_effect)
                null = simulate(shape, floor, sims, effect=False, min_effect=min_effect)
                row = {
                    "data": shape,
                    "futility at": "min_effect δ" if min_effect else "the trend",
                    "judged from": f"{floor} seeds" if floor > 2 else "the first look (before)",
                    "power": alt["power"],
                    "real effects stopped futile": alt["futile"],
                    "... at look 1 (2 seeds)": alt["futile at look 1"],
                    "futile stops holding the effect": alt["futile stops whose 90% interval holds the effect"],
                    "effect: seeds/cell": alt["seeds/cell"],
                    "false positive": null["false positive"],
                    "null: seeds/cell": null["seeds/cell"],
                    "seconds": round(time.perf_counter() - started, 1),
                }
                rows.append(row)
                echo(json.dumps(row))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.futility", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=300)
    ap.add_argument("--floors", default="0,3,4")
    ap.add_argument("--shapes", default="normal,heavy")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    return cs.report(
        args.sims,
        args.out,
        lambda: table(args.sims, [int(f) for f in args.floors.split(",")], tuple(args.shapes.split(","))),
        per="row",
    )


if __name__ == "__main__":
    sys.exit(main())
