"""When may `verify` read a cell's seeds as bimodal (and swap the paired t for the exact sign-flip test)? By
simulation, through `claims.evaluate` and `sequential.run_sequential`: from 3 seeds (before) against from 5 seeds
(`claims.evidence.BIMODAL_FROM`, now).

    python -m benchmarks.bimodality [--sims 400] [--out PATH]

Two cells sharing their seeds, the claim `eval_accuracy[arm=1] > eval_accuracy[arm=0]`, no failure rule. Data
(benchmarks/claims_sim.py): `normal` (arm 0 at 0.5; under the effect arm 1 is 0.06 above: a paired t at 8 seeds
finds it about 80% of the time) and `bimodal` (seeds fail to chance with probability 0.3 in arm 0; under the effect
arm 1 fails with probability 0.05). Per seed count: the share supported under no effect (false positive), under
the effect (power), and the share of studies the switch sent to the sign-flip test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import claims_sim as cs
from studyrunner.analysis import claims, sequential
from studyrunner.analysis.claims import evidence

TEXT = "eval_accuracy[arm=1] > eval_accuracy[arm=0]"
SEEDS = (3, 4, 5, 6, 8)
MEANS = {
    ("normal", False): (0.5, 0.5),
    ("normal", True): (0.5, 0.56),
    ("bimodal", False): (0.74, 0.74),
    ("bimodal", True): (0.74, 0.95 - 0.7 * 0.05),
}


def simulate(shape: str, effect: bool, switch_from: int, sims: int, seed: int = 0) -> dict:
    data = cs.study(cs.template(2, 8), 2)
    rng = np.random.default_rng([seed, int(effect), len(shape)])
    means = np.array(MEANS[(shape, effect)])
    was = evidence.BIMODAL_FROM
    evidence.BIMODAL_FROM = switch_from
    out = {f"{n} seeds": 0 for n in SEEDS} | {f"{n} seeds: sign-flip": 0 for n in SEEDS}
    out |= {"sequential 2->8": 0, "sequential: seeds": 0.0}
    try:
        for _ in range(sims):
            y = cs.draw(shape, means, 8, rng)
            for n in SEEDS:
                v = claims.evaluate(cs.with_values(data, y, {"c0": n, "c1": n}), TEXT)
                out[f"{n} seeds"] += v.verdict == "supported"
                out[f"{n} seeds: sign-flip"] += "sign-flip" in v.test
            history = cs.sequential_run(data, TEXT, y, sequential.Design(2, 8, 1))
            out["sequential 2->8"] += sequential.final_states(history)[0].state == "supported"
            out["sequential: seeds"] += float(np.mean(list(history[-1].seeds.values())))
    finally:
        evidence.BIMODAL_FROM = was
    return {k: v / sims for k, v in out.items()}


def table(sims: int, seed: int = 0, echo=print) -> list[dict]:
    rows = []
    for shape in ("normal", "bimodal"):
        for effect in (False, True):
            for switch_from in (3, 5):
                started = time.perf_counter()
                r = simulate(shape, effect, switch_from, sims, seed)
                row = {"data": shape, "truth": "effect (power)" if effect else "no effect (false positive)",
                       "bimodal read from": f"{switch_from} seeds" + (" (before)" if switch_from == 3 else " (now)"),
                       **r, "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
                rows.append(row)
                echo(json.dumps(row))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bimodality", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    return cs.report(args.sims, args.out, lambda: table(args.sims, args.seed), per="row")


if __name__ == "__main__":
    sys.exit(main())
